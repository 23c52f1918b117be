"""Client nets of the personalized-FL papers' tables that pflx's own nets do not cover.

- :class:`PFLlibCNN` (``model_arch pfllib-cnn``): the 4-layer CNN of PFLlib (Zhang et al., "PFLlib: a
  beginner-friendly and comprehensive personalized federated learning library", JMLR 2025), the default
  image net of the FedRep / FedPer / FedBABU / GPFL ... rows of its tables: two 5x5 convolutions (32 and 64
  filters, no padding), each with ReLU and 2x2 max-pooling, a 512-unit fully connected layer with ReLU, and
  the classifier. Written here from that description.
- :class:`CifarResNet18` (``model_arch resnet18-cifar``): ResNet-18 (He et al., CVPR 2016) in its CIFAR form
  (He et al. §4.2: a 3x3 stem of stride 1 and no max-pooling on 32x32 inputs), BasicBlocks [2, 2, 2, 2] of
  64 / 128 / 256 / 512 channels, global average pooling, the classifier ``fc``.

Normalization: pflx runs a cohort's clients through one ``torch.func.functional_call``, which cannot carry
each client's BatchNorm running statistics; so, as for every model kind (:mod:`pfl_cli.models.kinds`), the
ResNet's BatchNorm layers normalize with fixed statistics (mean 0, variance 1; the running-statistics
buffers are never updated), their affine weights train. Each residual block's last BatchNorm weight starts
at zero (Goyal et al. 2017, "Accurate, large minibatch SGD", §5.1), so that every block starts as the
identity and the net trains from scratch without batch statistics.
"""

from __future__ import annotations

from typing import Sequence

import torch
import torch.nn.functional as F
from torch import nn

from pfl_cli.models.resnet import FrozenStatsBatchNorm


class PFLlibCNN(nn.Module):
    """Conv(in, 32, 5) ReLU MaxPool2, Conv(32, 64, 5) ReLU MaxPool2, FC(., 512) ReLU, FC(512, C).

    FC1 reads 64 x 5 x 5 = 1,600 features on 32x32 images (CIFAR), 1,024 on 28x28 (MNIST).

    >>> PFLlibCNN(3, 10, (32, 32))(torch.zeros(2, 3, 32, 32)).shape
    torch.Size([2, 10])
    """

    classifier = "fc2"

    def __init__(self, in_channels: int, num_classes: int, image_size: Sequence[int]) -> None:
        super().__init__()
        h, w = image_size
        self.conv1 = nn.Conv2d(in_channels, 32, 5)
        self.conv2 = nn.Conv2d(32, 64, 5)
        h, w = ((h - 4) // 2 - 4) // 2, ((w - 4) // 2 - 4) // 2
        self.fc1 = nn.Linear(64 * h * w, 512)
        self.fc2 = nn.Linear(512, num_classes)

    def features(self, x):
        x = F.max_pool2d(F.relu(self.conv1(x)), 2)
        x = F.max_pool2d(F.relu(self.conv2(x)), 2)
        return F.relu(self.fc1(torch.flatten(x, 1)))

    def forward(self, x):
        return self.fc2(self.features(x))

    def head(self) -> nn.Module:
        return self.fc2


class _Block(nn.Module):
    def __init__(self, cin: int, cout: int, stride: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.bn1 = FrozenStatsBatchNorm(cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.bn2 = FrozenStatsBatchNorm(cout)
        nn.init.zeros_(self.bn2.weight)  # the block starts as the identity (Goyal et al. 2017, §5.1)
        self.shortcut = None
        if stride != 1 or cin != cout:
            self.shortcut = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), FrozenStatsBatchNorm(cout))

    def forward(self, x):
        out = F.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return F.relu(out + (x if self.shortcut is None else self.shortcut(x)))


class CifarResNet18(nn.Module):
    """ResNet-18 for small images: 3x3 stem (stride 1, no max-pool), 4 stages of 2 BasicBlocks, avgpool, ``fc``.

    11,173,962 parameters for CIFAR-10.

    >>> CifarResNet18(3, 10)(torch.zeros(2, 3, 32, 32)).shape
    torch.Size([2, 10])
    """

    classifier = "fc"
    WIDTHS = (64, 128, 256, 512)

    def __init__(self, in_channels: int, num_classes: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(in_channels, 64, 3, 1, 1, bias=False)
        self.bn1 = FrozenStatsBatchNorm(64)
        layers, cin = [], 64
        for i, width in enumerate(self.WIDTHS):
            stage = nn.Sequential(_Block(cin, width, 1 if i == 0 else 2), _Block(width, width, 1))
            layers.append(stage)
            cin = width
        self.layer1, self.layer2, self.layer3, self.layer4 = layers
        self.fc = nn.Linear(512, num_classes)

    def features(self, x):
        x = F.relu(self.bn1(self.conv1(x)))
        for stage in (self.layer1, self.layer2, self.layer3, self.layer4):
            x = stage(x)
        return torch.flatten(F.adaptive_avg_pool2d(x, 1), 1)

    def forward(self, x):
        return self.fc(self.features(x))

    def head(self) -> nn.Module:
        return self.fc
