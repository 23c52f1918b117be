"""Vectorized allocation kernels shared by the schemes (inputs assumed valid)."""

from __future__ import annotations

import numpy as np

from pfl_cli.partition.base import stable_argsort


def split_counts(proportions: np.ndarray, totals: np.ndarray) -> np.ndarray:
    """Integer counts per row that sum exactly to ``totals`` (cumulative rounding).

    Row ``r`` of ``proportions`` (non-negative, summing to 1) splits ``totals[r]`` items;
    rounding the cumulative sums keeps every row's total exact and is vectorized over rows.
    """
    cum = np.cumsum(proportions, axis=1)
    cum /= np.where(cum[:, -1:] > 0, cum[:, -1:], 1.0)
    edges = np.rint(cum * totals[:, None]).astype(np.int64)
    edges[:, -1] = totals
    return np.diff(edges, axis=1, prepend=0)


def owners_from_counts(counts: np.ndarray, labels: np.ndarray, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """Give client ``j`` ``counts[j, c]`` random samples of class ``c``.

    Parameters
    ----------
    counts : ndarray of shape (n_clients, n_classes)
        Column sums must not exceed the class supplies ``bincount(labels)``.
    labels : ndarray of shape (n,)

    Returns
    -------
    owner : ndarray of shape (n,), int32
        Client of each sample, -1 for samples nobody takes.
    order : ndarray of shape (n,)
        The random, class-grouped order in which samples were dealt (for repairs).
    """
    n_clients, n_classes = counts.shape
    # Shuffle, then group by class: each class segment is a random order of its samples.
    perm = rng.permutation(len(labels))
    order = perm[stable_argsort(labels[perm], n_classes)]
    supply = np.bincount(labels, minlength=n_classes)
    # Class-major layout: the clients' counts of class 0, then class 1, ...; the rest of a
    # class (supply - taken) goes to owner -1. Owners are int32 (half the memory traffic of
    # the repeat and the scatter, the two largest steps after the permutation).
    reps = np.empty((n_classes, n_clients + 1), dtype=np.int64)
    reps[:, :n_clients] = counts.T
    reps[:, n_clients] = supply - counts.sum(axis=0)
    owners = np.empty((n_classes, n_clients + 1), dtype=np.int32)
    owners[:, :n_clients] = np.arange(n_clients, dtype=np.int32)
    owners[:, n_clients] = -1
    owner = np.empty(len(labels), dtype=np.int32)
    owner[order] = np.repeat(owners.ravel(), reps.ravel())
    return owner, order


def largest_remainder(weights: np.ndarray, total: int) -> np.ndarray:
    """Integer sizes proportional to ``weights`` summing to ``total`` (Hamilton's method)."""
    share = weights / weights.sum() * total
    sizes = np.floor(share).astype(np.int64)
    short = total - int(sizes.sum())
    if short:
        # Ties broken by index so the result is deterministic.
        top = np.lexsort((np.arange(len(share)), -(share - sizes)))[:short]
        sizes[top] += 1
    return sizes


def repair_plan(sizes: np.ndarray, min_size: int) -> tuple[np.ndarray, np.ndarray]:
    """How many samples each client gives and receives so every size reaches ``min_size``.

    The largest clients give, water-filling from the top (ties: lowest index first); the
    caller has checked ``sizes.sum() >= min_size * len(sizes)``.
    """
    need = np.maximum(min_size - sizes, 0)
    deficit = int(need.sum())
    give = np.zeros_like(sizes)
    if deficit == 0:
        return give, need
    # Largest level L with sum(max(sizes - L, 0)) >= deficit, by bisection over integers.
    lo, hi = min_size, int(sizes.max())
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if np.maximum(sizes - mid, 0).sum() >= deficit:
            lo = mid
        else:
            hi = mid - 1
    level = lo + 1
    give = np.maximum(sizes - level, 0)
    rest = deficit - int(give.sum())
    if rest:
        at_level = np.flatnonzero(sizes - give >= level)
        at_level = at_level[np.lexsort((at_level, -sizes[at_level]))][:rest]
        give[at_level] += 1
    return give, need


def apply_repair(owner: np.ndarray, order: np.ndarray, num_clients: int, min_size: int) -> tuple[np.ndarray, dict]:
    """Move samples from the largest clients to those below ``min_size`` (deterministic).

    Each giver hands over the samples it was dealt last in ``order``; the moved samples
    fill receivers in client order. Returns the new owners and what was done.
    """
    sizes = np.bincount(owner[owner >= 0], minlength=num_clients)
    give, need = repair_plan(sizes, min_size)
    moved = int(need.sum())
    if moved == 0:
        return owner, {"repaired": False}
    dealt = order[owner[order] >= 0]
    dealt_owner = owner[dealt]
    by_client = stable_argsort(dealt_owner, num_clients)
    dealt, dealt_owner = dealt[by_client], dealt_owner[by_client]
    offsets = np.concatenate([[0], np.cumsum(sizes)])
    rank = np.arange(len(dealt)) - offsets[dealt_owner]
    donated = dealt[rank >= (sizes - give)[dealt_owner]]
    owner = owner.copy()
    owner[donated] = np.repeat(np.arange(num_clients), need)
    info = {
        "repaired": True,
        "clients_below_min_size": int(np.count_nonzero(need)),
        "samples_moved": moved,
        "donor_clients": int(np.count_nonzero(give)),
    }
    return owner, info
