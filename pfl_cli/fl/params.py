"""Named parameter dicts, one model or a stack of them: the building blocks the algorithms share.

A model is ``{name: Tensor}``; a stacked model has a leading axis over clients,
``{name: Tensor (c, *shape)}``. These are what ``run_round`` passes between local training
and the server, and what ``weights()`` writes to ``model.pt``.

>>> import torch
>>> theta = stack({"w": torch.tensor([1.0, 2.0])}, 3)
>>> tuple(theta["w"].shape)
(3, 2)
>>> merged = merge_rows(3, [(np.array([True, False, True]), {"w": torch.zeros(2, 2)}),
...                         (np.array([False, True, False]), {"w": torch.ones(1, 2)})])
>>> merged["w"][:, 0].tolist()
[0.0, 1.0, 0.0]
"""

from __future__ import annotations

import numpy as np


def stack(params: dict, c: int) -> dict:
    """Repeat one model's parameters ``c`` times along a new leading cohort axis."""
    return {k: v.detach().unsqueeze(0).expand(c, *v.shape).clone() for k, v in params.items()}


def broadcast(params: dict, c: int) -> dict:
    """:func:`stack` as read-only views (no copy): for a start that local SGD copies anyway, or an anchor.

    A cohort stack of the MLP 3072-100-10 for 50 clients is 61 MB; each avoidable copy is a
    fresh mmap and ~15,000 page faults a round (issue 26).
    """
    return {k: v.detach().unsqueeze(0).expand(c, *v.shape) for k, v in params.items()}


def merge_rows(n: int, parts) -> dict:
    """Stack per-client models from ``parts`` [(bool mask (n,), {name: (mask.sum(), ...)})] in client order.

    How a model serves known clients (their trained state) and new ones (the new-client
    protocol) in one call: each part fills the rows its mask selects; the first part's names
    are the model's.
    """
    import torch

    parts = [(m, p) for m, p in parts if m.any()] or list(parts)[:1]  # no rows at all: the first part's shapes
    first = parts[0][1]
    out = {k: v.new_zeros((n, *v.shape[1:])) for k, v in first.items()}
    for mask, params in parts:
        rows = torch.as_tensor(np.flatnonzero(mask), device=next(iter(out.values())).device)
        for k, v in params.items():
            out[k][rows] = v
    return out


def weighted_mean(store, cohort, theta: dict, *, by_size: bool = True, whole_train_split: bool = False) -> dict:
    """The server average of the cohort's models: by data size (FedAvg Alg. 3 line 9) or uniform.

    ``whole_train_split``: weigh by a client's fit and validation samples together, a size that ``train``
    (which carves a validation split) and ``predict`` (which does not) both see the same, for a mean
    that predict rebuilds from stored models (pFedLA's new-client start).
    """
    import torch

    length = store.fit.length + store.val.length if whole_train_split else store.fit.length
    size = length[cohort].to(torch.float32) if by_size else torch.ones(len(cohort), device=cohort.device)
    weight = size / size.sum().clamp_min(1.0)
    return {k: torch.einsum("c,c...->...", weight, v) for k, v in theta.items()}


def cpu_tree(tree: dict, *, clone: bool = False) -> dict:
    """A nested dict of tensors, detached on the CPU (``weights()``, checkpoints).

    ``clone``: copies that training can no longer change (a CPU tensor's ``.cpu()`` is itself).
    """
    def leaf(v):
        v = v.detach().cpu()
        return v.clone() if clone else v

    return {k: (cpu_tree(v, clone=clone) if isinstance(v, dict) else leaf(v)) for k, v in tree.items()}


def cpu_state_dict(module) -> dict:
    """Copies of a module's state dict on the CPU (``model.pt``, checkpoints)."""
    return cpu_tree(module.state_dict(), clone=True)
