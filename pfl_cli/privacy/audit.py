"""Empirical privacy audit: a statistical lower bound on a mechanism's epsilon.

A mechanism M is (epsilon, delta)-DP when for neighbouring inputs D0, D1 and every event E

    P[M(D1) in E] <= e^epsilon * P[M(D0) in E] + delta      (and with D0, D1 swapped).

The tester runs M many times on D0 and on D1, reduces each output to a scalar (the
projection on the direction in which the two noiseless outputs differ -- the
likelihood-ratio test for Gaussian noise, and a single-coordinate test for Laplace noise
on a one-coordinate difference), and looks at threshold events ``{s > t}`` and
``{s < t}``. With Clopper-Pearson bounds ``p1 >= p1_lo`` and ``p0 <= p0_hi`` (each at
confidence ``1 - alpha / 2``), any (epsilon, delta)-DP mechanism satisfies

    epsilon >= log((p1_lo - delta) / p0_hi)

with probability >= ``1 - alpha``. The threshold and the direction are chosen on one half
of the trials and the bound is computed on the other half, so the choice does not bias the
bound. A correct mechanism gives a lower bound at most its claimed epsilon; a mechanism
that adds too little noise (e.g. calibrated for half its true sensitivity) gives a lower
bound above it once there are enough trials. This is the shape of the statistical testers
that DP libraries run on their own mechanisms; it can prove a claim wrong, never right.

Everything is vectorized numpy and takes an explicit generator.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable

import numpy as np
from scipy import stats

from pfl_cli.errors import check_param


@dataclass(frozen=True)
class AuditResult:
    """One audit: the empirical lower bound next to the claim.

    Attributes
    ----------
    name : str
    claimed_epsilon, delta : float
        The epsilon the ledger claims for this release at ``delta``.
    epsilon_lower_bound : float
        Empirical lower bound on the true epsilon at confidence ``confidence`` (0 when no
        event separates the two inputs).
    trials : int
        Runs of the mechanism on each input.
    threshold : float
        The chosen event's threshold on the test statistic.
    """

    name: str
    claimed_epsilon: float
    delta: float
    epsilon_lower_bound: float
    trials: int
    confidence: float
    threshold: float

    @property
    def passed(self) -> bool:
        """True when the data do not refute the claim."""
        return self.epsilon_lower_bound <= self.claimed_epsilon

    def row(self) -> dict:
        return {"mechanism": self.name, "claimed_epsilon": self.claimed_epsilon, "delta": self.delta,
                "empirical_lower_bound": self.epsilon_lower_bound, "trials": self.trials,
                "confidence": self.confidence, "verdict": "ok" if self.passed else "CLAIM REFUTED"}


def clopper_pearson(successes: np.ndarray, trials: int, alpha: float) -> tuple[np.ndarray, np.ndarray]:
    """Exact two-sided ``1 - alpha`` binomial bounds, each side at ``alpha / 2`` (vectorized).

    Examples
    --------
    >>> lo, hi = clopper_pearson(np.array([0, 5, 10]), 10, 0.05)
    >>> lo.round(3).tolist(), hi.round(3).tolist()
    ([0.0, 0.187, 0.692], [0.308, 0.813, 1.0])
    """
    k = np.asarray(successes, dtype=np.float64)
    with np.errstate(invalid="ignore"):
        lo = np.where(k > 0, stats.beta.ppf(alpha / 2, k, trials - k + 1), 0.0)
        hi = np.where(k < trials, stats.beta.ppf(1 - alpha / 2, k + 1, trials - k), 1.0)
    return np.nan_to_num(lo), np.nan_to_num(hi, nan=1.0)


def _tail_counts(sorted_stat: np.ndarray, thresholds: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """How many values are > t and < t, for every t."""
    above = len(sorted_stat) - np.searchsorted(sorted_stat, thresholds, side="right")
    below = np.searchsorted(sorted_stat, thresholds, side="left")
    return above, below


def _bounds(s0: np.ndarray, s1: np.ndarray, thresholds: np.ndarray, delta: float, alpha: float) -> np.ndarray:
    """Lower bounds on epsilon of the events {s > t} (D1 favoured) and {s < t} (D0 favoured), shape (2, T)."""
    n0, n1 = len(s0), len(s1)
    a0, b0 = _tail_counts(np.sort(s0), thresholds)
    a1, b1 = _tail_counts(np.sort(s1), thresholds)
    out = np.full((2, len(thresholds)), -np.inf)
    for row, (k_big, n_big, k_small, n_small) in enumerate(((a1, n1, a0, n0), (b0, n0, b1, n1))):
        p_big_lo, _ = clopper_pearson(k_big, n_big, alpha)
        _, p_small_hi = clopper_pearson(k_small, n_small, alpha)
        num = p_big_lo - delta
        with np.errstate(divide="ignore", invalid="ignore"):
            out[row] = np.where(num > 0, np.log(num / p_small_hi), -np.inf)
    return out


def epsilon_lower_bound(stat0: np.ndarray, stat1: np.ndarray, *, delta: float, confidence: float = 0.95,
                        num_thresholds: int = 400) -> tuple[float, float]:
    """Empirical lower bound on epsilon from test statistics of runs on D0 and on D1.

    Parameters
    ----------
    stat0, stat1 : ndarray of shape (trials,)
        The scalar test statistic of each run on D0 and on D1 (same number of runs).
    delta : float
        The claimed delta, in [0, 1).
    confidence : float, default=0.95
        Probability that the bound holds for a mechanism that is (epsilon, delta)-DP.
    num_thresholds : int, default=400
        Candidate thresholds (quantiles of the selection half).

    Returns
    -------
    (epsilon_lower_bound, threshold) : tuple of float

    Examples
    --------
    >>> rng = np.random.default_rng(0)
    >>> lb, _ = epsilon_lower_bound(rng.normal(0, 1, 200_000), rng.normal(4, 1, 200_000), delta=1e-5)
    >>> 3 < lb < 12   # N(0,1) vs N(4,1): about 9.4 at delta 1e-5
    True
    """
    s0, s1 = np.asarray(stat0, dtype=np.float64), np.asarray(stat1, dtype=np.float64)
    check_param("trials", len(s0) == len(s1) and len(s0) >= 20, "must be equal and >= 20 on each input",
                (len(s0), len(s1)))
    check_param("delta", 0 <= delta < 1, "must be in [0, 1)", delta)
    check_param("confidence", 0 < confidence < 1, "must be in (0, 1)", confidence)
    half = len(s0) // 2
    alpha = 1.0 - confidence
    pooled = np.sort(np.concatenate([s0[:half], s1[:half]]))
    # The best events sit deep in the tails: candidate thresholds at geometrically spaced
    # ranks from both ends, plus an even grid in between.
    ranks = np.unique(np.geomspace(1, len(pooled) // 2, num_thresholds // 2).astype(int))
    grid = np.quantile(pooled, np.linspace(0.0, 1.0, num_thresholds // 2))
    thresholds = np.unique(np.concatenate([pooled[ranks - 1], pooled[-ranks], grid]))
    chosen = _bounds(s0[:half], s1[:half], thresholds, delta, alpha)
    row, col = np.unravel_index(int(np.argmax(chosen)), chosen.shape)
    t = thresholds[col : col + 1]
    final = _bounds(s0[half:], s1[half:], t, delta, alpha)[row, 0]
    return (max(float(final), 0.0) if math.isfinite(final) else 0.0), float(t[0])


def projection_statistic(outputs: np.ndarray, clean0: np.ndarray, clean1: np.ndarray) -> np.ndarray:
    """Project outputs (trials, dim) on the unit direction from ``clean0`` to ``clean1``.

    For i.i.d. Gaussian noise this is the likelihood-ratio statistic, so threshold events
    on it are the most powerful ones (Neyman-Pearson).
    """
    direction = np.ravel(clean1) - np.ravel(clean0)
    norm = float(np.linalg.norm(direction))
    check_param("neighbouring inputs", norm > 0, "must give different noiseless outputs", norm)
    return (np.reshape(outputs, (len(outputs), -1)) - np.ravel(clean0)) @ (direction / norm)


def run_trials(release: Callable[..., np.ndarray], trials: int, rng: np.random.Generator, *,
               batched: bool = False) -> np.ndarray:
    """Run a release ``trials`` times (each draws its own noise from ``rng``), shape (trials, dim).

    ``batched``: ``release(rng, trials)`` returns all the draws at once (vectorized).
    """
    if batched:
        return np.reshape(release(rng, trials), (trials, -1))
    first = np.ravel(release(rng))
    out = np.empty((trials, first.size))
    out[0] = first
    for i in range(1, trials):  # the real release function, one call per trial (it is what is audited)
        out[i] = np.ravel(release(rng))
    return out


def audit_release(name: str, release0: Callable, release1: Callable, clean0: np.ndarray, clean1: np.ndarray, *,
                  claimed_epsilon: float, delta: float, trials: int, rng: np.random.Generator,
                  confidence: float = 0.95, transform: Callable[[np.ndarray], np.ndarray] | None = None,
                  batched: bool = False) -> AuditResult:
    """Audit one release: run it on both neighbours, project, bound epsilon.

    ``release0``/``release1`` take a generator and return one noisy output on D0/D1;
    ``clean0``/``clean1`` are the noiseless outputs (the same code with the noise off).
    ``transform`` maps raw outputs (trials, dim) to the coordinates in which the noise is
    i.i.d. (e.g. the upper triangle of a symmetric matrix, or a block divided by its clip).
    ``batched``: the releases take ``(rng, trials)`` and return every draw at once.
    """
    r0, r1 = rng.spawn(2)
    tr = transform or (lambda a: np.reshape(a, (len(a), -1)))
    out0 = tr(run_trials(release0, trials, r0, batched=batched))
    out1 = tr(run_trials(release1, trials, r1, batched=batched))
    c0, c1 = tr(np.ravel(clean0)[None]), tr(np.ravel(clean1)[None])
    lb, t = epsilon_lower_bound(projection_statistic(out0, c0, c1), projection_statistic(out1, c0, c1),
                                delta=delta, confidence=confidence)
    return AuditResult(name, float(claimed_epsilon), float(delta), lb, int(trials), float(confidence), t)
