"""The client net of :mod:`pfl_cli.algorithms.gpfl`, apart so that importing the algorithm (its config, a refusal)
does not import torch."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from pfl_cli.errors import InputError


def _valve(d: int) -> nn.Sequential:
    from torch import nn

    return nn.Sequential(nn.Linear(d, d), nn.ReLU(), nn.LayerNorm([d]))


class GPFLNet(nn.Module):
    """The client net, the conditional valve (``cov_gamma``, ``cov_beta``) and the GCE table (``gce``).

    Buffers ``context_p`` / ``context_g``: the personalized and generic conditional inputs (per client
    in a stacked call). ``forward(x)`` is the personalized prediction h(CoV(f(x), p)).
    """

    def __init__(self, net: nn.Module, num_classes: int) -> None:
        super().__init__()
        head = getattr(net, "head", None)
        if not (callable(getattr(net, "features", None)) and callable(head) and isinstance(head(), nn.Linear)):
            raise InputError(f"model_arch: gpfl gates the representation before a linear classifier; the "
                             f"{type(net).__name__} net has no features() / linear head(). Use --set "
                             "model_arch=mlp or lenet.")
        d = head().in_features
        device = head().weight.device
        self.net = net
        self.cov_gamma, self.cov_beta = _valve(d).to(device), _valve(d).to(device)
        self.gce = nn.Embedding(num_classes, d).to(device)
        self.register_buffer("context_p", torch.zeros(d, device=device))
        self.register_buffer("context_g", torch.zeros(d, device=device))

    def valve(self, h, z):
        return F.relu(h * (self.cov_gamma(z) + 1.0) + self.cov_beta(z))

    def forward(self, x, parts: bool = False):
        h = self.net.features(x)
        logits = self.net.head()(self.valve(h, self.context_p))
        return (logits, self.valve(h, self.context_g)) if parts else logits
