"""Client nets with batch normalization: ``mlp-bn`` and ``lenet-bn`` (FedBN's local normalization layers).

FedBN (Li, Jiang, Zhang, Kamp, Dou, ICLR 2021) keeps each client's batch-normalization layers local.
Its nets put a BatchNorm after every hidden layer (the authors' code, ``nets/models.py``: the digits
CNN has a BN after each conv and FC layer but the last); these are the pflx client nets with that one change:

- :class:`MLPBN` -- ``Linear -> BatchNorm -> ReLU`` per hidden width, then the output ``Linear``;
- :class:`LeNetBN` -- PeFLL Table B.1's LeNet with a BatchNorm after Conv1, Conv2, FC1 and FC2.

:class:`BatchNorm` is ``torch.nn.BatchNorm1d/2d`` written to be run by ``torch.func.functional_call``
over a stacked cohort: it never writes its buffers. In training mode it normalizes with the
statistics of the batch's real samples (``mask``: padded rows of a cohort batch are left out, which
``nn.BatchNorm`` cannot do) and, when asked, returns them, so the caller updates each client's
running statistics as ``nn.BatchNorm`` would (momentum 0.1, unbiased variance); in eval mode it
normalizes with the running statistics it is given. Parameters ``bnK.weight`` / ``bnK.bias``,
buffers ``bnK.running_mean`` / ``bnK.running_var``: the normalization layers' tensors are those
whose name starts with ``bn`` (:func:`norm_names`).

Only an algorithm that keeps these statistics itself (``Algorithm.local_normalization``) runs them;
every other algorithm refuses an ``-bn`` net (its local steps and evaluation would use batch
statistics, and its evaluation would see other test samples).
"""

from __future__ import annotations

from math import prod
from typing import Sequence

import torch
import torch.nn.functional as F
from torch import nn

from pfl_cli.models.client import LENET_KERNELS, LeNetTrunk, check_hidden, check_int

EPS = 1e-5        # torch.nn.BatchNorm's eps
MOMENTUM = 0.1    # torch.nn.BatchNorm's running-average momentum
NORM_ARCHS = ("mlp-bn", "lenet-bn")


class BatchNorm(nn.Module):
    """Batch normalization over the channel axis 1 of (B, C) or (B, C, H, W) inputs, functional."""

    def __init__(self, channels: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(channels))
        self.bias = nn.Parameter(torch.zeros(channels))
        self.register_buffer("running_mean", torch.zeros(channels))
        self.register_buffer("running_var", torch.ones(channels))

    def forward(self, x, mask=None, stats: list | None = None):
        shape = (1, -1) + (1,) * (x.dim() - 2)
        if self.training:
            dims = [0] + list(range(2, x.dim()))
            w = torch.ones(x.shape[0], dtype=x.dtype, device=x.device) if mask is None else mask.to(x.dtype)
            w = w.view(-1, *([1] * (x.dim() - 1)))
            n = w.sum() * prod(x.shape[2:])
            mean = (x * w).sum(dims) / n.clamp_min(1.0)
            var = (((x - mean.view(shape)) ** 2) * w).sum(dims) / n.clamp_min(1.0)
            if stats is not None:  # what nn.BatchNorm folds into its running averages: the unbiased variance
                stats.append((mean, var * n / (n - 1).clamp_min(1.0)))
        else:
            mean, var = self.running_mean, self.running_var
        return (x - mean.view(shape)) / torch.sqrt(var.view(shape) + EPS) * self.weight.view(shape) \
            + self.bias.view(shape)


class MLPBN(nn.Module):
    """:class:`~pfl_cli.models.client.MLP` with a BatchNorm after every hidden Linear (``fcK`` then ``bnK``)."""

    def __init__(self, in_features: int, num_classes: int, hidden: Sequence[int] = (32,)):
        super().__init__()
        in_features = check_int("in_features", in_features, 1)
        num_classes = check_int("num_classes", num_classes, 2)
        self.hidden = check_hidden("mlp_hidden", hidden)
        widths = (in_features, *self.hidden, num_classes)
        self.num_layers = len(widths) - 1
        self.classifier = f"fc{self.num_layers}"
        for i in range(self.num_layers):
            setattr(self, f"fc{i + 1}", nn.Linear(widths[i], widths[i + 1]))
            if i + 1 < self.num_layers:
                setattr(self, f"bn{i + 1}", BatchNorm(widths[i + 1]))

    def forward(self, x, mask=None, with_stats: bool = False):
        stats: list = []
        logits = self.head()(self.features(x, mask, stats))
        return (logits, tuple(stats)) if with_stats else logits

    def features(self, x, mask=None, stats: list | None = None):
        x = torch.flatten(x, 1)
        for i in range(1, self.num_layers):
            x = F.relu(getattr(self, f"bn{i}")(getattr(self, f"fc{i}")(x), mask, stats))
        return x

    def head(self) -> nn.Module:
        return getattr(self, f"fc{self.num_layers}")


class LeNetBN(LeNetTrunk):
    """LeNet (PeFLL Table B.1) with a BatchNorm after Conv1 (``bn1``), Conv2 (``bn2``), FC1 (``bn3``), FC2 (``bn4``)."""

    classifier = "fc3"

    def __init__(self, in_channels: int, num_classes: int, image_size=32, kernels: int = LENET_KERNELS):
        from pfl_cli.models.client import check_image_size

        in_channels = check_int("in_channels", in_channels, 1)
        num_classes = check_int("num_classes", num_classes, 2)
        super().__init__(in_channels, num_classes, check_image_size(image_size), check_int("kernels", kernels, 1))
        self.bn1, self.bn2 = BatchNorm(kernels), BatchNorm(2 * kernels)
        self.bn3, self.bn4 = BatchNorm(120), BatchNorm(84)

    def forward(self, x, mask=None, with_stats: bool = False):
        stats: list = []
        logits = self.fc3(self.features(x, mask, stats))
        return (logits, tuple(stats)) if with_stats else logits

    def features(self, x, mask=None, stats: list | None = None):
        x = self.pad(x)
        x = F.max_pool2d(F.relu(self.bn1(self.conv1(x), mask, stats)), 2)
        x = F.max_pool2d(F.relu(self.bn2(self.conv2(x), mask, stats)), 2)
        x = torch.flatten(x, 1)
        x = F.relu(self.bn3(self.fc1(x), mask, stats))
        return F.relu(self.bn4(self.fc2(x), mask, stats))

    def head(self) -> nn.Module:
        return self.fc3


def norm_layers(net: nn.Module) -> list[str]:
    """Module names of ``net``'s normalization layers, in forward order (the order of ``with_stats``)."""
    return [name for name, m in net.named_modules() if isinstance(m, BatchNorm)]


def norm_names(net: nn.Module) -> tuple[list[str], list[str]]:
    """``(parameters, buffers)``: the names of the tensors of ``net``'s normalization layers."""
    layers = tuple(f"{n}." for n in norm_layers(net))
    params = [k for k, _ in net.named_parameters() if k.startswith(layers)]
    buffers = [k for k, _ in net.named_buffers() if k.startswith(layers)]
    return params, buffers
