"""A client net with two heads: the net's own (generic) classifier and a personalized one beside it.

FedRoD (Chen & Chao, ICLR 2022) decouples a client's model into a generic predictor (the
shared body and its classifier, trained with a class-balanced loss and averaged by the server)
and a personalized head that reads the same features and adds its logits to the generic ones;
the personalized head is trained with plain cross-entropy on the sum while the generic
predictor is held fixed for it (gradients stop at the generic logits and at the features).
:class:`TwoHeadNet` is that model, :func:`two_head_steps` the cohort's local steps (both
losses on the same batch, one vmapped forward), :func:`balanced_log_prior` the class
counts of the Balanced Softmax loss (Ren et al., NeurIPS 2020, the BSM loss FedRoD uses).

Parameter names: the wrapped net's under ``net.`` and the personalized head's under
``personal.``; the personalized head has the shape of the net's classifier.
"""

from __future__ import annotations

import copy

import torch
from torch import nn

from pfl_cli.errors import InputError

NET = "net."
PERSONAL = "personal."
# The log-prior of a class a client has no sample of: exp(-1e4) is 0 in float32 (that class takes no
# probability, as log 0 would give), while masked rows (unlabeled samples) stay finite (inf * 0 is nan).
ABSENT_LOG_PRIOR = -1.0e4


class TwoHeadNet(nn.Module):
    """``net`` (features + classifier) plus a personalized head on its features.

    ``forward(x)`` is the personalized prediction, generic logits (held fixed) plus the
    personalized head's; ``forward(x, parts=True)`` returns both logits for training.
    The personalized head starts as a copy of the net's initial classifier.
    """

    def __init__(self, net: nn.Module) -> None:
        super().__init__()
        if not (callable(getattr(net, "features", None)) and callable(getattr(net, "head", None))):
            raise InputError(f"model_arch: a second head needs a client net with a feature extractor and a "
                             f"classifier (features(), head()); got {type(net).__name__}. Use --set "
                             "model_arch=mlp or lenet.")
        self.net = net
        self.personal = copy.deepcopy(net.head())

    def forward(self, x, parts: bool = False):
        h = self.net.features(x)
        g = self.net.head()(h)
        p = self.personal(h.detach())
        return (g, p) if parts else g.detach() + p


def class_counts(store, clients):
    """N_{i,c}: each client's count of labeled fit samples of every class, (c, C) float."""
    index, length = store.fit.rows(clients)
    y = store.y[index]
    real = (torch.arange(index.shape[1], device=index.device)[None, :] < length[:, None]) & (y >= 0)
    counts = torch.zeros(index.shape[0], store.num_classes, device=index.device)
    counts.scatter_add_(1, y.clamp_min(0), real.to(counts.dtype))
    return counts


def balanced_log_prior(store, clients):
    """log N_{i,c}: each client's count of fit samples of every class (c, C); absent classes -> -1e4."""
    counts = class_counts(store, clients)
    return torch.where(counts > 0, counts.clamp_min(1.0).log(), torch.full_like(counts, ABSENT_LOG_PRIOR))


def two_head_steps(model: TwoHeadNet, params: dict, store, steps, log_prior, *, train_generic: bool = True,
                   sgd: dict):
    """The cohort's local steps of a :class:`TwoHeadNet`, batched over clients with ``vmap``.

    Every step, on one batch: the generic part (``net.*``) descends the Balanced Softmax loss,
    cross-entropy of ``g + log_prior`` (FedRoD's BSM loss, Ren et al. 2020), and the
    personalized head (``personal.*``) the cross-entropy of ``g + p`` with ``g`` and the
    features held fixed; one backward of the sum gives both, as the two separate updates
    from the same point. ``train_generic=False`` trains the personalized head alone (a new
    client). The two parts are clipped apart (``clip_groups``), as two optimizers would.

    ``params``: name -> (c, *shape); ``steps``: :class:`~pfl_cli.fl.batches.LocalSteps`;
    ``log_prior`` (c, C). Returns the parameters and each client's mean personalized loss.
    """
    from torch.func import functional_call, vmap

    from pfl_cli.fl.batches import ActiveMean
    from pfl_cli.fl.cohort import _masked_mean_loss, sgd_update_

    forward = vmap(lambda p, x: functional_call(model, p, (x,), {"parts": True}))
    moving = [k for k in params if train_generic or k.startswith(PERSONAL)]
    theta = {k: v.detach().clone() for k, v in params.items()}
    buf = {k: torch.zeros_like(theta[k]) for k in moving}
    groups = [[k for k in moving if k.startswith(NET)], [k for k in moving if k.startswith(PERSONAL)]]
    c = steps.num_clients
    mean_loss = ActiveMean(c, log_prior.device)
    for idx, m, go in steps:
        for k in moving:
            theta[k].requires_grad_(True)
        g, p = forward(theta, store.inputs(idx))
        y = store.y[idx]
        personal = _masked_mean_loss(g.detach() + p, y, m)
        loss = personal.sum()
        if train_generic:
            loss = loss + _masked_mean_loss(g + log_prior[:, None, :], y, m).sum()
        grads = dict(zip(moving, torch.autograd.grad(loss, [theta[k] for k in moving])))
        for k in moving:
            theta[k] = theta[k].detach()
        sgd_update_(theta, grads, buf, **sgd, active=go, clip_groups=[grp for grp in groups if grp])
        mean_loss.add(personal.detach(), go)
    return theta, mean_loss.mean()
