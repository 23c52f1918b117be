"""Pathological label skew: every client holds exactly N classes.

``assign="random"`` is the pFedHN/PeFLL protocol (PeFLL thesis §4.4 "Datasets"; pFedHN §5): each
class is shared by about N*J/C clients; clients in turn pick N distinct classes among those
with the most free slots, ties broken at random. ``deterministic`` gives client i the
classes i, i+1, ..., i+N-1 (mod C); ``first-deterministic`` fixes the first class to i mod C
and picks the others as ``random`` does (NIID-Bench; Flower's ``class_assignment_mode``).
Within each class the clients' shares are U(0.4, 0.6) draws normalized over the clients
holding it (pFedHN), or equal (``shares="equal"``, PeFLL's code).
"""

from __future__ import annotations

import numpy as np

from pfl_cli.partition._alloc import owners_from_counts, split_counts

ASSIGN_MODES = ("random", "deterministic", "first-deterministic")
SHARE_MODES = ("uniform", "equal")


def class_sets(
    num_clients: int, num_classes: int, classes_per_client: int, *, assign: str, rng: np.random.Generator
) -> np.ndarray:
    """Boolean matrix (J, C): which classes each client holds, N per row."""
    held = np.zeros((num_clients, num_classes), dtype=bool)
    if assign == "deterministic":
        cols = (np.arange(num_clients)[:, None] + np.arange(classes_per_client)[None, :]) % num_classes
        held[np.arange(num_clients)[:, None], cols] = True
        return held
    # Free slots per class: classes_per_client * J spread as evenly as possible over C classes.
    slots = np.full(num_classes, (classes_per_client * num_clients) // num_classes, dtype=np.int64)
    slots[rng.permutation(num_classes)[: (classes_per_client * num_clients) % num_classes]] += 1
    # A loop over clients is inherent to the greedy protocol; each step is O(C log C).
    for j in range(num_clients):
        fixed = []
        if assign == "first-deterministic":
            fixed = [j % num_classes]
        free = np.ones(num_classes, dtype=bool)
        free[fixed] = False
        k = classes_per_client - len(fixed)
        tie = rng.random(num_classes)
        cand = np.flatnonzero(free)
        pick = cand[np.lexsort((tie[cand], -slots[cand]))[:k]]
        chosen = np.concatenate([np.asarray(fixed, dtype=np.int64), pick])
        held[j, chosen] = True
        slots[chosen] -= 1
    return held


def pathological_owners(
    labels: np.ndarray,
    *,
    num_clients: int,
    num_classes: int,
    classes_per_client: int,
    assign: str,
    shares: str,
    rng: np.random.Generator,
) -> tuple[np.ndarray, dict, np.ndarray]:
    """Owner of each sample when every client holds ``classes_per_client`` classes.

    Returns
    -------
    owner : ndarray of shape (n,)
        -1 for samples of classes no client holds.
    info : dict
    weights : ndarray of shape (J, C)
        Each client's share of each class (0 for classes it does not hold).
    """
    held = class_sets(num_clients, num_classes, classes_per_client, assign=assign, rng=rng)
    raw = rng.uniform(0.4, 0.6, size=held.shape) if shares == "uniform" else np.ones(held.shape)
    weights = np.where(held, raw, 0.0)
    supply = np.bincount(labels, minlength=num_classes)
    col = weights.sum(axis=0)
    used = col > 0
    props = np.zeros((num_classes, num_clients))
    props[used] = (weights[:, used] / col[used]).T
    counts_t = np.zeros((num_classes, num_clients), dtype=np.int64)
    counts_t[used] = split_counts(props[used], supply[used])
    owner, _ = owners_from_counts(counts_t.T, labels, rng)
    info = {"classes_without_clients": [int(c) for c in np.flatnonzero(~used & (supply > 0))]}
    return owner, info, weights
