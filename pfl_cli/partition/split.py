"""Per-client test data and holdout clients."""

from __future__ import annotations

import numpy as np

from pfl_cli.partition._alloc import owners_from_counts, split_counts
from pfl_cli.partition.base import ROLE_HOLDOUT, ROLE_TRAIN, csr_from_assignment, stable_argsort


def holdout_count(holdout: float | int, num_clients: int) -> int:
    """Number of holdout clients for ``--holdout-clients F|N``: F in [0, 1) is a fraction."""
    if 0 <= holdout < 1:
        return int(round(holdout * num_clients))
    return int(holdout)


def mark_holdout(num_clients: int, count: int, *, rng: np.random.Generator) -> np.ndarray:
    """Roles (uint8): ``count`` clients chosen at random get role 1, the rest role 0."""
    role = np.full(num_clients, ROLE_TRAIN, dtype=np.uint8)
    role[rng.choice(num_clients, size=count, replace=False)] = ROLE_HOLDOUT
    return role


def split_fraction(owner: np.ndarray, indices: np.ndarray, num_clients: int, fraction: float, rng: np.random.Generator):
    """Split each client's samples: ``round(fraction * n_j)`` of them, at random, become test.

    A client keeps at least one train sample. Returns the train and test CSR pairs.
    """
    if fraction == 0:
        return csr_from_assignment(owner, num_clients, indices), (np.zeros(num_clients + 1, np.int64), np.zeros(0, np.int64))
    # A random permutation, then a stable sort by client: each client's samples in random order.
    perm = rng.permutation(len(owner))
    order = perm[stable_argsort(owner[perm], num_clients)]
    owner_s, idx_s = owner[order], indices[order]
    sizes = np.bincount(owner_s, minlength=num_clients)
    starts = np.concatenate([[0], np.cumsum(sizes)[:-1]])
    rank = np.arange(len(owner_s)) - starts[owner_s]
    n_test = np.minimum(np.floor(fraction * sizes + 0.5).astype(np.int64), np.maximum(sizes - 1, 0))
    is_test = rank < n_test[owner_s]
    train = csr_from_assignment(owner_s[~is_test], num_clients, idx_s[~is_test])
    test = csr_from_assignment(owner_s[is_test], num_clients, idx_s[is_test])
    return train, test


def match_test_pool(
    train_hist: np.ndarray, pool_labels: np.ndarray, pool_indices: np.ndarray, rng: np.random.Generator
):
    """Deal the official test pool so each client's test labels follow its train labels.

    Class c of the pool is split over clients in proportion to their train counts of c:
    the same class/proportion partition applied to the test pool (pFedHN/PeFLL protocol,
    PeFLL thesis §4.4 "Datasets"). Classes no client trains on stay unassigned.
    """
    num_clients, num_classes = train_hist.shape
    supply = np.bincount(pool_labels, minlength=num_classes)
    col = train_hist.sum(axis=0)
    used = col > 0
    counts_t = np.zeros((num_classes, num_clients), dtype=np.int64)
    counts_t[used] = split_counts((train_hist[:, used] / col[used]).T, supply[used])
    owner, _ = owners_from_counts(counts_t.T, pool_labels, rng)
    return csr_from_assignment(owner, num_clients, pool_indices)
