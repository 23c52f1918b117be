"""Local SGD for a whole cohort as one batched computation.

The c clients of a round share one architecture, so their parameters are stacked along a
leading cohort axis and every local step is a single ``torch.func.vmap`` of
``grad_and_value`` over ``functional_call``. Semantics are those of ``torch.optim.SGD``
with momentum (buffer fresh each round) and ``clip_grad_norm_`` before each step, per
client (``specs/pefll.md`` §1.6 step 4); :func:`local_sgd_reference` runs the same thing
one client at a time with the real optimizer, and the tests hold the two equal.
"""

from __future__ import annotations

from typing import Mapping


def local_sgd(model, params: Mapping[str, "object"], store, index, mask, *, lr: float, momentum: float = 0.0,
              weight_decay: float = 0.0, clip: float = 0.0, active=None):
    """Run every cohort client's local steps at once.

    Parameters
    ----------
    model : torch.nn.Module
        The client architecture (its own weights are not used).
    params : dict name -> Tensor (c, *shape)
        Each client's starting parameters.
    store : pfl_cli.fl.store.ClientStore
    index, mask : Tensor (c, steps, b)
        From :func:`pfl_cli.fl.batches.sample_batches`.
    lr, momentum, weight_decay : float
        ``torch.optim.SGD`` semantics; ``weight_decay = 2 * lambda_theta`` adds the
        gradient of ``lambda_theta * ||theta||^2``.
    clip : float
        Clip each client's gradient to this global norm before the step (0 = off).
    active : BoolTensor (c, steps), optional
        Steps a client takes; inactive steps leave its parameters and momentum alone
        (clients with fewer epochs' worth of batches).

    Returns
    -------
    params : dict name -> Tensor (c, *shape)
        The clients' parameters after local training (detached).
    loss : Tensor (c,)
        Each client's mean training loss over its active steps.
    """
    import torch
    import torch.nn.functional as F
    from torch.func import functional_call, vmap

    names = list(params)
    forward = vmap(lambda p, x: functional_call(model, p, (x,)))
    # Leaves with their own grad: clients' losses are independent, so the gradient of their
    # sum with respect to the stacked parameters is every client's own gradient at once
    # (a vmapped forward + one ordinary backward is ~2x cheaper than vmap(grad) here).
    theta = {k: v.detach().clone().requires_grad_(True) for k, v in params.items()}
    buf = {k: torch.zeros_like(v) for k, v in params.items()}
    c, steps = index.shape[:2]
    loss_sum = torch.zeros(c, device=index.device)
    taken = torch.zeros(c, device=index.device)
    for s in range(steps):
        idx, m = index[:, s], mask[:, s]
        logits = forward(theta, store.inputs(idx))
        ce = F.cross_entropy(logits.flatten(0, 1), store.y[idx].flatten(), reduction="none").view(m.shape)
        loss = (ce * m).sum(1) / m.sum(1).clamp_min(1.0)
        grads = dict(zip(names, torch.autograd.grad(loss.sum(), [theta[k] for k in names])))
        go = None if active is None else active[:, s]
        with torch.no_grad():
            new, buf = sgd_step(theta, grads, buf, lr=lr, momentum=momentum, weight_decay=weight_decay, clip=clip,
                                active=go)
        theta = {k: v.requires_grad_(True) for k, v in new.items()}
        with torch.no_grad():
            w = torch.ones(c, device=index.device) if go is None else go.to(loss.dtype)
            loss_sum += loss.detach() * w
            taken += w
    return {k: v.detach() for k, v in theta.items()}, loss_sum / taken.clamp_min(1.0)


