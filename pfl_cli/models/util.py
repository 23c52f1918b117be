"""Parameter helpers: counts, shapes and cohort-stacked copies for ``torch.func`` / ``vmap``."""

from __future__ import annotations

import torch
from torch import nn

from pfl_cli.models.client import check_int


def count_parameters(module: nn.Module) -> int:
    """Total number of parameter entries of ``module`` (trainable or not; buffers excluded).

    Examples
    --------
    >>> count_parameters(nn.Linear(3, 2))
    8
    """
    return sum(p.numel() for p in module.parameters())


def param_shapes(module: nn.Module) -> dict[str, tuple[int, ...]]:
    """``name -> shape`` of every parameter, in ``named_parameters()`` order.

    Examples
    --------
    >>> param_shapes(nn.Linear(3, 2))
    {'weight': (2, 3), 'bias': (2,)}
    """
    return {name: tuple(p.shape) for name, p in module.named_parameters()}


def stacked_params(module: nn.Module, c: int) -> dict[str, torch.Tensor]:
    """The parameters of ``module``, detached and repeated ``c`` times: ``name -> (c, *shape)``.

    Each copy is independent memory (not an expanded view), ready to be trained by a cohort of
    c clients under ``torch.func.vmap`` + ``functional_call``.

    Examples
    --------
    >>> {k: tuple(t.shape) for k, t in stacked_params(nn.Linear(3, 2), 4).items()}
    {'weight': (4, 2, 3), 'bias': (4, 2)}
    """
    c = check_int("c", c, 1)
    return {
        name: p.detach().unsqueeze(0).repeat(c, *([1] * p.dim()))
        for name, p in module.named_parameters()
    }


class FeatureView(nn.Module):
    """``net.features`` as a module's forward, its parameters named ``net.*``: the representation of a client
    net as a ``functional_call`` target (FedCP's global extractor, kNN-Per's datastore, FedAS's alignment)."""

    def __init__(self, net: nn.Module) -> None:
        super().__init__()
        self.net = net

    def forward(self, x):
        return self.net.features(x)
