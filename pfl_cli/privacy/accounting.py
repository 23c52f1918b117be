"""Epsilon of a dp_accounting event, and calibration of noise or steps to a target.

One accounting for every DP stage (thesis §6.5, "Evaluation Procedure": "strong
composition using Google's dp_accounting library"). Two accountants, named in a closed
registry: ``"rdp"`` (Renyi DP, dp_accounting's default orders; fast, an upper bound) and
``"pld"`` (privacy loss distributions, value discretization 1e-4; tighter, slower).

- :func:`compute_epsilon` -- epsilon of an event at a delta. Results are cached on
  (serialized event, delta, accountant, neighbouring), so repeated identical queries,
  e.g. inside a calibration or a parameter sweep, cost a dictionary look-up.
- :func:`calibrate_noise` -- the smallest noise multiplier whose epsilon is <= a target.
- :func:`max_steps` -- the largest number of steps whose epsilon is <= a target.

Both searches keep a bracket whose upper end is verified feasible and return a
verified-feasible value, so the answer's epsilon never exceeds the target.
"""

from __future__ import annotations

import functools
import math
import re
from dataclasses import dataclass
from typing import Callable

from dp_accounting import dp_event, pld, rdp
from dp_accounting.privacy_accountant import NeighboringRelation, UnsupportedEventError
from scipy import optimize

from pfl_cli.errors import InputError, PrivacyBudgetError, check_param
from pfl_cli.privacy.events import event_from_dict, event_key

from pfl_cli.privacy.choices import ACCOUNTANTS, NEIGHBORINGS  # noqa: E402,F401 - defined where a refusal reads it without dp_accounting

NEIGHBORING = {"add-remove": NeighboringRelation.ADD_OR_REMOVE_ONE, "replace": NeighboringRelation.REPLACE_ONE}
assert tuple(NEIGHBORING) == NEIGHBORINGS  # the light list a refusal checks against (pfl_cli.privacy.choices)

# Calibration search ranges. Noise multipliers below 1e-2 give PLDs with enormous supports
# and epsilons far beyond any meaningful budget; above 1e4 nothing useful is released.
from pfl_cli.privacy.choices import DEFAULT_MAX_NOISE, DEFAULT_MAX_STEPS, DEFAULT_MIN_NOISE  # noqa: E402,F401


@dataclass(frozen=True)
class NoiseCalibration:
    """Result of :func:`calibrate_noise`.

    ``epsilon <= target_epsilon`` always holds; ``at_lower_bound`` is true when even the
    smallest noise searched (``min_noise``) meets the target, so less noise may too.
    """

    noise_multiplier: float
    epsilon: float
    target_epsilon: float
    delta: float
    accountant: str
    neighboring: str
    event: dp_event.DpEvent
    evaluations: int
    at_lower_bound: bool = False


@dataclass(frozen=True)
class StepsCalibration:
    """Result of :func:`max_steps`; ``at_upper_bound`` when the search cap itself fits."""

    steps: int
    epsilon: float
    target_epsilon: float
    delta: float
    accountant: str
    neighboring: str
    event: dp_event.DpEvent
    evaluations: int
    at_upper_bound: bool = False


# ---------------------------------------------------------------------------- validation
def check_delta(delta: float) -> float:
    ok = isinstance(delta, (int, float)) and not isinstance(delta, bool) and 0 < delta < 1
    check_param("delta", ok, "must be in the open interval (0, 1)", delta)
    return float(delta)


def check_epsilon(epsilon: float) -> float:
    ok = isinstance(epsilon, (int, float)) and not isinstance(epsilon, bool)
    check_param("epsilon", ok and math.isfinite(epsilon) and epsilon > 0, "must be > 0", epsilon)
    return float(epsilon)


def check_accountant(accountant: str) -> str:
    check_param("accountant", accountant in ACCOUNTANTS, f"must be one of {', '.join(ACCOUNTANTS)}", accountant)
    return accountant


def check_neighboring(neighboring: str) -> str:
    check_param("neighboring", neighboring in NEIGHBORING, f"must be one of {', '.join(NEIGHBORING)}", neighboring)
    return neighboring


# ---------------------------------------------------------------------------- epsilon
def _make_accountant(accountant: str, neighboring: str):
    relation = NEIGHBORING[neighboring]
    if accountant == "rdp":
        return rdp.RdpAccountant(neighboring_relation=relation)
    return pld.PLDAccountant(neighboring_relation=relation)


