"""The torch modules of :mod:`pfl_cli.fl.prototypes`, apart so that importing the prototype methods (their configs,
a refusal of `pflx train`) does not import torch."""

from __future__ import annotations

import torch
from torch import nn

from pfl_cli.errors import InputError


class FeatureNet(nn.Module):
    """``net`` answering ``forward(x)`` with its logits and ``forward(x, parts=True)`` with (f(x), logits)."""

    def __init__(self, net: nn.Module, algorithm: str) -> None:
        super().__init__()
        head = getattr(net, "head", None)
        if not (callable(getattr(net, "features", None)) and callable(head) and isinstance(head(), nn.Linear)):
            raise InputError(f"model_arch: {algorithm} aligns the representation before a linear classifier; the "
                             f"{type(net).__name__} net has no features() / linear head(). Use --set "
                             "model_arch=mlp or lenet.")
        self.net = net

    def forward(self, x, parts: bool = False):
        h = self.net.features(x)
        logits = self.net.head()(h)
        return (h, logits) if parts else logits


class NearestPrototypeNet(nn.Module):
    """A client net classifying by the nearest global prototype of its representation (FedProto's inference,
    Tan et al. AAAI 2022: the label whose global prototype C̄^(j) is closest to f_i(x) in squared L2).

    Its parameters are the client net's under the same names as :class:`FeatureNet`'s (``net.*``), so one
    client's FedProto parameters evaluate under either module. The answer is a (b, C) score read as logits:
    ``-||f(x) - C̄^(j)||^2`` for every class with a global prototype (``seen``); a class without one is never the
    argmax, its score ``UNSEEN_GAP`` below the farthest prototype's (a finite cross-entropy, as the authors' code
    sets a fixed large distance, ``lib/update.py`` ``a_large_num``). Without any global prototype every score is 0.
    The prototypes are set by :meth:`use` before a prediction (the server's current ones).
    """

    UNSEEN_GAP = 30.0

    def __init__(self, net: nn.Module, num_classes: int, dim: int) -> None:
        super().__init__()
        self.net = net
        self.register_buffer("prototypes", torch.zeros(num_classes, dim))
        self.register_buffer("seen", torch.zeros(num_classes, dtype=torch.bool))

    def use(self, prototypes, seen) -> "NearestPrototypeNet":
        """Serve with the global ``prototypes`` (C, d) and ``seen`` (C,) flags (copied)."""
        self.prototypes = prototypes.detach().clone().to(self.prototypes.dtype)
        self.seen = seen.detach().clone()
        return self

    def forward(self, x):
        h = self.net.features(x)
        p = self.prototypes.to(h.dtype)
        d2 = ((h * h).sum(-1, keepdim=True) - 2.0 * h @ p.T + (p * p).sum(-1)[None, :]).clamp_min(0.0)
        score = -d2
        seen = self.seen[None, :].expand_as(score)
        floor = score.masked_fill(~seen, float("inf")).amin(-1, keepdim=True) - self.UNSEEN_GAP
        score = torch.where(seen, score, floor.expand_as(score))
        return score if bool(self.seen.any()) else torch.zeros_like(score)
