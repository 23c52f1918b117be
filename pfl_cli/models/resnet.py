"""ResNet-18 (He et al. 2016) in torchvision's state-dict key layout, with HyperFL-LPM's adapter slots.

Keys as ``torchvision.models.resnet18()`` writes them: ``conv1.weight``, ``bn1.*``,
``layer<1-4>.<j>.{conv1,bn1,conv2,bn2}.*``, ``layer<2-4>.0.downsample.{0,1}.*`` (the ImageNet ``fc.*`` is
not part of the backbone). Batch norm always uses its running statistics (a frozen, pre-trained
backbone; no per-client statistics), so the net holds no state that training would update in place.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch.nn.functional as F
from torch import nn


@dataclass(frozen=True)
class ResNetShape:
    image: int                    # input resolution (the model resizes to it)
    widths: tuple[int, ...]       # channels of layer1..layer4
    blocks: tuple[int, ...]       # BasicBlocks per layer (ResNet-18: 2, 2, 2, 2)
    stem: int = 64                # conv1 output channels (= widths[0] in torchvision)


class FrozenStatsBatchNorm(nn.BatchNorm2d):
    """``BatchNorm2d`` with torchvision's keys that always normalizes with the running statistics."""

    def forward(self, x):
        return F.batch_norm(x, self.running_mean, self.running_var, self.weight, self.bias, False, 0.0, self.eps)


class BasicBlock(nn.Module):
    def __init__(self, cin: int, cout: int, stride: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.bn1 = FrozenStatsBatchNorm(cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.bn2 = FrozenStatsBatchNorm(cout)
        if stride != 1 or cin != cout:
            self.downsample = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), FrozenStatsBatchNorm(cout))

    def forward(self, x):
        skip = self.downsample(x) if hasattr(self, "downsample") else x
        out = F.relu(self.bn1(self.conv1(x)))
        return F.relu(self.bn2(self.conv2(out)) + skip)


class ResNet(nn.Module):
    """The ResNet feature extractor: (B, 3, image, image) -> (B, widths[-1]) after global average pooling."""

    def __init__(self, shape: ResNetShape) -> None:
        super().__init__()
        self.shape = shape
        self.conv1 = nn.Conv2d(3, shape.stem, 7, 2, 3, bias=False)
        self.bn1 = FrozenStatsBatchNorm(shape.stem)
        cin = shape.stem
        for i, (width, n) in enumerate(zip(shape.widths, shape.blocks)):
            blocks = []
            for j in range(n):
                blocks.append(BasicBlock(cin, width, 2 if (j == 0 and i > 0) else 1))
                cin = width
            setattr(self, f"layer{i + 1}", nn.Sequential(*blocks))

    @property
    def out_dim(self) -> int:
        return self.shape.widths[-1]

    def adapter_widths(self) -> list[int]:
        """The channels at each adapter slot: one behind every residual block (HyperFL App. D.1)."""
        return [w for w, n in zip(self.shape.widths, self.shape.blocks) for _ in range(n)]

    def forward(self, x, adapters=None):
        x = F.max_pool2d(F.relu(self.bn1(self.conv1(x))), 3, 2, 1)
        slot = 0
        for i in range(len(self.shape.widths)):
            for block in getattr(self, f"layer{i + 1}"):
                x = block(x)
                if adapters is not None:
                    x = adapters[slot](x)
                slot += 1
        return x.mean(dim=(2, 3))