def _unsupported(err: UnsupportedEventError, event: dp_event.DpEvent, accountant: str, neighboring: str) -> InputError:
    # dp_accounting's message repeats the whole event; keep only its reason.
    reason = re.search(r"Error: \[(.*)\] caused by subevent", str(err))
    why = reason.group(1) if reason else str(err)
    other = "pld" if accountant == "rdp" else "rdp"
    return InputError(
        f"the {accountant} accountant cannot account a {type(event).__name__} under {neighboring} neighbouring "
        f"({why.rstrip('.')}). Try --accountant {other} or the other --neighboring relation."
    )


@functools.lru_cache(maxsize=4096)
def _epsilon_cached(key: str, delta: float, accountant: str, neighboring: str) -> float:
    import json

    event = event_from_dict(json.loads(key))
    acc = _make_accountant(accountant, neighboring)
    try:
        acc.compose(event)
    except UnsupportedEventError as err:
        raise _unsupported(err, event, accountant, neighboring) from None
    return float(acc.get_epsilon(delta))


def compute_epsilon(
    event: dp_event.DpEvent, delta: float, *, accountant: str = "rdp", neighboring: str = "add-remove"
) -> float:
    """Epsilon of ``event`` at ``delta`` (cached).

    Parameters
    ----------
    event : dp_accounting.DpEvent
        What was released, e.g. :func:`~pfl_cli.privacy.events.sampled_gaussian_event`.
    delta : float
        Target delta, in (0, 1).
    accountant : {"rdp", "pld"}, default="rdp"
    neighboring : {"add-remove", "replace"}, default="add-remove"
        The neighbouring relation of the guarantee (thesis §2.4: add/remove one element).

    Returns
    -------
    float
        Epsilon; ``inf`` when the event contains a non-private release.

    Raises
    ------
    InputError
        Bad parameters, or an event the accountant cannot account (e.g. sampling
        without replacement under PLD).

    Examples
    --------
    >>> from dp_accounting import GaussianDpEvent
    >>> round(compute_epsilon(GaussianDpEvent(1.0), 1e-5, accountant="pld"), 3)
    4.377
    """
    if not isinstance(event, dp_event.DpEvent):
        raise TypeError(f"event must be a dp_accounting DpEvent; got {type(event).__name__}.")
    return _epsilon_cached(
        event_key(event), check_delta(delta), check_accountant(accountant), check_neighboring(neighboring)
    )


def cache_info():
    """Hit and miss counts of the epsilon cache (``functools.lru_cache`` statistics)."""
    return _epsilon_cached.cache_info()


def cache_clear() -> None:
    """Empty the epsilon cache (benchmarks time cold queries this way)."""
    _epsilon_cached.cache_clear()


