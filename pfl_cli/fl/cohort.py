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
              weight_decay: float = 0.0, clip: float = 0.0, active=None, fixed: Mapping[str, "object"] | None = None,
              prox_mu: float = 0.0, prox_anchor: Mapping[str, "object"] | None = None):
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
    fixed : dict name -> Tensor (c, *shape), optional
        Per-client parameters the forward pass reads but the clients do not train (FedRep's
        body while its head trains, and the other way round).
    prox_mu, prox_anchor : float, dict name -> Tensor (c, *shape)
        Proximal term ``prox_mu / 2 * ||theta - anchor||^2`` (FedProx Eq. 2, Ditto Eq. 2):
        its gradient ``prox_mu * (theta - anchor)`` joins the step like weight decay (after
        clipping). Anchors of ``fixed`` parameters are ignored.

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
    fixed = dict(fixed or {})
    batched = vmap(lambda p, f, x: functional_call(model, {**p, **f}, (x,)))
    forward = lambda p, x: batched(p, fixed, x)  # noqa: E731
    # Leaves with their own grad: clients' losses are independent, so the gradient of their
    # sum with respect to the stacked parameters is every client's own gradient at once
    # (a vmapped forward + one ordinary backward is ~2x cheaper than vmap(grad) here).
    theta = {k: v.detach().clone().requires_grad_(True) for k, v in params.items()}
    buf = {k: torch.zeros_like(theta[k]) for k in names}
    c, steps = index.shape[:2]
    loss_sum = torch.zeros(c, device=index.device)
    taken = torch.zeros(c, device=index.device)
    for s in range(steps):
        loss, grads = batch_loss_and_grads(forward, theta, names, store, index[:, s], mask[:, s])
        go = None if active is None else active[:, s]
        with torch.no_grad():
            grads = clip_per_client(grads, clip)
            for k in names:
                g = grads[k]
                if weight_decay:
                    g = g + weight_decay * theta[k]
                if prox_mu:
                    g = g + prox_mu * (theta[k] - prox_anchor[k])
                new_buf = momentum * buf[k] + g if momentum else g
                if go is None:
                    buf[k] = new_buf
                    theta[k] -= lr * new_buf
                else:
                    sel = expand_as_params(go, g)
                    buf[k] = torch.where(sel, new_buf, buf[k])
                    theta[k] -= lr * new_buf * sel
            w = torch.ones(c, device=index.device) if go is None else go.to(loss.dtype)
            loss_sum += loss.detach() * w
            taken += w
    return {k: v.detach() for k, v in theta.items()}, loss_sum / taken.clamp_min(1.0)


def expand_as_params(v, like):
    """A per-client vector (c,) viewed to broadcast against a stacked parameter (c, *shape)."""
    return v.view(-1, *([1] * (like.dim() - 1)))


def batch_loss_and_grads(forward, theta: Mapping, names, store, idx, m, *, create_graph: bool = False):
    """Every client's masked mean cross-entropy on its batch ``idx`` (c, b) and its gradients.

    ``forward`` is the vmapped ``functional_call`` of the client net; gradients are taken
    with respect to ``theta[k]`` for ``k`` in ``names`` (leaves or graph nodes).
    """
    import torch

    loss = batch_loss(forward, theta, store, idx, m)
    grads = torch.autograd.grad(loss.sum(), [theta[k] for k in names], create_graph=create_graph)
    return loss, dict(zip(names, grads))


def batch_loss(forward, params: Mapping, store, idx, m):
    """Every client's masked mean cross-entropy (c,) of its model ``params`` on its batch ``idx`` (c, b)."""
    import torch.nn.functional as F

    logits = forward(dict(params), store.inputs(idx))
    ce = F.cross_entropy(logits.flatten(0, 1), store.y[idx].flatten(), reduction="none").view(m.shape)
    return (ce * m).sum(1) / m.sum(1).clamp_min(1.0)


def clip_per_client(grads: dict, clip: float) -> dict:
    """Scale each client's gradient to global norm at most ``clip`` (``clip_grad_norm_``'s coefficient)."""
    import torch

    if clip <= 0 or not grads:
        return grads
    norm = torch.sqrt(sum(g.pow(2).flatten(1).sum(1) for g in grads.values()))
    scale = (clip / (norm + 1e-6)).clamp(max=1.0)
    return {k: g * expand_as_params(scale, g) for k, g in grads.items()}


def local_sgd_reference(model, params, store, index, mask, *, lr, momentum=0.0, weight_decay=0.0, clip=0.0,
                        active=None, fixed=None, prox_mu=0.0, prox_anchor=None):
    """:func:`local_sgd` one client at a time with ``torch.optim.SGD`` (tests and benchmarks)."""
    import copy

    import torch

    c, steps = index.shape[:2]
    out = {k: [] for k in params}
    losses = []
    everything = {**params, **(fixed or {})}
    for i in range(c):
        net = copy.deepcopy(model)
        with torch.no_grad():
            for k, p in net.named_parameters():
                p.copy_(everything[k][i])
        moving = [p for k, p in net.named_parameters() if k in params]
        for k, p in net.named_parameters():
            p.requires_grad_(k in params)
        opt = torch.optim.SGD(moving, lr=lr, momentum=momentum, weight_decay=weight_decay)
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
                torch.nn.utils.clip_grad_norm_(moving, clip)
            if prox_mu:
                with torch.no_grad():
                    for k, p in net.named_parameters():
                        if p.requires_grad:
                            p.grad += prox_mu * (p - prox_anchor[k][i])
            opt.step()
            total, count = total + float(loss.detach()), count + 1
        for k, p in net.named_parameters():
            if k in out:
                out[k].append(p.detach().clone())
        losses.append(total / max(count, 1))
    return {k: torch.stack(v) for k, v in out.items()}, torch.tensor(losses)
