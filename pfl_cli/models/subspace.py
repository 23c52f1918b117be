"""A random low-dimensional subspace of a network's weights: theta = theta_0 + P v (thesis eq. 5.2).

FLowDUP and LD-FedAvg train v in R^k instead of theta in R^d. theta_0 (the client net's
seeded initialization) and P are regenerated from the run's seed by every party, so neither
is ever stored or sent. A dense P would need d x k floats (1.5e5 x 1e4 = 6 GB for the
thesis's CNN), so P is sparse [I, as in LFLY18's sparse projections]: row j has ``nnz``
entries at uniformly drawn columns with N(0, 1) values scaled so that every column has
unit expected norm (sqrt(k / (d nnz))). theta_0 + P v is then one gather and a sum per
weight, O(d nnz) time and memory for any k, and its gradient in v is the transposed
scatter-add that autograd derives.
"""

from __future__ import annotations

from math import prod, sqrt

import numpy as np
import torch

from pfl_cli.errors import ConfigError
from pfl_cli.rng import make_rng


class Subspace:
    """theta_0 + P v for a client network, with P regenerated from ``seed``.

    Parameters
    ----------
    theta0 : dict name -> Tensor
        The client network's initial weights (its named parameters, in order).
    dim : int
        k, the subspace dimension; at most d = the number of weights.
    seed : int
        The run's seed; P comes from its ``"subspace"`` stream.
    nnz : int
        Nonzeros per row of P.

    Attributes
    ----------
    index : LongTensor (d, nnz)
        Column of each nonzero of P, row by row.
    value : Tensor (d, nnz)
        Their values.
    """

    def __init__(self, theta0: dict, dim: int, seed: int, nnz: int = 4) -> None:
        self.names = list(theta0)
        self.shapes = [tuple(theta0[k].shape) for k in self.names]
        self.sizes = [prod(s) for s in self.shapes]
        d = sum(self.sizes)
        if dim > d:
            raise ConfigError(f"subspace_dim must be at most the client model's {d} weights; got {dim}. Lower "
                              "--set subspace_dim or use a larger --model-arch.")
        device = next(iter(theta0.values())).device
        self.dim, self.nnz, self.num_weights = int(dim), int(nnz), d
        self.theta0 = torch.cat([theta0[k].detach().reshape(-1) for k in self.names])
        self.index, self.value = (t.to(device) for t in random_projection(d, dim, nnz, seed))

    def flat(self, v: torch.Tensor) -> torch.Tensor:
        """theta_0 + P v, flat: v (..., k) -> (..., d)."""
        return self.theta0 + (v[..., self.index] * self.value).sum(-1)

    def params(self, v: torch.Tensor) -> dict:
        """theta_0 + P v as the client network's named parameters: v (c, k) -> {name: (c, *shape)}."""
        flat = self.flat(v)
        parts = torch.split(flat, self.sizes, dim=-1)
        return {k: p.reshape(*v.shape[:-1], *s) for k, p, s in zip(self.names, parts, self.shapes)}

    def dense(self) -> torch.Tensor:
        """P as a dense (d, k) matrix (tests and small models only)."""
        p = torch.zeros(self.num_weights, self.dim, dtype=self.value.dtype)
        rows = torch.arange(self.num_weights)[:, None].expand_as(self.index)
        p.index_put_((rows.cpu(), self.index.cpu()), self.value.cpu(), accumulate=True)
        return p


def random_projection(d: int, k: int, nnz: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(index, value) of the sparse P for (seed, d, k, nnz): the same bytes every time."""
    rng = make_rng(seed, f"subspace-{d}-{k}-{nnz}")
    index = rng.integers(0, k, size=(d, nnz))
    value = rng.standard_normal((d, nnz)) * sqrt(k / (d * nnz))
    return torch.as_tensor(index, dtype=torch.int64), torch.as_tensor(value.astype(np.float32))
