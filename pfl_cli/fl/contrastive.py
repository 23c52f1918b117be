"""The model-contrastive term of MOON (Li, He, Song, CVPR 2021, §3.3, Eq. 3-4), batched over a cohort.

A client's local model w_i is trained on ``l = l_sup + mu l_con`` (Eq. 4) where, for an input x with
representation ``z = R_{w_i}(x)``, the global model's ``z_glob = R_{w^t}(x)`` and the client's previous
local model's ``z_prev = R_{w_i^{t-1}}(x)``,

    l_con = -log( exp(sim(z, z_glob) / tau) / (exp(sim(z, z_glob) / tau) + exp(sim(z, z_prev) / tau)) )   (Eq. 3)

with ``sim`` the cosine similarity and tau a temperature: the representation is pulled towards the
global model's and pushed away from the client's last local one. z_glob and z_prev are constants
(the paper's Alg. 1 lines 13-14 compute them with the global and previous models, which are not trained).

:class:`RepresentationNet` gives a client net's representation beside its logits: ``features()``, the
layer the classifier reads (pflx's nets have no projection head; see :mod:`pfl_cli.algorithms.moon`).
:func:`moon_grad_fn` is one local step's gradient, for :func:`pfl_cli.fl.sam.local_steps`: three
forward passes (the trained model, the global one over the whole cohort's batch at once, each client's
previous model) and one backward.
"""

from __future__ import annotations

import torch
from torch import nn

from pfl_cli.errors import InputError

NET = "net."


class RepresentationNet(nn.Module):
    """``net`` answering ``forward(x)`` with its logits and ``forward(x, parts=True)`` with (z, logits)."""

    def __init__(self, net: nn.Module, algorithm: str) -> None:
        super().__init__()
        if not (callable(getattr(net, "features", None)) and callable(getattr(net, "head", None))):
            raise InputError(f"model_arch: {algorithm} contrasts the representation the classifier reads; the "
                             f"{type(net).__name__} net has no features() / head(). Use --set model_arch=mlp or "
                             "lenet.")
        self.net = net

    def forward(self, x, parts: bool = False):
        z = self.net.features(x)
        logits = self.net.head()(z)
        return (z, logits) if parts else logits


def model_contrastive_loss(z, z_glob, z_prev, tau: float):
    """Eq. 3 per sample: (..., d) representations -> (...) losses (cosine similarities, temperature ``tau``)."""
    import torch.nn.functional as F

    pos = F.cosine_similarity(z, z_glob, dim=-1) / tau
    neg = F.cosine_similarity(z, z_prev, dim=-1) / tau
    # -log(e^pos / (e^pos + e^neg)) = logsumexp(pos, neg) - pos, stable for small tau
    return torch.logaddexp(pos, neg) - pos


def moon_grad_fn(model: RepresentationNet, store, how: str, global_params: dict, previous: dict, *, mu: float,
                 tau: float):
    """``grad_fn(theta, idx, m)`` of MOON's local loss (Eq. 4) for :func:`pfl_cli.fl.sam.local_steps`.

    ``global_params`` {name: tensor}: w^t (one model); ``previous`` {name: (c, *shape)}: each client's
    w_i^{t-1}; names are the client net's (``model.net``). Returns each client's loss (c,) and gradients
    {name: (c, *shape)}; both terms are means over the client's real, labeled samples of the batch.
    """
    from torch.func import functional_call

    from pfl_cli.fl.cohort import _masked_mean_loss

    names = list(global_params)

    def grad_fn(theta, idx, m):
        x, y = store.inputs(idx), store.y[idx]
        c, b = idx.shape
        with torch.no_grad():
            z_glob = functional_call(model, _named(global_params), (x.flatten(0, 1),), {"parts": True})[0]
            z_glob = z_glob.view(c, b, -1)
            z_prev = _representation(model, previous, x, how)
        leaves = {k: theta[k].detach().requires_grad_(True) for k in names}
        z, logits = _parts(model, leaves, x, how)
        real = m * (y >= 0)
        sup = _masked_mean_loss(logits, y, m)
        con = (model_contrastive_loss(z, z_glob, z_prev, tau) * real).sum(-1) / real.sum(-1).clamp_min(1.0)
        loss = sup + mu * con
        grads = torch.autograd.grad(loss.sum(), [leaves[k] for k in names])
        return loss.detach(), dict(zip(names, grads))

    return grad_fn


def _parts(model, params, x, how):
    """Each client's (z, logits) on its batch: params {name: (c, *shape)}, x (c, b, ...)."""
    from torch.func import functional_call, vmap

    params = _named(params)
    if how == "vmap":
        return vmap(lambda p, xb: functional_call(model, p, (xb,), {"parts": True}))(params, x)
    out = [functional_call(model, {k: v[i] for k, v in params.items()}, (x[i],), {"parts": True})
           for i in range(x.shape[0])]
    return torch.stack([o[0] for o in out]), torch.stack([o[1] for o in out])


def _representation(model, params, x, how):
    return _parts(model, params, x, how)[0]


def _named(params: dict) -> dict:
    """The client net's parameter names as the wrapping :class:`RepresentationNet` names them."""
    return {NET + k: v for k, v in params.items()}
