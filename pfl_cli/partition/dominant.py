"""Dominant-class label skew (FedPAC / HyperFL App. D.1).

"All clients have the same data size, in which s% of data (20% by default) are uniformly sampled
from all classes and the remaining (100-s)% from a set of dominant classes for each client."
Clients fall into groups sharing their dominant classes: group g holds the D consecutive classes
starting at class 2g (mod C) -- {0,1,2}, {2,3,4}, ..., {8,9,0} for C = 10, D = 3 -- and client i
is in group i mod G, G = ceil(C / 2). Every client gets the same size m, the largest the class
supplies allow (the paper fixes 600 per client on CIFAR-10, well below that largest size).
"""

from __future__ import annotations

import numpy as np

from pfl_cli.errors import InfeasibleError
from pfl_cli.partition._alloc import largest_remainder, owners_from_counts


def dominant_groups(num_classes: int, dominant: int) -> np.ndarray:
    """Boolean (G, C): the dominant classes of each group, starting at classes 0, 2, 4, ..."""
    starts = np.arange(0, num_classes, 2)
    cols = (starts[:, None] + np.arange(dominant)[None, :]) % num_classes
    groups = np.zeros((len(starts), num_classes), dtype=bool)
    groups[np.arange(len(starts))[:, None], cols] = True
    return groups


def dominant_counts(size: int, num_clients: int, num_classes: int, dominant: int, uniform_share: float) -> np.ndarray:
    """Per-client class counts (J, C) for clients of ``size`` samples."""
    groups = dominant_groups(num_classes, dominant)
    u = int(round(uniform_share * size))
    uniform = largest_remainder(np.ones(num_classes), u)
    counts = np.tile(uniform, (num_clients, 1))
    for i in range(num_clients):  # J rows of C numbers: the loop is over clients, not samples
        held = groups[i % len(groups)]
        counts[i, held] += largest_remainder(np.ones(int(held.sum())), size - u)
    return counts


def dominant_owners(labels: np.ndarray, *, num_clients: int, num_classes: int, dominant: int, uniform_share: float,
                    rng: np.random.Generator) -> tuple[np.ndarray, dict]:
    """Owner of each sample (-1: unused) and the scheme's record for ``stats.json``."""
    supply = np.bincount(labels, minlength=num_classes)
    # Demand grows linearly in m: start from the continuous bound and step down to the first feasible size.
    groups = dominant_groups(num_classes, dominant)
    members = np.bincount(np.arange(num_clients) % len(groups), minlength=len(groups)) @ groups
    rate = num_clients * uniform_share / num_classes + (1 - uniform_share) * members / dominant
    size = int(np.floor(np.min(np.where(rate > 0, supply / np.maximum(rate, 1e-12), np.inf))))
    while size > 0 and np.any(dominant_counts(size, num_clients, num_classes, dominant, uniform_share).sum(0) > supply):
        size -= 1
    if size < 1:
        raise InfeasibleError(f"dominant-classes: {num_clients} clients cannot each get a sample of every class "
                              f"share; the train pool's classes hold {supply.tolist()}. Lower --num-clients.")
    counts = dominant_counts(size, num_clients, num_classes, dominant, uniform_share)
    owner, _ = owners_from_counts(counts, labels, rng)
    info = {"dominant_classes": dominant, "uniform_share": uniform_share, "samples_per_client": size,
            "groups": [np.flatnonzero(g).tolist() for g in groups], "unused_samples": int(np.sum(owner < 0))}
    return owner, info
