"""The client net of :mod:`pfl_cli.algorithms.fedcp`, apart so that importing the algorithm (its config, a refusal)
does not import torch."""

from __future__ import annotations

import copy

import torch
from torch import nn

from pfl_cli.errors import InputError

CONTEXT = "context"  # the buffer of the conditional input (the client's mean feature)


def conditional_policy(scores, tau: float, noise=None):
    """FedCP's policy from the CPN's output: (..., 2d) -> (r, s), each (..., d), r + s = 1.

    The scores are read as two rows of d (personalized first); each feature's pair goes through a
    softmax at temperature ``tau``, after adding Gumbel ``noise`` (..., 2, d) when training
    (the Gumbel-Softmax relaxation).
    """
    z = scores.unflatten(-1, (2, -1))
    if noise is not None:
        z = z + noise
    w = torch.softmax(z / tau, dim=-2)
    return w[..., 0, :], w[..., 1, :]


class FedCPNet(nn.Module):
    """The client net, the conditional policy network (``cpn``) and the frozen global head (``head_g``).

    Buffer ``context``: v_i, the client-specific vector (per client in a stacked call).
    ``forward(x, noise)``: h^p(h * r) + h^g(h * s); ``noise`` (b, 2, d) Gumbel noise, or None (the
    noise-free policy). ``parts=True`` also returns the features h.
    """

    def __init__(self, net: nn.Module, tau: float = 1.0) -> None:
        super().__init__()
        head = getattr(net, "head", None)
        if not (callable(getattr(net, "features", None)) and callable(head) and isinstance(head(), nn.Linear)):
            raise InputError(f"model_arch: fedcp splits the representation before a linear classifier; the "
                             f"{type(net).__name__} net has no features() / linear head(). Use --set "
                             "model_arch=mlp or lenet.")
        d = head().in_features
        device = head().weight.device
        self.net, self.tau, self.dim = net, float(tau), d
        self.cpn = nn.Sequential(nn.Linear(d, 2 * d), nn.LayerNorm([2 * d]), nn.ReLU()).to(device)
        self.head_g = copy.deepcopy(head())
        self.register_buffer(CONTEXT, torch.zeros(d, device=device))

    def policy(self, h, noise=None):
        """(r, s): the personalized and global shares of every feature of ``h`` (..., d)."""
        return conditional_policy(self.cpn(h * self.context), self.tau, noise)

    def forward(self, x, noise=None, parts: bool = False):
        h = self.net.features(x)
        r, s = self.policy(h, noise)
        logits = self.net.head()(h * r) + self.head_g(h * s)
        return (logits, h) if parts else logits
