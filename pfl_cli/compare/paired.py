"""Paired comparisons: each configuration against the first one given, on the same seeds and the same clients.

Two configurations trained with the same seeds on the same partition share their randomness (the split,
the cohorts' draws where the algorithms draw alike) and their clients, so their difference is best read
paired (Demsar, "Statistical comparisons of classifiers over multiple data sets", JMLR 7, 2006, §3.2):

- over the shared seeds: one headline number per seed and configuration, the differences tested by the
  paired Student t-test (``scipy.stats.ttest_rel``) and the Wilcoxon signed-rank test
  (``scipy.stats.wilcoxon``, exact for few pairs), each with its two-sided p-value;
- over the shared clients: each client's accuracy averaged over the shared seeds, paired by client, the
  same two tests (many more pairs than seeds: a difference the seeds are too few to show).

A test that cannot be computed (fewer than two pairs, or every difference zero) has p-value None. The
two-seed interval is a t-interval with 1 degree of freedom (t = 12.7): :func:`few_seeds_warnings` says so.
"""

from __future__ import annotations

import math
from typing import Any, Sequence

import numpy as np

# Below this many seeds the t-interval's multiplier (t_{0.975, n-1}: 12.7, 4.3, 3.2 for 2, 3, 4 seeds) makes
# the interval too wide to tell configurations apart.
FEW_SEEDS = 5
TESTS = {"paired_t": "paired Student t-test (scipy.stats.ttest_rel), two-sided",
         "wilcoxon": "Wilcoxon signed-rank test (scipy.stats.wilcoxon), two-sided"}


def _p_values(a: np.ndarray, b: np.ndarray) -> dict[str, float | None]:
    import warnings

    from scipy import stats

    out: dict[str, float | None] = {"paired_t": None, "wilcoxon": None}
    d = b - a
    if d.size < 2 or not np.any(d != 0):
        return out
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # scipy's notes on few samples or ties: the p-value says what it can
        if np.std(d) > 0:
            out["paired_t"] = _finite(stats.ttest_rel(b, a).pvalue)
        try:
            out["wilcoxon"] = _finite(stats.wilcoxon(b, a).pvalue)
        except ValueError:
            pass
    return out


def _finite(p: Any) -> float | None:
    p = float(p)
    return p if math.isfinite(p) else None


def _comparison(over: str, a: np.ndarray, b: np.ndarray) -> dict[str, Any]:
    keep = np.isfinite(a) & np.isfinite(b)
    a, b = a[keep], b[keep]
    return {"over": over, "pairs": int(a.size),
            "mean_difference": float(np.mean(b - a)) if a.size else None,
            "p_values": _p_values(a, b)}


def _client_means(groups, seeds) -> dict[int, float]:
    """Each client's accuracy averaged over the runs of ``seeds`` (finite values only)."""
    per: dict[int, list[float]] = {}
    for g in groups:
        if g.seed in seeds:
            for cid, acc in zip(g.client_id, g.accuracy):
                if np.isfinite(acc):
                    per.setdefault(int(cid), []).append(float(acc))
    return {c: float(np.mean(v)) for c, v in per.items()}


def paired_comparisons(rows: Sequence[dict], groups: Sequence, labels: dict, metric: str) -> list[dict[str, Any]]:
    """Every row against the first row of its client group: over the shared seeds (the headline ``metric``)
    and over the shared clients (accuracy); JSON-ready."""
    out = []
    for group in ("train", "new"):
        mine = [r for r in rows if r["group"] == group]
        if len(mine) < 2:
            continue
        ref = mine[0]
        for row in mine[1:]:
            per_seed = {r["seed"]: r[metric] for r in ref["runs"]}
            shared = [r["seed"] for r in row["runs"] if r["seed"] in per_seed and r["seed"] is not None]
            a = np.array([np.nan if per_seed[s] is None else per_seed[s] for s in shared], dtype=np.float64)
            b = np.array([np.nan if r[metric] is None else r[metric] for r in row["runs"] if r["seed"] in shared],
                         dtype=np.float64)
            entry = {"group": group, "reference": ref["label"], "label": row["label"], "metric": metric,
                     "seeds": shared, "by_seed": _comparison("seeds", a, b)}
            of = {key for key, label in labels.items() if label == ref["label"]}
            to = {key for key, label in labels.items() if label == row["label"]}
            ca = _client_means([g for g in groups if g.key in of and g.group == group], set(shared))
            cb = _client_means([g for g in groups if g.key in to and g.group == group], set(shared))
            clients = sorted(set(ca) & set(cb))
            entry["by_client"] = _comparison("clients", np.array([ca[c] for c in clients]),
                                             np.array([cb[c] for c in clients]))
            entry["by_client"]["metric"] = "accuracy"
            out.append(entry)
    return out


def few_seeds_warnings(rows: Sequence[dict], metric: str, level: float) -> list[str]:
    """One line per row whose interval rests on fewer than :data:`FEW_SEEDS` seeds."""
    lines = []
    for r in rows:
        n, half = r["num_seeds"], r.get(f"{metric}_ci")
        if 2 <= n < FEW_SEEDS and half is not None:
            from scipy import stats

            t = float(stats.t.ppf(0.5 + level / 2.0, df=n - 1))
            lines.append(f"{r['label']} ({r['group']} clients): {n} seeds give a {100 * level:g} % interval of "
                         f"±{100 * half:.1f} points from a t multiplier of {t:.1f} ({n - 1} degree"
                         f"{'s' if n > 2 else ''} of freedom): too few seeds for the interval to say how much the "
                         f"configuration varies; train {FEW_SEEDS} or more seeds, or read the paired tests (over the "
                         "shared seeds and clients).")
    return lines
