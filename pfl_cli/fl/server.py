"""The server's optimizer step on gradients it assembled itself: the hypernetwork algorithms' outer update.

pFedHN (Alg. 1, the outer step with two errata fixed as in its official code) and PeFLL
(thesis Alg. 8 lines 17-18) both turn the cohort's model deltas into gradients of
the server's parameters by a vector-Jacobian product, and then take one step of a
``torch.optim`` optimizer on them after clipping their joint norm. That step is here, and
:func:`momentum_step`, the server step (``server_lr``, ``server_momentum``) of the algorithms
whose server averages the cohort's models.
"""

from __future__ import annotations


def server_step(opt, params: list, grads: list, *, clip: float) -> None:
    """One ``opt`` step with ``grads`` as the gradients of ``params`` (None: zero), their joint norm
    clipped to ``clip`` first (``clip_grad_norm_``; 0 or less: no clip).

    The gradients are copied into ``.grad``: the caller's tensors are left as they are.
    """
    import torch

    opt.zero_grad(set_to_none=True)
    for p, g in zip(params, grads):
        p.grad = torch.zeros_like(p) if g is None else g.clone()
    if clip > 0:
        torch.nn.utils.clip_grad_norm_(params, clip)
    opt.step()


def momentum_step(params: dict, buf: dict, mean: dict, *, lr: float, momentum: float) -> tuple[dict, dict]:
    """The server step of FedAvg with server momentum (FedAvgM) on the cohort's mean model ``mean``.

    For each key of ``mean``: ``buf <- momentum * buf + (mean - params)`` and ``params <- params + lr * buf``
    (Hsu, Qi & Brown 2019, "Measuring the effects of non-identical data distribution", §3 FedAvgM).
    ``lr = 1, momentum = 0`` is McMahan et al. 2017 Alg. 1, the mean itself, returned as it is (bit for
    bit, not ``params + (mean - params)``). Keys of ``params`` not in ``mean`` are kept; a key missing
    from ``buf`` starts from zero. Returns the new (params, buf); the inputs are left as they are.

    >>> import torch
    >>> p, b = momentum_step({"w": torch.zeros(1)}, {}, {"w": torch.ones(1)}, lr=0.5, momentum=0.9)
    >>> p["w"].item(), b["w"].item()
    (0.5, 1.0)
    >>> p, b = momentum_step(p, b, {"w": torch.ones(1)}, lr=0.5, momentum=0.9)
    >>> round(p["w"].item(), 4)  # buf = 0.9 * 1 + 0.5 = 1.4; 0.5 + 0.5 * 1.4
    1.2
    """
    new_params, new_buf = dict(params), dict(buf)
    if lr == 1 and momentum == 0:
        new_params.update(mean)
        return new_params, new_buf
    for k, target in mean.items():
        delta = target - params[k]
        new_buf[k] = momentum * buf[k] + delta if k in buf else delta
        new_params[k] = params[k] + lr * new_buf[k]
    return new_params, new_buf
