"""Privacy budget of FedDP-KMeans: the split over steps, sensitivities and noise scales.

Six releases can spend budget (thesis §6.3, Algorithms 11 and 12), in this order::

    outer          FedDP-Init step 1: sum of outer products      Gaussian, symmetric
    weights        FedDP-Init step 2: server-point weights       Laplace
    sums           FedDP-Init step 3: per-cluster sums / means   Gaussian
    counts         FedDP-Init step 3: per-cluster counts         Laplace
    lloyds_sums    FedDP-Lloyds, T rounds of per-cluster sums    Gaussian
    lloyds_counts  FedDP-Lloyds, T rounds of per-cluster counts  Laplace

Default splits are the thesis's rules of thumb (App. D.8.1, mean of the Pareto-optimal runs
of Tables D.2 / D.3): data-point level [0.2, 0.2, 0.45, 0.15], client level
[0.35, 0.1, 0.45, 0.1] of the initialization budget. When FedDP-Lloyds runs (T >= 1) it
gets half of the budget, split evenly between sums and counts (the authors' code default
split 0.5 [C]); server-only initializations spend nothing, so FedDP-Lloyds gets it all.

:func:`plan_noise` turns a target total epsilon into noise scales. With
``composition="pld"`` (default) the nominal per-step epsilons are scaled up until the
epsilon of all events composed by the accountant (PLD at ``delta``, as the thesis's
figures account) meets the target, never exceeding it; ``composition="basic"`` keeps the
nominal epsilons summing to the target (Theorem 5).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from dp_accounting import dp_event

from pfl_cli.errors import check_param
from pfl_cli.privacy import (
    calibrate_noise,
    compute_epsilon,
    gaussian_sigma,
    laplace_event,
    sampled_gaussian_event,
)

STEPS = ("outer", "weights", "sums", "counts", "lloyds_sums", "lloyds_counts")
GAUSSIAN_STEPS = ("outer", "sums", "lloyds_sums")
SPLITS = {
    "example": (0.2, 0.2, 0.45, 0.15),  # Table D.2 rule of thumb
    "client": (0.35, 0.1, 0.45, 0.1),  # Table D.3 rule of thumb
}
LLOYDS_FRACTION = 0.5  # share of the budget FedDP-Lloyds gets after FedDP-Init, when T >= 1
from pfl_cli.cluster.config import COMPOSITIONS, LLOYDS_CALIBRATIONS  # noqa: E402,F401 - re-exported
PLD_MAX_EPSILON = 10.0  # above this the PLD's support gets too large to compute quickly: RDP answers

# Client-level clipping bounds of the authors' Gaussian-mixture config [C], for data radius 11.
_CLIENT_BOUNDS_AT_11 = {"outer": 1500.0, "weights": 1.0, "sums": 21.0, "counts": 10.0,
                        "lloyds_sums": 120.0, "lloyds_counts": 50.0}
_REFERENCE_RADIUS = 11.0
_NOTES = {
    "outer": "FedDP-Init step 1: sum of outer products, symmetric Gaussian",
    "weights": "FedDP-Init step 2: server-point weights, Laplace",
    "sums": "FedDP-Init step 3: per-cluster sums (client level: means), Gaussian",
    "counts": "FedDP-Init step 3: per-cluster counts (client level: indicators), Laplace",
    "lloyds_sums": "FedDP-Lloyds: per-cluster sums over {T} rounds, Gaussian",
    "lloyds_counts": "FedDP-Lloyds: per-cluster counts over {T} rounds, Laplace",
}


def default_fractions(unit: str, *, feddp_init: bool, lloyds_steps: int) -> tuple[float, ...]:
    """The six budget fractions (summing to 1) used when ``--split`` is not given."""
    init = SPLITS[unit] if feddp_init else (0.0, 0.0, 0.0, 0.0)
    if lloyds_steps == 0:
        return (*init, 0.0, 0.0)
    if not feddp_init:
        return (*init, 0.5, 0.5)
    keep = 1.0 - LLOYDS_FRACTION
    return (*(f * keep for f in init), LLOYDS_FRACTION / 2, LLOYDS_FRACTION / 2)


def resolve_fractions(
    split: tuple[float, ...] | None, unit: str, *, feddp_init: bool, lloyds_steps: int
) -> tuple[float, ...]:
    """Validate ``--split`` (4 init fractions, or all 6) and normalize it to sum to 1.

    With 4 numbers FedDP-Lloyds keeps its default share (:data:`LLOYDS_FRACTION`).
    """
    if split is None:
        return default_fractions(unit, feddp_init=feddp_init, lloyds_steps=lloyds_steps)
    values = tuple(float(v) for v in split)
    check_param("split", len(values) in (4, 6), "must hold 4 (eps1,eps2,eps3G,eps3L) or 6 (+eps4G,eps4L) numbers",
                list(values))
    check_param("split", all(math.isfinite(v) and v >= 0 for v in values), "must hold numbers >= 0", list(values))
    check_param("split", feddp_init, "applies to --init feddp only (server-only inits spend all on FedDP-Lloyds)",
                list(values))
    check_param("split", all(v > 0 for v in values[:4]), "must give every FedDP-Init step a share > 0", list(values))
    if len(values) == 4:
        keep = 1.0 if lloyds_steps == 0 else 1.0 - LLOYDS_FRACTION
        init = tuple(v / sum(values) * keep for v in values)
        lloyds = (0.0, 0.0) if lloyds_steps == 0 else (LLOYDS_FRACTION / 2, LLOYDS_FRACTION / 2)
        return init + lloyds
    lloyds_ok = (values[4] > 0 and values[5] > 0) if lloyds_steps > 0 else (values[4] == values[5] == 0)
    check_param("split", lloyds_ok, "must give both FedDP-Lloyds shares > 0 when --lloyds-steps > 0, else 0",
                list(values))
    return tuple(v / sum(values) for v in values)


def sensitivities(unit: str, radius: float, clip: dict[str, float] | None = None) -> dict[str, float]:
    """Sensitivity of each release (L2 for Gaussian steps, L1 for Laplace steps).

    Data-point level (thesis §6.5.1, every point clipped to ``radius`` = Delta): Delta^2
    for the outer products, Delta for sums, 1 for counts and weights. Client level (D.7.4):
    the clipping bounds of each client's statistic; defaults are the authors' Gaussian
    configuration [C] (1500, 1, 21, 10, 120, 50 at Delta = 11) rescaled to ``radius``
    (Delta^2 for the outer products, Delta for sums and means).
    """
    if unit == "example":
        return {"outer": radius**2, "weights": 1.0, "sums": radius, "counts": 1.0,
                "lloyds_sums": radius, "lloyds_counts": 1.0}
    scale = radius / _REFERENCE_RADIUS
    bounds = dict(_CLIENT_BOUNDS_AT_11)
    for name in ("sums", "lloyds_sums"):
        bounds[name] *= scale
    bounds["outer"] *= scale**2
    for name, value in (clip or {}).items():
        check_param("client clip", name in bounds, f"keys must be among {', '.join(STEPS)}", name)
        check_param(f"client clip {name}", math.isfinite(value) and value > 0, "must be > 0", value)
        bounds[name] = float(value)
    return bounds


@dataclass(frozen=True)
class NoisePlan:
    """Noise of every release and the events that account for it.

    ``scales[step]`` is the Gaussian standard deviation or the Laplace scale of one
    release (per round for FedDP-Lloyds), already multiplied by the step's sensitivity;
    0 for steps that are not run. ``epsilons`` are the nominal per-step epsilons.
    """

    epsilon: float
    delta: float
    accountant: str
    scales: dict[str, float]
    epsilons: dict[str, float]
    sensitivities: dict[str, float]
    lloyds_steps: int
    events: tuple = ()
    notes: tuple = ()
    nominal_scale: float = 1.0
    info: dict = field(default_factory=dict)


def _mechanisms(eps: dict[str, float], delta: float, T: int, lloyds_calibration: str, method: str):
    """Noise multipliers (noise / sensitivity) and events of each step with budget ``eps``."""
    mult, events = {}, {}
    for step in ("outer", "sums"):
        if eps[step] > 0:
            mult[step] = gaussian_sigma(eps[step], delta, 1.0, method=method)
            events[step] = dp_event.GaussianDpEvent(mult[step])
    for step in ("weights", "counts"):
        if eps[step] > 0:
            mult[step] = 1.0 / eps[step]
            events[step] = dp_event.LaplaceDpEvent(mult[step])
    if T > 0:
        if lloyds_calibration == "basic_text":
            # Text version of Alg. 12 (L1185): each round (eps4G/T, delta/T) and Lap(T/eps4L).
            mult["lloyds_sums"] = gaussian_sigma(eps["lloyds_sums"] / T, delta / T, 1.0, method=method)
            mult["lloyds_counts"] = T / eps["lloyds_counts"]
        else:  # pld_joint [C]: the T rounds calibrated together by the PLD accountant
            mult["lloyds_sums"] = calibrate_noise(lambda z: sampled_gaussian_event(z, 1.0, T), eps["lloyds_sums"],
                                                  delta, accountant="pld", rtol=1e-4).noise_multiplier
            mult["lloyds_counts"] = calibrate_noise(lambda b: laplace_event(b, T), eps["lloyds_counts"], delta,
                                                    accountant="pld", rtol=1e-4).noise_multiplier
        events["lloyds_sums"] = sampled_gaussian_event(mult["lloyds_sums"], 1.0, T)
        events["lloyds_counts"] = laplace_event(mult["lloyds_counts"], T)
    return mult, events


def plan_noise(
    epsilon: float,
    delta: float,
    fractions: tuple[float, ...],
    sens: dict[str, float],
    *,
    lloyds_steps: int,
    lloyds_calibration: str = "basic_text",
    composition: str = "pld",
    gaussian_method: str = "analytic",
    neighboring: str = "add-remove",
) -> NoisePlan:
    """Noise scales for a total budget ``(epsilon, delta)`` split by ``fractions``.

    The accounted epsilon of the returned plan (PLD at ``delta``; RDP above
    :data:`PLD_MAX_EPSILON`) is verified to be <= ``epsilon``.
    """
    accountant = "pld" if epsilon <= PLD_MAX_EPSILON else "rdp"
    T = lloyds_steps

    def build(s: float):
        eps = {step: s * f * epsilon for step, f in zip(STEPS, fractions)}
        mult, events = _mechanisms(eps, delta, T, lloyds_calibration, gaussian_method)
        ordered = tuple(events[step] for step in STEPS if step in events)
        total = compute_epsilon(dp_event.ComposedDpEvent(list(ordered)), delta, accountant=accountant,
                                neighboring=neighboring)
        return eps, mult, events, total

    s = 1.0
    best = None
    for _ in range(40):  # shrink until feasible (nominal budgets are feasible in practice: 1 round)
        eps, mult, events, total = build(s)
        if total <= epsilon:
            best = (s, eps, mult, events, total)
            break
        s *= epsilon / total * 0.999
    if best is None:  # pragma: no cover - accountant inconsistency
        raise ValueError(f"could not fit the releases into epsilon {epsilon}.")
    if composition == "pld":
        # epsilon(s) is close to linear in s: a few ratio steps land just below the target.
        for _ in range(8):
            if best[4] >= epsilon * 0.997:
                break
            s_try = best[0] * (epsilon / best[4]) * (1 - 5e-4)
            eps, mult, events, total = build(s_try)
            if total <= epsilon and s_try > best[0]:
                best = (s_try, eps, mult, events, total)
            else:
                s_try = best[0] + 0.5 * (s_try - best[0])
                eps, mult, events, total = build(s_try)
                if total <= epsilon and s_try > best[0]:
                    best = (s_try, eps, mult, events, total)
    s, eps, mult, events, total = best
    scales = {step: mult[step] * sens[step] if step in mult else 0.0 for step in STEPS}
    notes = tuple(_NOTES[step].format(T=T) for step in STEPS if step in events)
    return NoisePlan(
        epsilon=float(total), delta=float(delta), accountant=accountant, scales=scales, epsilons=eps,
        sensitivities=dict(sens), lloyds_steps=T, events=tuple(events[step] for step in STEPS if step in events),
        notes=notes, nominal_scale=float(s), info={"noise_multipliers": mult},
    )
