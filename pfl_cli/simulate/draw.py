"""Dealing server samples to simulated clients whose class counts are given (vectorized).

Two sampling regimes (thesis §3.1 "subsample the centralized data"; it is silent on replacement):

- ``replacement=True`` -- the server data acts as a population that every client samples
  independently: no sample repeats *within* a client, but clients may share samples.
  A class runs short when one client needs more of it than the pool holds.
- ``replacement=False`` -- clients are disjoint: no sample repeats within or across
  clients. A class runs short when all clients together need more of it than the pool.

The shortage policy is explicit: ``error`` refuses up front, ``cap`` gives the clients
what there is (fewer samples), ``replace`` reuses samples (with replacement) to meet the
counts exactly. What happened goes into the returned ``info``.
"""

from __future__ import annotations

from typing import Any, Callable

import numpy as np

from pfl_cli.errors import InfeasibleError
from pfl_cli.partition.base import csr_from_assignment

SHORTAGE_POLICIES = ("error", "cap", "replace")


def _distinct_positions(demand: np.ndarray, size: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """``demand[i]`` distinct positions in ``[0, size)`` for every client ``i`` (``demand <= size``).

    Rejection rounds redraw only the duplicates; a client needing more than half the pool
    draws the positions it leaves out instead, so each draw succeeds with probability
    >= 1/2 and the rounds end quickly.
    """
    flip = 2 * demand > size
    k = np.where(flip, size - demand, demand)
    owner = np.repeat(np.arange(len(demand)), k)
    pos = rng.integers(size, size=owner.size) if size else np.zeros(0, dtype=np.int64)
    while True:
        order = np.lexsort((pos, owner))
        owner, pos = owner[order], pos[order]
        dup = np.zeros(owner.size, dtype=bool)
        dup[1:] = (owner[1:] == owner[:-1]) & (pos[1:] == pos[:-1])
        if not dup.any():
            break
        pos[dup] = rng.integers(size, size=int(dup.sum()))
    if flip.any():
        rows = np.flatnonzero(flip)
        row_of = np.full(len(demand), -1)
        row_of[rows] = np.arange(len(rows))
        excluded = flip[owner]
        keep = np.ones((len(rows), size), dtype=bool)
        keep[row_of[owner[excluded]], pos[excluded]] = False
        r, c = np.nonzero(keep)
        owner = np.concatenate([owner[~excluded], rows[r]])
        pos = np.concatenate([pos[~excluded], c])
    return owner, pos


def _cap_disjoint(demand: np.ndarray, supply: int) -> np.ndarray:
    """Split ``supply`` over clients in proportion to ``demand`` (each gets <= its demand)."""
    total = int(demand.sum())
    if total <= supply:
        return demand.copy()
    cum = np.floor(np.cumsum(demand) * (supply / total) + 0.5).astype(np.int64)
    cum[-1] = supply
    return np.minimum(np.diff(cum, prepend=0), demand)


def _shortage_error(short: dict[str, Any], replacement: bool) -> InfeasibleError:
    c = short["classes"][0]
    where = ("one client needs" if replacement else "the clients together need")
    return InfeasibleError(
        f"class {c['class']} runs short: {where} {c['demanded']} samples of it and the server pool has {c['available']} "
        f"({len(short['classes'])} class(es) short). Pass --shortage cap (fewer samples), --shortage replace (reuse "
        "samples), " + ("or fewer/smaller clients." if replacement else "--replacement, or fewer clients.")
    )


def deal(
    train_counts: np.ndarray,
    test_counts: np.ndarray,
    labels: np.ndarray,
    indices: np.ndarray,
    *,
    replacement: bool,
    shortage: str,
    rng: np.random.Generator,
    on_class: Callable[[int], None] | None = None,
) -> tuple[tuple[np.ndarray, np.ndarray], tuple[np.ndarray, np.ndarray], dict[str, Any]]:
    """Give client ``i`` ``train_counts[i, l]`` + ``test_counts[i, l]`` samples of class ``l``.

    Parameters
    ----------
    train_counts, test_counts : ndarray of shape (n_clients, C)
    labels : ndarray of shape (n_pool,)
        Class of each pool sample.
    indices : ndarray of shape (n_pool,)
        Dataset index of each pool sample.
    replacement : bool
        Independent clients (True) or disjoint clients (False); see the module docstring.
    shortage : {"error", "cap", "replace"}
    rng : numpy.random.Generator
    on_class : callable(class), optional
        Called after each class is dealt to every client (progress).

    Returns
    -------
    train, test : (offsets, indices) CSR pairs
    info : dict
        The shortage record for ``stats.json``.
    """
    n, num_classes = train_counts.shape
    demand = train_counts + test_counts
    supply = np.bincount(labels, minlength=num_classes)
    need = demand.max(axis=0) if replacement else demand.sum(axis=0)
    short_cls = np.flatnonzero(need > supply)
    info: dict[str, Any] = {
        "policy": shortage, "replacement": bool(replacement),
        "classes": [{"class": int(c), "demanded": int(need[c]), "available": int(supply[c])} for c in short_cls],
    }
    if len(short_cls) and shortage == "error":
        raise _shortage_error(info, replacement)
    empty_short = [int(c) for c in short_cls if supply[c] == 0]
    if empty_short and shortage == "replace":
        raise InfeasibleError(
            f"class {empty_short[0]} is requested but the server pool has no sample of it, so nothing can be reused. "
            "Pass --shortage cap, or use server data that holds every class."
        )
    order = np.argsort(labels, kind="stable")
    starts = np.concatenate([[0], np.cumsum(supply)])
    owners, picks, reused_total, capped_total, clients_hit = [], [], 0, 0, np.zeros(n, dtype=bool)
    for c in range(num_classes):  # a loop over classes; every client at once inside
        o, p, over = _deal_class(demand, c, int(supply[c]), replacement=replacement, shortage=shortage, rng=rng)
        if over.any():
            clients_hit |= over > 0
            if shortage == "cap":
                capped_total += int(over.sum())
            else:
                reused_total += int(over.sum())
        owners.append(o)
        picks.append(indices[order[starts[c]:starts[c + 1]]][p] if len(p) else np.zeros(0, dtype=np.int64))
        if on_class is not None:
            on_class(c)
    owner, idx, is_train = _split_by_rank(owners, picks, np.minimum(train_counts, demand), rng)
    info.update({
        "short_classes": [int(c) for c in short_cls],
        "clients_affected": int(clients_hit.sum()),
        "samples_capped": int(capped_total),
        "samples_reused": int(reused_total),
    })
    return (csr_from_assignment(owner[is_train], n, idx[is_train]),
            csr_from_assignment(owner[~is_train], n, idx[~is_train]), info)


def _deal_class(demand: np.ndarray, c: int, supply: int, *, replacement: bool, shortage: str,
                rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Every client's samples of class ``c``: ``(owner, pool position, shortfall per client)``.

    Under ``shortage="cap"`` a short client's demand is lowered in place (it keeps its train counts
    first); under ``"replace"`` its shortfall is drawn again from the class's pool.
    """
    n = demand.shape[0]
    d = demand[:, c]
    ok = np.minimum(d, supply) if replacement else _cap_disjoint(d, supply)
    over = d - ok
    if over.any() and shortage == "cap":
        demand[:, c] = ok
    if replacement:
        owner, position = _distinct_positions(ok, supply, rng)
    else:
        position = rng.permutation(supply)[: int(ok.sum())]
        owner = np.repeat(np.arange(n), ok)
    if shortage == "replace" and over.any():
        owner = np.concatenate([owner, np.repeat(np.arange(n), over)])
        position = np.concatenate([position, rng.integers(supply, size=int(over.sum()))])
    return owner, position, over


def _split_by_rank(owners: list, picks: list, train_keep: np.ndarray,
                   rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Owner, dataset index and train flag of every dealt sample, each client's indices ascending.

    Within each (client, class) group a random order decides which samples are test: the first
    ``train_keep[client, class]`` are train.
    """
    num_classes = len(owners)
    owner = np.concatenate(owners) if owners else np.zeros(0, dtype=np.int64)
    idx = np.concatenate(picks) if picks else np.zeros(0, dtype=np.int64)
    cls = np.repeat(np.arange(num_classes), [len(o) for o in owners])
    keys = rng.random(owner.size)
    srt = np.lexsort((keys, cls, owner))
    owner, idx, cls = owner[srt], idx[srt], cls[srt]
    group = owner * num_classes + cls
    first = np.searchsorted(group, group, side="left")
    rank = np.arange(owner.size) - first
    is_train = rank < train_keep[owner, cls]
    tidy = np.lexsort((idx, owner))  # each client's indices ascending: deterministic, readable
    return owner[tidy], idx[tidy], is_train[tidy]