def sgd_step(theta: dict, grads: dict, buf: dict, *, lr: float, momentum: float = 0.0, weight_decay: float = 0.0,
             clip: float = 0.0, active=None) -> tuple[dict, dict]:
    """One ``torch.optim.SGD`` step per client after ``clip_grad_norm_``; new ``(theta, buf)`` dicts.

    Out of place, so the same step serves :func:`local_sgd` (under ``no_grad``) and
    :func:`unrolled_sgd` (differentiable, for the attacks of ``pfl_cli.attack``).
    ``active`` (c,) bool: clients whose step is skipped keep their parameters and momentum.
    """
    import torch

    if clip > 0:
        norm = torch.sqrt(sum(g.pow(2).flatten(1).sum(1) for g in grads.values()))
        scale = (clip / (norm + 1e-6)).clamp(max=1.0)  # clip_grad_norm_'s coefficient
    new_theta, new_buf = {}, {}
    for k, p in theta.items():
        g = grads[k]
        if clip > 0:
            g = g * scale.view(-1, *([1] * (g.dim() - 1)))
        if weight_decay:
            g = g + weight_decay * p
        nb = momentum * buf[k] + g if momentum else g
        if active is None:
            new_buf[k], new_theta[k] = nb, p - lr * nb
        else:
            sel = active.view(-1, *([1] * (g.dim() - 1)))
            new_buf[k], new_theta[k] = torch.where(sel, nb, buf[k]), p - lr * nb * sel
    return new_theta, new_buf


def batch_gradients(model, params: Mapping[str, "object"], x, y) -> dict:
    """Each client's gradient of its mean cross-entropy on its batch, differentiable (``create_graph``).

    params (c, *shape) per name, x (c, b, *input_shape), y (c, b). Parameters that are
    constants to the caller are made leaves so that they can be differentiated.
    """
    import torch
    import torch.nn.functional as F
    from torch.func import functional_call, vmap

    names = list(params)
    theta = [params[k] if params[k].requires_grad else params[k].detach().requires_grad_(True) for k in names]
    logits = vmap(lambda p, xb: functional_call(model, p, (xb,)))(dict(zip(names, theta)), x)
    loss = F.cross_entropy(logits.flatten(0, 1), y.flatten(), reduction="none").view(y.shape).mean(1)
    return dict(zip(names, torch.autograd.grad(loss.sum(), theta, create_graph=True)))


def unrolled_sgd(model, params: Mapping[str, "object"], x, y, steps: int, *, lr: float, momentum: float = 0.0,
                 weight_decay: float = 0.0, clip: float = 0.0) -> dict:
    """``steps`` full-batch local SGD steps per client, differentiable in ``x`` and ``params``.

    The client update of :func:`local_sgd` (the same :func:`sgd_step`) on one fixed batch per
    client, x (c, b, *input_shape) and y (c, b), kept on the autograd graph so that a
    gradient-inversion attack can differentiate the uploaded delta with respect to dummy data.
    """
    import torch

    theta = {k: v if v.requires_grad else v.detach().requires_grad_(True) for k, v in params.items()}
    buf = {k: torch.zeros_like(v) for k, v in params.items()}
    for _ in range(steps):
        grads = batch_gradients(model, theta, x, y)
        theta, buf = sgd_step(theta, grads, buf, lr=lr, momentum=momentum, weight_decay=weight_decay, clip=clip)
    return theta


def local_sgd_reference(model, params, store, index, mask, *, lr, momentum=0.0, weight_decay=0.0, clip=0.0,
                        active=None):
    """:func:`local_sgd` one client at a time with ``torch.optim.SGD`` (tests and benchmarks)."""
    import copy

    import torch

    c, steps = index.shape[:2]
    out = {k: [] for k in params}
    losses = []
    for i in range(c):
        net = copy.deepcopy(model)
        with torch.no_grad():
            for k, p in net.named_parameters():
                p.copy_(params[k][i])
        opt = torch.optim.SGD(net.parameters(), lr=lr, momentum=momentum, weight_decay=weight_decay)
        total, count = 0.0, 0
        for s in range(steps):
            if active is not None and not bool(active[i, s]):
                continue
            idx = index[i, s]
            logits = net(store.inputs(idx))
            ce = torch.nn.functional.cross_entropy(logits, store.y[idx], reduction="none")
            loss = (ce * mask[i, s]).sum() / mask[i, s].sum().clamp_min(1.0)
            opt.zero_grad()
            loss.backward()
            if clip > 0:
                torch.nn.utils.clip_grad_norm_(net.parameters(), clip)
            opt.step()
            total, count = total + float(loss.detach()), count + 1
        for k, p in net.named_parameters():
            out[k].append(p.detach().clone())
        losses.append(total / max(count, 1))
    return {k: torch.stack(v) for k, v in out.items()}, torch.tensor(losses)
