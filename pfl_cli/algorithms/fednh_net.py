"""The client net of :mod:`pfl_cli.algorithms.fednh`, apart so that importing the algorithm (its config, a refusal)
does not import torch."""

from __future__ import annotations

import torch
from torch import nn

from pfl_cli.errors import InputError


class CosineNet(nn.Module):
    """The client net's ``features()`` under a cosine classifier: logits ``s * <f / ||f||, w_k>``; with
    ``parts=True`` also the unit representation f / ||f||. The prototype rows w_k are unit vectors as the
    server keeps them (spread, then normalized at every update), so they are used as given."""

    def __init__(self, net: nn.Module, num_classes: int) -> None:
        super().__init__()
        head = getattr(net, "head", None)
        if not (callable(getattr(net, "features", None)) and callable(head) and isinstance(head(), nn.Linear)):
            raise InputError(f"model_arch: fednh replaces a linear classifier by class prototypes; the "
                             f"{type(net).__name__} net has no features() / linear head(). Use --set "
                             "model_arch=mlp or lenet.")
        self.net = net
        self.dim = head().in_features
        self.prototypes = nn.Parameter(torch.zeros(num_classes, self.dim), requires_grad=False)
        self.scale = nn.Parameter(torch.ones(1))

    def forward(self, x, parts: bool = False):
        u = nn.functional.normalize(self.net.features(x), dim=-1)
        logits = self.scale * (u @ self.prototypes.T)
        return (u, logits) if parts else logits
