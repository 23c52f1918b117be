"""Dealing server samples to simulated clients whose class counts are given (vectorized).

A training sample is never a test sample (DESIGN.md section 5): each class's server samples are
split once, by a seeded draw, into a train pool and a test pool; train samples are dealt from the
train pool only and test samples from the test pool only (:func:`deal`).

Two sampling regimes (thesis §3.1 "subsample the centralized data"; it is silent on replacement):

- ``replacement=True`` -- each pool acts as a population that every client samples
  independently: no sample repeats *within* a client, but clients may share samples of one
  pool. A class runs short when the most any client needs to train on plus the most any
  client needs to test on exceeds its samples.
- ``replacement=False`` -- clients are disjoint: no sample repeats within or across
  clients. A class runs short when all clients together need more of it than the pool.

The shortage policy is explicit: ``error`` refuses up front, ``cap`` gives the clients
what there is (fewer samples), ``replace`` reuses samples of the same pool (with replacement)
to meet the counts exactly. What happened goes into the returned ``info``.
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


def _pool_sizes(need_train: np.ndarray, need_test: np.ndarray, supply: np.ndarray) -> np.ndarray:
    """How many samples of each class go to its test pool (the rest to its train pool).

    The pools share each class in proportion to the needs: a class with enough samples gives each
    pool its need plus its share of the spare samples, so neither runs short; a class that runs
    short is split in proportion to the needs (rounding towards the train pool), each needed pool
    keeping at least one sample when the class has two, and both are capped or reused alike.
    """
    total = need_train + need_test
    spare = supply - total
    share = need_test / np.maximum(total, 1)
    fair = need_test + np.floor(np.maximum(spare, 0) * share + 0.5).astype(np.int64)
    two = supply >= 2
    short = np.floor(supply * share).astype(np.int64)
    short = np.maximum(short, ((need_test > 0) & two).astype(np.int64))
    short = np.minimum(short, supply - ((need_train > 0) & two).astype(np.int64))
    return np.where(spare >= 0, fair, short)


def _shortage_error(c: int, need_train: int, need_test: int, supply: int, n_short: int,
                    replacement: bool) -> InfeasibleError:
    if need_train + need_test <= supply:  # enough samples, but copies of one sample cannot be split
        return InfeasibleError(
            f"class {c} runs short: the clients need {need_train} samples of it to train on and {need_test} to test on, "
            f"and its {supply} server samples hold copies of one sample that cannot be split between training and "
            f"testing (a training sample is never a test sample) ({n_short} class(es) short). Pass --shortage cap, "
            "--shortage replace, a lower --test-fraction, or server data without duplicate samples.")
    if replacement:
        where = (f"a client needs up to {need_train} samples of it to train on and a client up to {need_test} "
                 f"to test on ({need_train + need_test} distinct samples: a training sample is never a test sample)")
    else:
        where = (f"the clients together need {need_train + need_test} samples of it ({need_train} to train on, "
                 f"{need_test} to test on; a training sample is never a test sample)")
    return InfeasibleError(
        f"class {c} runs short: {where} and the server pool has {supply} ({n_short} class(es) short). "
        "Pass --shortage cap (fewer samples), --shortage replace (reuse samples), "
        + ("a lower --test-fraction, or fewer/smaller clients." if replacement
           else "--replacement, a lower --test-fraction, or fewer clients.")
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
    same: np.ndarray | None = None,
) -> tuple[tuple[np.ndarray, np.ndarray], tuple[np.ndarray, np.ndarray], dict[str, Any]]:
    """Give client ``i`` ``train_counts[i, l]`` train and ``test_counts[i, l]`` test samples of class ``l``.

    No sample is ever dealt both as a train sample (of any client) and as a test sample (of any
    client), DESIGN.md section 5: first each class's pool samples are split once, by a seeded
    draw, into a train pool and a test pool (sizes from :func:`_pool_sizes`); train samples are
    then dealt from the train pool only and test samples from the test pool only, so with
    replacement (and under ``shortage="replace"``) a sample repeats within its pool only.

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
    same : ndarray of shape (n_pool,), optional
        A content id of each pool sample: samples with one id hold the same content (one sample
        stored twice) and go to one pool together (the cut moves to the nearest id boundary).

    Returns
    -------
    train, test : (offsets, indices) CSR pairs
        Each client's indices ascending.
    info : dict
        The shortage record for ``stats.json``; ``test_pool`` is each class's test pool size.

    Raises
    ------
    InfeasibleError
        Under ``shortage="error"`` a class whose samples cannot cover both needs; under
        ``"replace"`` a needed pool left without any sample to reuse.
    """
    n, num_classes = train_counts.shape
    train_counts, test_counts = train_counts.copy(), test_counts.copy()
    supply = np.bincount(labels, minlength=num_classes)
    agg = (lambda m: m.max(axis=0) if n else np.zeros(num_classes, dtype=np.int64)) if replacement \
        else (lambda m: m.sum(axis=0))
    need_train, need_test = agg(train_counts), agg(test_counts)
    order = np.argsort(labels, kind="stable")
    starts = np.concatenate([[0], np.cumsum(supply)])
    planned = _pool_sizes(need_train, need_test, supply)
    members, test_size = [], np.zeros(num_classes, dtype=np.int64)
    for c in range(num_classes):  # the one seeded split of each class into its two pools
        at = order[starts[c]:starts[c + 1]]
        if same is None:
            members.append(indices[at][rng.permutation(len(at))])
            test_size[c] = planned[c]
            continue
        ids = np.unique(same[at], return_inverse=True)[1].reshape(-1)
        keys = rng.random(int(ids.max()) + 1 if len(ids) else 0)[ids]
        srt = np.lexsort((ids, keys))  # a random order of the content ids, each id's samples together
        members.append(indices[at][srt])
        test_size[c] = _cut(ids[srt], int(planned[c]), int(need_test[c]), int(supply[c] - need_train[c]))
    pools = {"train": supply - test_size, "test": test_size}
    needs = {"train": need_train, "test": need_test}
    short_cls = np.flatnonzero((need_train > pools["train"]) | (need_test > pools["test"]))
    if len(short_cls) and shortage == "error":
        c = int(short_cls[0])
        raise _shortage_error(c, int(need_train[c]), int(need_test[c]), int(supply[c]), len(short_cls), replacement)
    if shortage == "replace":
        for side in ("train", "test"):
            empty = np.flatnonzero((needs[side] > 0) & (pools[side] == 0))
            if len(empty):
                c = int(empty[0])
                if supply[c] == 0:
                    raise InfeasibleError(
                        f"class {c} is requested but the server pool has no sample of it, so nothing can be reused. "
                        "Pass --shortage cap, or use server data that holds every class.")
                raise InfeasibleError(
                    f"class {c} runs short: the clients need {needs[side][c]} {side} samples of it but its "
                    f"{supply[c]} server sample(s) all go to {'test' if side == 'train' else 'training'} "
                    "(a training sample is never a test sample), so none can be reused. "
                    "Pass --shortage cap, --test-fraction 0, or use server data with more samples of the class.")
    info: dict[str, Any] = {
        "policy": shortage, "replacement": bool(replacement),
        "classes": [{"class": int(c), "pool": side, "demanded": int(needs[side][c]), "available": int(pools[side][c])}
                    for c in short_cls for side in ("train", "test") if needs[side][c] > pools[side][c]],
    }
    counts = {"train": train_counts, "test": test_counts}
    dealt: dict[str, tuple[list, list]] = {"train": ([], []), "test": ([], [])}
    reused_total, capped_total, clients_hit = 0, 0, np.zeros(n, dtype=bool)
    for c in range(num_classes):  # a loop over classes; every client at once inside
        sub = {"test": members[c][:test_size[c]], "train": members[c][test_size[c]:]}
        for side in ("train", "test"):
            o, p, over = _deal_class(counts[side], c, len(sub[side]), replacement=replacement, shortage=shortage, rng=rng)
            if over.any():
                clients_hit |= over > 0
                if shortage == "cap":
                    capped_total += int(over.sum())
                else:
                    reused_total += int(over.sum())
            dealt[side][0].append(o)
            dealt[side][1].append(sub[side][p] if len(p) else np.zeros(0, dtype=np.int64))
        if on_class is not None:
            on_class(c)
    info.update({
        "short_classes": [int(c) for c in short_cls],
        "clients_affected": int(clients_hit.sum()),
        "samples_capped": int(capped_total),
        "samples_reused": int(reused_total),
        "test_pool": test_size.astype(np.int64).tolist(),
    })
    return _csr(*dealt["train"], n), _csr(*dealt["test"], n), info


def _cut(ids: np.ndarray, target: int, low: int, high: int) -> int:
    """Where to cut a class's samples (content ids ``ids``, each id's samples together) into its two pools.

    Only between two ids, so no content lands in both pools; the boundary nearest ``target`` among
    those in ``[low, high]`` (both pools then cover their needs), else the one nearest ``target``.
    """
    bounds = np.concatenate([[0], np.flatnonzero(ids[1:] != ids[:-1]) + 1, [len(ids)]])
    fits = bounds[(bounds >= low) & (bounds <= high)]
    pick = fits if len(fits) else bounds
    return int(pick[np.argmin(np.abs(pick - target))])


def _csr(owners: list, picks: list, n: int) -> tuple[np.ndarray, np.ndarray]:
    """The dealt samples as a CSR pair, each client's indices ascending (deterministic, readable)."""
    owner = np.concatenate(owners) if owners else np.zeros(0, dtype=np.int64)
    idx = np.concatenate(picks).astype(np.int64) if picks else np.zeros(0, dtype=np.int64)
    tidy = np.lexsort((idx, owner))
    return csr_from_assignment(owner[tidy], n, idx[tidy])


def _deal_class(demand: np.ndarray, c: int, supply: int, *, replacement: bool, shortage: str,
                rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Every client's samples of class ``c``: ``(owner, pool position, shortfall per client)``.

    ``demand`` is one side's counts (train or test) and ``supply`` that side's pool size of class ``c``.
    Under ``shortage="cap"`` a short client's demand is lowered in place; under ``"replace"`` its
    shortfall is drawn again from the same pool.
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
