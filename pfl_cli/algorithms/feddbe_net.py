"""The client net of :mod:`pfl_cli.algorithms.feddbe`, apart so that importing the algorithm (its config, a refusal)
does not import torch."""

from __future__ import annotations

import torch
from torch import nn

from pfl_cli.errors import InputError


class DBENet(nn.Module):
    """``net`` with a personalized representation bias z^p added to its features: h(f(x) + z^p)."""

    def __init__(self, net: nn.Module) -> None:
        super().__init__()
        head = getattr(net, "head", None)
        if not (callable(getattr(net, "features", None)) and callable(head)
                and isinstance(head(), nn.Linear)):
            raise InputError(f"model_arch: feddbe adds a bias to the representation before a linear classifier; "
                             f"the {type(net).__name__} net has no features() / linear head(). Use --set "
                             "model_arch=mlp or lenet.")
        self.net = net
        self.prbm = nn.Parameter(torch.zeros(head().in_features, device=head().weight.device))

    def forward(self, x, parts: bool = False):
        h = self.net.features(x)
        logits = self.net.head()(h + self.prbm)
        return (logits, h) if parts else logits
