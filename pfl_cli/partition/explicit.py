"""Partitions the user spells out: explicit client sizes and a client x class distribution.

- ``--sizes FILE|LIST`` (Flower's ``SizePartitioner``): client j takes ``sizes[j]`` samples of a
  random permutation of the train pool, cut in client order; samples beyond ``sum(sizes)`` stay
  unused. Labels are IID.
- ``--distribution FILE`` (Flower's ``DistributionPartitioner``, client-major): row j of the
  (J, C) matrix is client j's label distribution. Client j takes ``round(size_j * q_jc)`` random
  samples of class c (largest remainder, so each row sums to ``size_j`` exactly). Sizes come from
  ``--sizes``; without it every client gets the largest equal size the class supplies allow.
  A request a class cannot supply is refused before any draw, naming the class.

Both resolve their FILE into numbers first (:func:`read_sizes`, :func:`read_distribution`), so the
artifact's config holds the numbers themselves and an edited file is a different config.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from pfl_cli.errors import ConfigError, InfeasibleError
from pfl_cli.partition._alloc import owners_from_counts

ROW_SUM_TOLERANCE = 1e-6


def _read_numbers(value, flag: str) -> np.ndarray:
    """A number list/matrix from a list, a comma-separated string, or a .npy/.csv/.txt file."""
    if isinstance(value, (list, tuple, np.ndarray)):
        return np.asarray(value, dtype=np.float64) if len(value) else np.zeros(0)
    text = str(value).strip()
    path = Path(text)
    if path.suffix.lower() in (".npy", ".csv", ".txt", ".tsv") or _is_file(path):
        if not path.is_file():
            raise ConfigError(f"{flag}: no such file {path}.")
        if path.suffix.lower() == ".npy":
            return np.asarray(np.load(path, allow_pickle=False), dtype=np.float64)
        rows = [line.replace(",", " ").split() for line in path.read_text().splitlines()]
        rows = [r for r in rows if r and not r[0].startswith("#")]
        text_rows = rows
    else:
        text_rows = [text.replace(",", " ").split()]
    try:
        values = [[float(c) for c in r] for r in text_rows]
    except ValueError as err:
        raise ConfigError(f"{flag} must hold numbers; got {err.args[0].split(': ')[-1]} in {text!r}.") from None
    if len({len(r) for r in values}) > 1:
        raise ConfigError(f"{flag}: every row must have the same number of entries; got rows of {sorted({len(r) for r in values})}.")
    return np.asarray(values, dtype=np.float64)


def _is_file(path: Path) -> bool:
    """``path.is_file()``, False for text no file system accepts as a name (a long inline list)."""
    try:
        return path.is_file()
    except OSError:  # ENAMETOOLONG: a list of hundreds of numbers given inline
        return False


def read_sizes(value) -> list[int]:
    """``--sizes``: one whole number >= 1 per client (a list, ``"30,50,20"`` or a file, one per line or comma-separated)."""
    arr = _read_numbers(value, "sizes").ravel()
    if arr.size == 0:
        raise ConfigError("sizes must list one size per client; got none.")
    if not np.all(np.isfinite(arr)) or np.any(arr != np.round(arr)) or np.any(arr < 1):
        bad = arr[~(np.isfinite(arr) & (arr == np.round(arr)) & (arr >= 1))][0]
        raise ConfigError(f"sizes must be whole numbers >= 1; got {bad:g}.")
    return [int(v) for v in arr]


def read_distribution(value, num_classes: int) -> list[list[float]]:
    """``--distribution``: a (clients x classes) matrix whose rows are label distributions."""
    q = _read_numbers(value, "distribution")
    if q.ndim != 2 or q.shape[0] < 1:
        raise ConfigError(f"distribution must be a matrix with one row per client; got shape {q.shape}.")
    if q.shape[1] != num_classes:
        raise ConfigError(f"distribution must have one column per class ({num_classes}); got {q.shape[1]} columns.")
    if not np.all(np.isfinite(q)) or np.any(q < 0):
        r, c = np.argwhere(~(np.isfinite(q) & (q >= 0)))[0]
        raise ConfigError(f"distribution entries must be >= 0; got {q[r, c]:g} in row {r + 1}, column {c + 1}.")
    sums = q.sum(axis=1)
    off = np.flatnonzero(np.abs(sums - 1) > ROW_SUM_TOLERANCE)
    if off.size:
        raise ConfigError(
            f"distribution rows must sum to 1 (each is a client's label distribution); row {off[0] + 1} sums to {sums[off[0]]:.6g}."
        )
    return q.tolist()


def check_sizes(sizes: list[int], num_samples: int, min_size: int) -> None:
    """Refuse sizes the train pool cannot supply, or below ``--min-size``."""
    total = int(np.sum(sizes))
    if total > num_samples:
        raise InfeasibleError(
            f"sizes sum to {total} samples, but the train pool has only {num_samples}; the sizes must sum to at most the data."
        )
    if min(sizes) < min_size:
        raise InfeasibleError(f"sizes must each be >= min-size {min_size}; got {min(sizes)}.")


def distribution_counts(q: np.ndarray, supply: np.ndarray, sizes: np.ndarray | None, min_size: int = 1) -> np.ndarray:
    """Integer counts (J, C): row j sums to ``sizes[j]`` and follows ``q[j]``; checked against ``supply``.

    Without ``sizes``, every client gets the largest common size s with ``counts[:, c].sum() <= supply[c]``.
    """
    num_clients = q.shape[0]
    if sizes is None:
        demand = q.sum(axis=0)  # samples of class c per unit of client size
        used = demand > 0
        s = int(np.floor(np.min(supply[used] / demand[used]))) if used.any() else 0
        # Rounding can ask one more sample of a class than s * demand; step down until it fits.
        while s > 0 and np.any(_rows(q, np.full(num_clients, s)).sum(axis=0) > supply):
            s -= 1
        if s < max(min_size, 1):
            raise InfeasibleError(
                f"distribution: the classes' supplies allow clients of at most {s} samples each, below min-size "
                f"{max(min_size, 1)}; give --sizes or a distribution that spreads over more classes."
            )
        sizes = np.full(num_clients, s)
    counts = _rows(q, np.asarray(sizes))
    short = np.flatnonzero(counts.sum(axis=0) > supply)
    if short.size:
        c = short[0]
        raise InfeasibleError(
            f"distribution x sizes ask for {int(counts[:, c].sum())} samples of class {c}, but the train pool has only "
            f"{int(supply[c])}; lower --sizes or that class's shares."
        )
    return counts


def _rows(q: np.ndarray, sizes: np.ndarray) -> np.ndarray:
    """Largest remainder (Hamilton) in every row at once: row j sums to ``sizes[j]`` exactly."""
    share = q * sizes[:, None]
    counts = np.floor(share).astype(np.int64)
    short = sizes - counts.sum(axis=1)
    # Rank each row's remainders, largest first, ties by class index (a stable sort).
    order = np.argsort(-(share - counts), axis=1, kind="stable")
    rank = np.empty_like(order)
    np.put_along_axis(rank, order, np.arange(q.shape[1])[None, :].repeat(q.shape[0], axis=0), axis=1)
    return counts + (rank < short[:, None])


def size_owners(num_samples: int, sizes: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """Owner of each sample: a random permutation cut into ``sizes``; -1 for the unused rest."""
    owner = np.full(num_samples, -1, dtype=np.int64)
    total = int(np.sum(sizes))
    owner[rng.permutation(num_samples)[:total]] = np.repeat(np.arange(len(sizes)), sizes)
    return owner


def distribution_owners(labels: np.ndarray, q: np.ndarray, sizes: np.ndarray | None, num_classes: int,
                        rng: np.random.Generator, min_size: int = 1) -> tuple[np.ndarray, dict]:
    """Owner of each sample when client j draws its samples by row j of ``q``."""
    supply = np.bincount(labels, minlength=num_classes)
    counts = distribution_counts(q, supply, sizes, min_size)
    owner, _ = owners_from_counts(counts, labels, rng)
    return owner, {"client_sizes": "given" if sizes is not None else f"equal, largest feasible ({int(counts[0].sum())})"}
