"""The client net of :mod:`pfl_cli.algorithms.hyperfl`, apart so that importing the algorithm (its config, a refusal)
does not import torch."""

from __future__ import annotations

import torch
from torch import nn


class GeneratedNet(nn.Module):
    """The client net whose feature extractor is h(v; phi): parameters ``hnet.*``, ``v`` and ``net.<head>``.

    ``torch.func.functional_call`` on it with per-client ``hnet.*`` / ``v`` trains phi and v through
    the generated weights (HyperFL step 2) in the engine's vmapped local SGD.
    """

    def __init__(self, hnet: nn.Module, net: nn.Module, dim: int) -> None:
        super().__init__()
        self.hnet, self.net = hnet, net
        self.v = nn.Parameter(torch.zeros(dim))

    def forward(self, x):
        from torch.func import functional_call

        return functional_call(self.net, self.hnet(self.v), (x,))
