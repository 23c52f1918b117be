"""Statistics of a comparison: a mean over seeds with its t-interval, and fairness across clients.

Both follow the reporting protocol of personalized-FL benchmarks (pFL-Bench, Chen et al., NeurIPS
2022 Datasets and Benchmarks, section 4: each method's tuned configuration repeated over seeds, mean
and spread reported, plus the spread of accuracy across clients and the worst-off clients' accuracy).

- :func:`mean_interval`: the mean of one number per seed and the half-width of its two-sided
  Student-t confidence interval, ``t_{(1+level)/2, n-1} * s / sqrt(n)`` with ``s`` the sample
  standard deviation (ddof 1). One seed has no spread to estimate: the half-width is None
  (undefined), never 0.
- :func:`client_fairness`: over one run's per-client accuracies (clients without scored test
  samples left out): the standard deviation across clients (ddof 0: the run's clients are the
  whole population described, not a sample of one), the mean of the worst 10 % of clients
  (the ``ceil(0.1 n)`` lowest accuracies) and the minimum.

``train`` and ``predict`` write :func:`client_fairness` into ``metrics.json``; ``compare``
averages it over seeds. Nothing here imports scipy until an interval is asked for.
"""

from __future__ import annotations

import math
from typing import Sequence

import numpy as np

WORST_FRACTION = 0.1
FAIRNESS_KEYS = ("accuracy_std", "accuracy_worst10", "accuracy_min")


def _finite(values) -> np.ndarray:
    a = np.asarray(values, dtype=np.float64).ravel()
    return a[np.isfinite(a)]


def worst_count(n: int, fraction: float = WORST_FRACTION) -> int:
    """How many clients form the worst ``fraction`` of ``n``: ``ceil(fraction * n)`` (at least 1 when n >= 1).

    ``round`` guards against the float product landing a hair above an integer (0.1 * 30 = 3.0000000000000004).
    """
    return int(math.ceil(round(fraction * n, 9))) if n > 0 else 0


def client_fairness(accuracies: Sequence[float] | np.ndarray, suffix: str = "") -> dict[str, float | None]:
    """Spread and worst case of per-client accuracies (non-finite entries, clients without test data, left out).

    Returns ``{"accuracy_std<suffix>", "accuracy_worst10<suffix>", "accuracy_min<suffix>"}``; every value is
    None when no client has a finite accuracy.

    >>> client_fairness([0.5, 1.0, float("nan"), 0.75])
    {'accuracy_std': 0.2041241452319315, 'accuracy_worst10': 0.5, 'accuracy_min': 0.5}
    """
    a = _finite(accuracies)
    if a.size == 0:
        return {f"{k}{suffix}": None for k in FAIRNESS_KEYS}
    k = worst_count(a.size)
    worst = np.partition(a, k - 1)[:k]  # the k smallest, in any order
    return {f"accuracy_std{suffix}": float(np.std(a)), f"accuracy_worst10{suffix}": float(np.mean(worst)),
            f"accuracy_min{suffix}": float(np.min(a))}


def mean_interval(values: Sequence[float] | np.ndarray, level: float = 0.95) -> tuple[float | None, float | None]:
    """``(mean, half-width)`` of the two-sided Student-t interval at ``level`` over ``values`` (one per seed).

    The mean is None for no finite value; the half-width is None (undefined) for fewer than two.

    >>> mean_interval([0.5])
    (0.5, None)
    """
    if not 0.0 < level < 1.0:
        raise ValueError(f"level must be in (0, 1); got {level!r}.")
    a = _finite(values)
    if a.size == 0:
        return None, None
    mean = float(np.mean(a))
    if a.size < 2:
        return mean, None
    from scipy import stats

    t = float(stats.t.ppf(0.5 + level / 2.0, df=a.size - 1))
    return mean, t * float(np.std(a, ddof=1)) / math.sqrt(a.size)
