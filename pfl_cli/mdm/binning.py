"""Categories from a continuous feature, for MDM histograms (thesis §3.4, app. A.3.2).

The thesis models Folktables income by binning it into 41 intervals of $5,000:
``[0, 5000), [5000, 10000), ..., [195000, 200000), [200000, inf)`` -- ``--bins 5000:41``.
"""

from __future__ import annotations

import numpy as np

from pfl_cli.errors import InputError, check_memory


def parse_bins(spec: str, clients: int = 0) -> np.ndarray:
    """Left edges of the bins: ``"WIDTH:COUNT"`` (from 0) or explicit ``"e0,e1,...,eB"``.

    A ``WIDTH:COUNT`` whose histograms for ``clients`` clients cannot fit in memory is refused up front.

    The last bin is open-ended: ``[edges[-1], inf)``; values below ``edges[0]`` are refused.

    Examples
    --------
    >>> parse_bins("5000:41")[[0, 1, -1]].tolist()
    [0.0, 5000.0, 200000.0]
    >>> parse_bins("0,10,25").tolist()
    [0.0, 10.0, 25.0]
    """
    text = str(spec).strip()
    bad = InputError(f"bins must be WIDTH:COUNT (e.g. 5000:41) or increasing left edges e0,e1,... ; got {spec!r}.")
    try:
        if ":" in text:
            width_s, count_s = text.split(":", 1)
            width, count = float(width_s), int(count_s)
            if not (width > 0 and np.isfinite(width) and count >= 1):
                raise bad
        else:
            edges = np.array([float(p) for p in text.split(",") if p.strip()], dtype=np.float64)
    except ValueError:
        raise bad from None
    if ":" in text:
        # The edges, then per client a histogram over every bin (int64) and the fit's float64 copies.
        check_memory(f"--bins {spec}: {clients} clients x {count} bins", 8.0 * count * (1 + 4 * clients),
                     fix="Use fewer, wider bins.")
        return np.arange(count, dtype=np.float64) * width
    if edges.size < 1 or not np.all(np.isfinite(edges)) or np.any(np.diff(edges) <= 0):
        raise bad
    return edges


def bin_values(values: np.ndarray, edges: np.ndarray) -> np.ndarray:
    """Category of each value: ``b`` with ``edges[b] <= v < edges[b+1]`` (last bin open).

    Examples
    --------
    >>> bin_values(np.array([0, 4999, 5000, 199999, 200000, 1423000]), parse_bins("5000:41")).tolist()
    [0, 0, 1, 39, 40, 40]
    """
    v = np.asarray(values, dtype=np.float64)
    if not np.all(np.isfinite(v)):
        raise InputError("values to bin must be finite; found NaN or infinite values.")
    if v.size and v.min() < edges[0]:
        raise InputError(f"values must be >= the first bin edge {edges[0]:g}; got {v.min():g}.")
    return (np.searchsorted(edges, v, side="right") - 1).astype(np.int64)


def counts_from_values(clients: np.ndarray, values: np.ndarray, edges: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per-client histograms of binned values: ``(counts (n_clients, len(edges)), client ids)``."""
    ids, owner = np.unique(np.asarray(clients), return_inverse=True)
    cat = bin_values(values, edges)
    c = len(edges)
    counts = np.bincount(owner.ravel() * c + cat, minlength=len(ids) * c).reshape(len(ids), c)
    return counts.astype(np.int64), ids
