"""ViT-S/16 (Dosovitskiy et al. 2021) in timm's state-dict key layout, with HyperFL-LPM's adapter slots.

Keys as ``timm.create_model("vit_small_patch16_384")`` writes them: ``cls_token``, ``pos_embed``,
``patch_embed.proj.{weight,bias}``, ``blocks.<i>.{norm1,attn.qkv,attn.proj,norm2,mlp.fc1,mlp.fc2}.*``,
``norm.*`` (the ImageNet ``head.*`` is not part of the backbone). Pre-norm blocks, LayerNorm eps 1e-6,
GELU, class-token pooling, as timm's defaults for this model.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn


@dataclass(frozen=True)
class ViTShape:
    image: int       # input resolution the patches tile (the model resizes to it)
    patch: int
    dim: int
    depth: int
    heads: int
    mlp_ratio: int = 4


class Attention(nn.Module):
    def __init__(self, dim: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(dim, 3 * dim)
        self.proj = nn.Linear(dim, dim)

    def forward(self, x):
        b, n, d = x.shape
        q, k, v = self.qkv(x).reshape(b, n, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
        # Written out rather than F.scaled_dot_product_attention: its fused CPU kernel has no second
        # derivative, and `pflx attack` differentiates the upload's gradient in the images.
        weights = torch.softmax((q @ k.transpose(-2, -1)) * (d // self.heads) ** -0.5, dim=-1)
        out = weights @ v
        return self.proj(out.transpose(1, 2).reshape(b, n, d))


class Mlp(nn.Module):
    def __init__(self, dim: int, hidden: int) -> None:
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(dim, hidden), nn.Linear(hidden, dim)

    def forward(self, x):
        return self.fc2(F.gelu(self.fc1(x)))


class Block(nn.Module):
    def __init__(self, dim: int, heads: int, mlp_ratio: int) -> None:
        super().__init__()
        self.norm1 = nn.LayerNorm(dim, eps=1e-6)
        self.attn = Attention(dim, heads)
        self.norm2 = nn.LayerNorm(dim, eps=1e-6)
        self.mlp = Mlp(dim, dim * mlp_ratio)

    def forward(self, x, adapter=None):
        x = x + self.attn(self.norm1(x))
        m = self.mlp(self.norm2(x))
        if adapter is not None:  # HyperFL App. D.1: the adapter sits after the block's MLP
            m = adapter(m)
        return x + m


class PatchEmbed(nn.Module):
    def __init__(self, patch: int, dim: int) -> None:
        super().__init__()
        self.proj = nn.Conv2d(3, dim, kernel_size=patch, stride=patch)

    def forward(self, x):
        return self.proj(x).flatten(2).transpose(1, 2)


class VisionTransformer(nn.Module):
    """The ViT feature extractor: (B, 3, image, image) -> (B, dim), the final-norm class token."""

    def __init__(self, shape: ViTShape) -> None:
        super().__init__()
        self.shape = shape
        tokens = (shape.image // shape.patch) ** 2 + 1
        self.cls_token = nn.Parameter(torch.zeros(1, 1, shape.dim))
        self.pos_embed = nn.Parameter(torch.randn(1, tokens, shape.dim) * 0.02)
        self.patch_embed = PatchEmbed(shape.patch, shape.dim)
        self.blocks = nn.ModuleList(Block(shape.dim, shape.heads, shape.mlp_ratio) for _ in range(shape.depth))
        self.norm = nn.LayerNorm(shape.dim, eps=1e-6)

    @property
    def out_dim(self) -> int:
        return self.shape.dim

    def adapter_widths(self) -> list[int]:
        """The feature width at each adapter slot: one per block, after its MLP."""
        return [self.shape.dim] * self.shape.depth

    def forward(self, x, adapters=None):
        x = self.patch_embed(x)
        x = torch.cat([self.cls_token.expand(x.shape[0], -1, -1), x], dim=1) + self.pos_embed
        for i, block in enumerate(self.blocks):
            x = block(x, None if adapters is None else adapters[i])
        return self.norm(x)[:, 0]
