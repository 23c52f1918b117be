"""The client net of :mod:`pfl_cli.algorithms.knnper`, apart so that importing the algorithm (its config, a refusal)
does not import torch."""

from __future__ import annotations

import torch
from torch import nn


class KNNPerNet(nn.Module):
    """Client net + a kNN datastore held as buffers, so ``functional_call`` swaps in each client's."""

    def __init__(self, net: nn.Module, k: int, scale: float, interpolation: float) -> None:
        super().__init__()
        self.net, self.k, self.scale, self.interpolation = net, int(k), float(scale), float(interpolation)
        self.register_buffer("memory", torch.zeros(1, 1))        # (M, d) datastore features
        self.register_buffer("memory_y", torch.zeros(1, 1))      # (M, C) one-hot labels
        self.register_buffer("memory_valid", torch.zeros(1))     # (M,) 1 for real entries

    def forward(self, x):
        """log p(y | x) of the interpolated model (B, C): argmax and cross-entropy as for logits."""
        h = self.net.features(x)
        p_model = torch.softmax(self.net.head()(h), -1)
        if self.interpolation == 0:
            return torch.log(p_model.clamp_min(1e-30))
        d2 = (h * h).sum(-1, keepdim=True) + (self.memory * self.memory).sum(-1)[None, :] - 2 * h @ self.memory.T
        dist = d2.clamp_min(0.0).sqrt().masked_fill(self.memory_valid[None, :] == 0, float("inf"))
        k = min(self.k, dist.shape[-1])
        near, idx = torch.topk(dist, k, dim=-1, largest=False)
        weight = torch.exp(-(near - near[:, :1].clamp_max(1e30)) / self.scale)  # shift by the nearest: stable
        weight = torch.where(torch.isfinite(near), weight, torch.zeros_like(weight))
        votes = torch.zeros_like(dist).scatter(-1, idx, weight) @ self.memory_y  # (B, C)
        total = votes.sum(-1, keepdim=True)
        p_knn = torch.where(total > 0, votes / total.clamp_min(1e-30), p_model)  # empty datastore: the model
        p = self.interpolation * p_knn + (1 - self.interpolation) * p_model
        return torch.log(p.clamp_min(1e-30))