# ---------------------------------------------------------------------------- calibration
def calibrate_noise(
    make_event: Callable[[float], dp_event.DpEvent],
    target_epsilon: float,
    delta: float,
    *,
    accountant: str = "rdp",
    neighboring: str = "add-remove",
    min_noise: float = DEFAULT_MIN_NOISE,
    max_noise: float = DEFAULT_MAX_NOISE,
    rtol: float = 1e-5,
) -> NoiseCalibration:
    """The smallest noise multiplier ``z`` with ``epsilon(make_event(z)) <= target_epsilon``.

    Epsilon decreases with the noise, so the search doubles (or halves) from ``z = 1``
    until it brackets the target, runs Brent's method inside the bracket, and returns a
    value whose epsilon it has checked to be <= the target (the bracket's feasible end
    if Brent's root is not).

    Parameters
    ----------
    make_event : callable
        ``z -> DpEvent``, e.g. ``lambda z: sampled_gaussian_event(z, 0.01, 1000)``.
    target_epsilon : float
        Target epsilon, > 0.
    delta : float
        Target delta, in (0, 1).
    accountant, neighboring : str
        As in :func:`compute_epsilon`.
    min_noise, max_noise : float, default=1e-2, 1e4
        The search bracket.
    rtol : float, default=1e-5
        Relative precision of the returned noise multiplier.

    Returns
    -------
    NoiseCalibration

    Raises
    ------
    PrivacyBudgetError
        When even ``max_noise`` gives an epsilon above the target.

    Examples
    --------
    >>> from pfl_cli.privacy.events import sampled_gaussian_event
    >>> cal = calibrate_noise(lambda z: sampled_gaussian_event(z, 0.01, 1000), 1.0, 1e-5)
    >>> round(cal.noise_multiplier, 3), cal.epsilon <= 1.0
    (1.513, True)
    """
    target = check_epsilon(target_epsilon)
    check_param("max noise", 0 < min_noise < max_noise, f"must be > min noise {min_noise}", max_noise)
    evaluations = 0

    def eps(z: float) -> float:
        nonlocal evaluations
        evaluations += 1
        return compute_epsilon(make_event(z), delta, accountant=accountant, neighboring=neighboring)

    def done(z: float, e: float, at_lower: bool = False) -> NoiseCalibration:
        return NoiseCalibration(z, e, target, float(delta), accountant, neighboring, make_event(z), evaluations, at_lower)

    # Bracket: eps(lo) > target >= eps(hi).
    hi = min(max(1.0, min_noise), max_noise)
    eps_hi = eps(hi)
    if eps_hi > target:
        lo = hi
        while eps_hi > target:
            if hi >= max_noise:
                raise PrivacyBudgetError(
                    f"no noise multiplier up to {max_noise:g} meets epsilon {target:g} at delta {delta:g} "
                    f"(epsilon at noise {max_noise:g} is {eps_hi:.4g}). Raise the epsilon or delta, lower the "
                    "steps or the sampling rate, or raise --max-noise."
                )
            lo, hi = hi, min(hi * 2, max_noise)
            eps_hi = eps(hi)
    else:
        lo = hi
        while True:
            if lo <= min_noise:
                return done(lo, eps(lo), at_lower=True)
            lo = max(lo / 2, min_noise)
            eps_lo = eps(lo)
            if eps_lo > target:
                break
            hi, eps_hi = lo, eps_lo
    root = optimize.brentq(lambda z: eps(z) - target, lo, hi, xtol=rtol * lo, rtol=rtol)
    # Brent guarantees a true root within xtol of `root`; one step up lands on the
    # feasible side. If discretization noise (PLD) defeats that, the bracket's verified
    # feasible end `hi` is the answer.
    for z in (root, root + rtol * root):
        if z < hi:
            e = eps(z)
            if e <= target:
                return done(z, e)
    return done(hi, eps_hi)


def max_steps(
    make_event: Callable[[int], dp_event.DpEvent],
    target_epsilon: float,
    delta: float,
    *,
    accountant: str = "rdp",
    neighboring: str = "add-remove",
    limit: int = DEFAULT_MAX_STEPS,
) -> StepsCalibration:
    """The largest number of steps ``T`` with ``epsilon(make_event(T)) <= target_epsilon``.

    Epsilon grows with the steps: the search doubles ``T`` until it no longer fits, then
    bisects on integers, so the answer ``T`` fits and ``T + 1`` does not (or ``T`` is
    ``limit``).

    Raises
    ------
    PrivacyBudgetError
        When not even one step meets the target.

    Examples
    --------
    >>> from pfl_cli.privacy.events import sampled_gaussian_event
    >>> res = max_steps(lambda t: sampled_gaussian_event(1.1, 0.01, t), 1.7118, 1e-5)
    >>> res.steps
    1000
    """
    target = check_epsilon(target_epsilon)
    check_param("max steps", isinstance(limit, int) and limit >= 1, "must be an integer >= 1", limit)
    evaluations = 0

    def eps(t: int) -> float:
        nonlocal evaluations
        evaluations += 1
        return compute_epsilon(make_event(t), delta, accountant=accountant, neighboring=neighboring)

    def done(t: int, e: float, at_upper: bool = False) -> StepsCalibration:
        return StepsCalibration(t, e, target, float(delta), accountant, neighboring, make_event(t), evaluations, at_upper)

    eps_one = eps(1)
    if eps_one > target:
        raise PrivacyBudgetError(
            f"not even one step meets epsilon {target:g} at delta {delta:g} (one step costs epsilon {eps_one:.4g}). "
            "Raise the noise multiplier or the epsilon, or lower the sampling rate."
        )
    lo, eps_lo, hi = 1, eps_one, 2
    while True:  # invariant: lo fits
        if hi >= limit:
            eps_limit = eps(limit)
            if eps_limit <= target:
                return done(limit, eps_limit, at_upper=True)
            hi = limit
            break
        e = eps(hi)
        if e > target:
            break
        lo, eps_lo, hi = hi, e, hi * 2
    while hi - lo > 1:  # invariant: lo fits, hi does not
        mid = (lo + hi) // 2
        e = eps(mid)
        if e <= target:
            lo, eps_lo = mid, e
        else:
            hi = mid
    return done(lo, eps_lo)
