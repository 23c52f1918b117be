"""The server's optimizer step on gradients it assembled itself: the hypernetwork algorithms' outer update.

pFedHN (Alg. 1, the outer step with two errata fixed as in its official code) and PeFLL
(thesis Alg. 8 lines 17-18) both turn the cohort's model deltas into gradients of
the server's parameters by a vector-Jacobian product, and then take one step of a
``torch.optim`` optimizer on them after clipping their joint norm. That step is here.
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
