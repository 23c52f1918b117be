"""Hypernetwork h: R^l -> R^D of PeFLL (thesis Table B.3).

An MLP body ``Linear(l, hidden)`` followed by ``n_hidden`` times ``[ReLU, Linear(hidden, hidden)]``
(as in the authors' ``CNNHyper`` there is no ReLU after the last hidden layer), then one linear
head per target tensor (``hidden -> numel``). Together the heads are Table B.3's FC5 (100 x D), so
the parameter count is ``hidden * l + hidden + n_hidden * (hidden^2 + hidden) + (hidden + 1) * D``;
with hidden = 100 that is 100 l + 100 + 10,100 n_hidden + 101 D.
"""

from __future__ import annotations

from math import prod
from typing import Mapping

import torch
from torch import nn

from pfl_cli.errors import InputError, check_param
from pfl_cli.models.client import check_int

HYPER_SIZES = {"S": 1, "M": 3, "L": 5}  # hidden layers of sizes S / M / L (Table B.5, §2.3)


class HyperNetwork(nn.Module):
    """Maps client descriptors to the parameters of a target network.

    Parameters
    ----------
    in_dim : int
        Descriptor size l.
    target_shapes : mapping of str to tuple of int
        Name and shape of every generated tensor, e.g. ``param_shapes(client_net)``; the
        heads and the output dict follow this order.
    hidden : int, default 100
        Width of the body (Table B.3: 100).
    n_hidden : int, default 3
        Number of ``[ReLU, Linear(hidden, hidden)]`` blocks after the first layer (Table B.3:
        3, size M).

    Notes
    -----
    Parameters ``body.0.*`` (FC1, l x hidden), ``body.2.*``, ``body.4.*``, ... (the hidden
    layers) and ``heads.<i>.*`` (one head per target tensor, in ``target_shapes`` order; the
    target names are in :attr:`target_names`). Default PyTorch initialization, as the authors.

    Examples
    --------
    >>> h = HyperNetwork(4, {"w": (3, 2), "b": (3,)}, hidden=8, n_hidden=1)
    >>> {k: tuple(t.shape) for k, t in h(torch.zeros(5, 4)).items()}
    {'w': (5, 3, 2), 'b': (5, 3)}
    >>> {k: tuple(t.shape) for k, t in h(torch.zeros(4)).items()}
    {'w': (3, 2), 'b': (3,)}
    """

    def __init__(
        self,
        in_dim: int,
        target_shapes: Mapping[str, tuple[int, ...]],
        *,
        hidden: int = 100,
        n_hidden: int = 3,
        relu_out: bool = False,
    ):
        super().__init__()
        self.in_dim = check_int("embed_dim", in_dim, 1)
        hidden = check_int("hyper_hidden", hidden, 1)
        n_hidden = check_int("n_hidden", n_hidden, 0)
        check_param("target_shapes", len(target_shapes) > 0, "must name at least one tensor", target_shapes)
        self.target_names = list(target_shapes)
        self.target_shapes = {name: tuple(int(s) for s in shape) for name, shape in target_shapes.items()}
        layers: list[nn.Module] = [nn.Linear(self.in_dim, hidden)]  # Table B.3 FC1: l x 100
        for _ in range(n_hidden):  # FC2..FC4: 100 x 100 (n_hidden = 3)
            layers += [nn.ReLU(), nn.Linear(hidden, hidden)]
        if relu_out:  # HyperFL: Linear(64, 128) -> ReLU -> heads (B.4)
            layers.append(nn.ReLU())
        self.body = nn.Sequential(*layers)
        # Table B.3 FC5 (100 x D), split into one linear head per target tensor
        self.heads = nn.ModuleList(nn.Linear(hidden, prod(s)) for s in self.target_shapes.values())

    def forward(self, v: torch.Tensor) -> dict[str, torch.Tensor]:
        """Generated tensors for descriptors ``v``.

        Parameters
        ----------
        v : Tensor of shape (c, in_dim) or (in_dim,)
            A cohort of c descriptors, or a single one.

        Returns
        -------
        dict of str to Tensor
            ``name -> (c, *shape)`` for a 2-D ``v``; ``name -> shape`` (no leading dimension)
            for a 1-D ``v``.
        """
        if v.dim() not in (1, 2) or v.shape[-1] != self.in_dim:
            raise InputError(
                f"hypernetwork input must have shape (c, {self.in_dim}) or ({self.in_dim},); "
                f"got {tuple(v.shape)}."
            )
        lead = v.shape[:-1]
        features = self.body(v)
        return {
            name: head(features).reshape(*lead, *self.target_shapes[name])
            for name, head in zip(self.target_names, self.heads)
        }


def hyper_layers(size: str) -> int:
    """Hidden 100 x 100 layers of hypernetwork size ``"S"``, ``"M"`` or ``"L"`` (1 / 3 / 5)."""
    check_param("hyper_size", size in HYPER_SIZES, f"must be one of {', '.join(HYPER_SIZES)}", size)
    return HYPER_SIZES[size]


def hypernetwork(in_dim: int, target: nn.Module, *, size: str = "M", hidden: int = 100,
                 n_hidden: int | None = None, relu_out: bool = False,
                 generate: list[str] | None = None) -> HyperNetwork:
    """Build a :class:`HyperNetwork` that generates every parameter of ``target``.

    Parameters
    ----------
    in_dim : int
        Descriptor size l.
    target : torch.nn.Module
        The client network; its ``named_parameters()`` give the output names and shapes. It
        must hold no buffers (they would not be generated).
    size : {"S", "M", "L"}, default "M"
        1, 3 or 5 hidden layers (Table B.5).
    hidden : int, default 100
        Width of the body.
    n_hidden : int, optional
        Hidden 100 x 100 layers, overriding ``size`` (HyperFL: 0).
    relu_out : bool, default False
        A ReLU after the body (HyperFL's ``Linear -> ReLU -> heads``).
    generate : list of str, optional
        Generate only these target tensors (pFedHN-PC and HyperFL: the feature extractor).

    Raises
    ------
    InputError
        For an unknown ``size``, a target with buffers or without parameters.
    """
    n_hidden = hyper_layers(size) if n_hidden is None else n_hidden
    buffers = [name for name, _ in target.named_buffers()]
    rule = "must hold no buffers (the hypernetwork generates parameters only)"
    check_param("target", not buffers, rule, buffers)
    shapes = {name: tuple(p.shape) for name, p in target.named_parameters() if generate is None or name in generate}
    return HyperNetwork(in_dim, shapes, hidden=hidden, n_hidden=n_hidden, relu_out=relu_out)
