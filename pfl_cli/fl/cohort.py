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


def local_sgd(model, params: Mapping[str, "object"], store, index, mask, *, lr, momentum: float = 0.0,
              weight_decay: float = 0.0, clip: float = 0.0, active=None, fixed=None, shared=None,
              momentum_state=None, clip_groups=None):
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
    lr : float, or dict name -> float
        Step size (one per parameter when a dict: HyperFL's eta_h and eta_v).
    momentum, weight_decay : float
        ``torch.optim.SGD`` semantics; ``weight_decay = 2 * lambda_theta`` adds the
        gradient of ``lambda_theta * ||theta||^2``.
    clip : float
        Clip each client's gradient to this global norm before the step (0 = off).
    active : BoolTensor (c, steps), optional
        Steps a client takes; inactive steps leave its parameters and momentum alone
        (clients with fewer epochs' worth of batches).
    fixed : dict name -> Tensor (c, *shape), optional
        Per-client parameters the forward pass reads but the clients do not train (HyperFL
        step 1's generated feature extractor, step 2's classifier).
    shared : dict name -> Tensor, optional
        Untrained parameters common to the whole cohort (no cohort axis: a frozen hypernetwork).
    momentum_state : dict name -> Tensor (c, *shape), optional
        Starting momentum buffers of those parameters (the others start at zero, a fresh
        optimizer); updated in place to the final buffers, so a client's private optimizer
        persists across rounds (pFedHN-PC's heads).
    clip_groups : list of lists of names, optional
        Clip each group's gradient norm separately (HyperFL clips the hypernetwork and the
        embedding apart); default: one group of all parameters.

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
    fixed, shared = dict(fixed or {}), dict(shared or {})
    forward = vmap(lambda p, f, x: functional_call(model, {**p, **f, **shared}, (x,)))
    groups = clip_groups if clip_groups is not None else [names]
    # Leaves with their own grad: clients' losses are independent, so the gradient of their
    # sum with respect to the stacked parameters is every client's own gradient at once
    # (a vmapped forward + one ordinary backward is ~2x cheaper than vmap(grad) here).
    theta = {k: v.detach().clone().requires_grad_(True) for k, v in params.items()}
    buf = {k: (momentum_state[k].clone() if momentum_state is not None and k in momentum_state
               else torch.zeros_like(v)) for k, v in params.items()}
    c, steps = index.shape[:2]
    loss_sum = torch.zeros(c, device=index.device)
    taken = torch.zeros(c, device=index.device)
    for s in range(steps):
        idx, m = index[:, s], mask[:, s]
        logits = forward(theta, fixed, store.inputs(idx))
        ce = F.cross_entropy(logits.flatten(0, 1), store.y[idx].flatten(), reduction="none").view(m.shape)
        loss = (ce * m).sum(1) / m.sum(1).clamp_min(1.0)
        grads = dict(zip(names, torch.autograd.grad(loss.sum(), [theta[k] for k in names])))
        go = None if active is None or bool(active[:, s].all()) else active[:, s]  # all active: no masking
        with torch.no_grad():
            scale = {}
            if clip > 0:
                for group in groups:
                    norm = torch.sqrt(sum(torch.linalg.vector_norm(grads[k].flatten(1), dim=1) ** 2 for k in group))
                    coef = (clip / (norm + 1e-6)).clamp(max=1.0)  # clip_grad_norm_'s coefficient
                    scale.update({k: coef for k in group})
            for k in names:
                g = grads[k]
                if k in scale:
                    g = g * scale[k].view(-1, *([1] * (g.dim() - 1)))
                if weight_decay:
                    g = g + weight_decay * theta[k]
                new_buf = momentum * buf[k] + g if momentum else g
                step = lr[k] if isinstance(lr, dict) else lr
                if go is None:
                    buf[k] = new_buf
                    theta[k] -= step * new_buf
                else:
                    sel = go.view(-1, *([1] * (g.dim() - 1)))
                    buf[k] = torch.where(sel, new_buf, buf[k])
                    theta[k] -= step * new_buf * sel
            w = torch.ones(c, device=index.device) if go is None else go.to(loss.dtype)
            loss_sum += loss.detach() * w
            taken += w
    if momentum_state is not None:
        for k in momentum_state:
            momentum_state[k] = buf[k].detach()
    return {k: v.detach() for k, v in theta.items()}, loss_sum / taken.clamp_min(1.0)


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
