"""The audit cases: every mechanism pflx uses to release data, on worst-case neighbours.

Each case builds two neighbouring inputs (D1 = D0 plus one privacy unit whose
contribution reaches the clipping bound, so the sensitivity is attained), runs the real
release function of pflx on both many times, and compares the empirical lower bound
(:mod:`pfl_cli.privacy.audit`) with the epsilon that the stage's ledger claims for that one
release at the case's delta (the events' epsilon by the PLD accountant).

=====================  =========================================================================
case                   release audited (pflx function)
=====================  =========================================================================
gaussian-sum           :func:`~pfl_cli.privacy.mechanisms.clipped_gaussian_sum`
laplace                :func:`~pfl_cli.privacy.mechanisms.laplace_noise` at :func:`laplace_scale`
dp-fedavg-step         :data:`DP_FEDAVG_STEP` (clipped sum of client updates + Gaussian, / q N)
mdm-init               :meth:`pfl_cli.mdm.dp.DPMechanism.noisy_init_sums` (Algorithm 5's sums)
mdm-round              :meth:`pfl_cli.mdm.dp.DPMechanism.release_round_sums` (one Algorithm 6 round)
feddp-init-outer       FedDP-Init step 1, ``outer_product_sum`` + symmetric Gaussian
feddp-init-weights     FedDP-Init step 2, ``nearest_server_counts`` + Laplace
feddp-init-sums        FedDP-Init step 3, ``cluster_sums_and_counts`` sums + Gaussian
feddp-init-counts      FedDP-Init step 3, counts + Laplace
feddp-lloyds-sums      one FedDP-Lloyds round, sums + Gaussian
feddp-lloyds-counts    one FedDP-Lloyds round, counts + Laplace
broken-gaussian-sum    the Gaussian sum with noise calibrated for HALF the true sensitivity:
                       the audit must refute its claim
=====================  =========================================================================

The FedDP cases take the noise scales from ``cluster.budget.plan_noise`` -- the plan whose
events go to ``privacy.json`` -- at data-point level with T = 1 Lloyd round and a total
epsilon of 6 (so that each release's own epsilon is large enough for the audit to bite).

This module sits above :mod:`pfl_cli.mdm` and :mod:`pfl_cli.cluster` (it imports them
inside functions); the tester itself (:mod:`pfl_cli.privacy.audit`) depends on nothing.
"""

from __future__ import annotations

import functools
from typing import Callable

import numpy as np

from pfl_cli.privacy.audit import AuditResult, audit_release
from pfl_cli.privacy.mechanisms import clip_l2, clipped_gaussian_sum, gaussian_sigma, laplace_noise, laplace_scale

DELTA = 1e-5
CONFIDENCE = 0.99   # a correct mechanism fails an audit with probability <= 1%
# Trials per neighbour: vectorized cases (every draw in one call) and cases that call the
# release once per trial. The fast tier smoke-tests every release; the slow tier is the audit.
FAST_TRIALS = {"batched": 200_000, "looped": 1_000}
SLOW_TRIALS = {"batched": 2_000_000, "looped": 60_000}
BATCHED = ("gaussian-sum", "laplace", "broken-gaussian-sum")


def _audit(*args, **kwargs) -> AuditResult:
    return audit_release(*args, confidence=CONFIDENCE, **kwargs)


def trials_for(name: str, tier: dict[str, int]) -> int:
    return tier["batched" if name in BATCHED else "looped"]


def dp_fedavg_step(updates: np.ndarray, *, clip: float, noise_multiplier: float, denominator: float,
                   rng: np.random.Generator) -> np.ndarray:
    """One DP-FedAvg server step's private part (McMahan et al. 2018, Alg. 1): clipped Gaussian sum / q N."""
    return clipped_gaussian_sum(updates, clip=clip, noise_multiplier=noise_multiplier, rng=rng) / denominator


def train_dp_fedavg_step(updates: np.ndarray, *, clip: float, noise_multiplier: float, denominator: float,
                         rng: np.random.Generator) -> np.ndarray:
    """The step `train --dp` runs (:func:`pfl_cli.fl.dp.audited_step`, torch), same signature."""
    from pfl_cli.fl.dp import audited_step

    return audited_step(updates, clip=clip, noise_multiplier=noise_multiplier, denominator=denominator, rng=rng)


# The release the "dp-fedavg-step" case audits: the code that trains.
DP_FEDAVG_STEP: Callable[..., np.ndarray] = train_dp_fedavg_step


def claimed_gaussian(noise_multiplier: float, delta: float = DELTA) -> float:
    """Epsilon at ``delta`` of one Gaussian release with this noise multiplier (PLD accountant)."""
    from dp_accounting import dp_event

    from pfl_cli.privacy import compute_epsilon

    return float(compute_epsilon(dp_event.GaussianDpEvent(noise_multiplier), delta, accountant="pld"))


def claimed_laplace(scale_over_sensitivity: float) -> float:
    return 1.0 / scale_over_sensitivity


def _rows(rng: np.random.Generator, n: int, d: int, norm: float) -> np.ndarray:
    x = rng.normal(size=(n, d))
    return x / np.linalg.norm(x, axis=1, keepdims=True) * rng.uniform(0.1, norm, size=(n, 1))


# ------------------------------------------------------------------------------ generic mechanisms
def _gaussian_sum(trials: int, rng: np.random.Generator, *, epsilon: float, calibrated_for: float,
                  name: str) -> AuditResult:
    clip = 1.0
    d0 = _rows(np.random.default_rng(1), 20, 5, 2.0)
    d1 = np.vstack([d0, np.r_[10.0, np.zeros(4)]])          # one more row, far outside the ball: clipped to C
    z = gaussian_sigma(epsilon, DELTA, calibrated_for * clip) / clip
    release = [lambda r, n, d=d: clipped_gaussian_sum(d, clip=clip, noise_multiplier=z, rng=r, draws=n)
               for d in (d0, d1)]
    clean = [clip_l2(d, clip, axis=1).sum(axis=0) for d in (d0, d1)]
    return _audit(name, *release, *clean, claimed_epsilon=epsilon, delta=DELTA, trials=trials, rng=rng,
                         batched=True)


def gaussian_sum(trials: int, rng: np.random.Generator, epsilon: float = 1.0) -> AuditResult:
    return _gaussian_sum(trials, rng, epsilon=epsilon, calibrated_for=1.0, name="gaussian-sum")


def broken_gaussian_sum(trials: int, rng: np.random.Generator, epsilon: float = 1.0) -> AuditResult:
    """Noise calibrated for sensitivity C/2 while one row moves the sum by C: the claim is false."""
    return _gaussian_sum(trials, rng, epsilon=epsilon, calibrated_for=0.5, name="broken-gaussian-sum")


def laplace(trials: int, rng: np.random.Generator, epsilon: float = 1.0) -> AuditResult:
    d0 = np.array([5.0, 0.0, 3.0, 7.0, 1.0, 0.0, 2.0, 4.0])
    d1 = d0 + np.eye(8)[2]                                  # one more unit in one cell: L1 sensitivity 1
    b = laplace_scale(epsilon, 1.0)
    release = [lambda r, n, d=d: d + laplace_noise((n, *d.shape), b, r) for d in (d0, d1)]
    return _audit("laplace", *release, d0, d1, claimed_epsilon=claimed_laplace(b), delta=0.0, trials=trials,
                         rng=rng, batched=True)


def dp_fedavg(trials: int, rng: np.random.Generator, noise_multiplier: float = 1.0) -> AuditResult:
    clip, cohort = 0.5, 30
    d0 = _rows(np.random.default_rng(2), cohort, 40, 1.0)     # client model updates
    d1 = np.vstack([d0, np.r_[3.0, np.zeros(39)]])
    step = DP_FEDAVG_STEP
    release = [lambda r, d=d: step(d, clip=clip, noise_multiplier=noise_multiplier, denominator=float(cohort), rng=r)
               for d in (d0, d1)]
    clean = [clip_l2(d, clip, axis=1).sum(axis=0) / cohort for d in (d0, d1)]
    return _audit("dp-fedavg-step", *release, *clean, claimed_epsilon=claimed_gaussian(noise_multiplier),
                         delta=DELTA, trials=trials, rng=rng)


# ------------------------------------------------------------------------------ MDM
def _mdm_setup(epsilon: float, rounds: int, clip: float | None):
    from pfl_cli.mdm.dp import make_dp
    from pfl_cli.mdm.model import integer_size_edges

    gen = np.random.default_rng(3)
    sizes = gen.integers(5, 21, size=30)
    d0 = np.stack([gen.multinomial(m, [0.4, 0.3, 0.2, 0.1]) for m in sizes])
    d1 = np.vstack([d0, [20, 0, 0, 0]])       # size M, all in one category: every block at norm 1
    dp = make_dp(epsilon, DELTA, clip=clip).bind(cohort_size=None, init_cohort_size=None, rounds=rounds, restarts=1,
                                                 max_samples=20)
    return d0, d1, dp, integer_size_edges(20)


def mdm_init(trials: int, rng: np.random.Generator, epsilon: float = 2.0) -> AuditResult:
    import dataclasses

    d0, d1, dp, edges = _mdm_setup(epsilon, 0, None)
    off = dataclasses.replace(dp, _noise_factor=0.0)

    def run(mech, counts, r):
        bins = np.searchsorted(edges, counts.sum(axis=1), side="right") - 1
        s = mech.noisy_init_sums(counts, bins, 1, len(edges) - 1, np.random.default_rng(0), r)
        return np.concatenate([s.e.ravel(), s.p.ravel(), s.q.ravel()])

    release = [lambda r, c=c: run(dp, c, r) for c in (d0, d1)]
    clean = [run(off, c, np.random.default_rng(0)) for c in (d0, d1)]
    return _audit("mdm-init", *release, *clean, claimed_epsilon=claimed_gaussian(dp.noise_multiplier),
                         delta=DELTA, trials=trials, rng=rng)


def mdm_round(trials: int, rng: np.random.Generator, epsilon: float = 3.0) -> AuditResult:
    import dataclasses

    from pfl_cli.mdm import _kernels as K
    from pfl_cli.mdm.model import MDMParams

    d0, d1, dp, edges = _mdm_setup(epsilon, 1, 5.0)
    off = dataclasses.replace(dp, _noise_factor=0.0)
    params = MDMParams(np.array([1.0]), np.array([[2.0, 1.5, 1.0, 0.5]]), np.full((1, 20), 0.05), edges)
    data = [K.encode(c) for c in (d0, d1)]

    def run(mech, x, r):
        e, scaled = mech.release_round_sums(x, params, r)
        return np.concatenate([e.ravel(), scaled / mech.clip])   # both blocks: unit sensitivity, equal noise

    release = [lambda r, x=x: run(dp, x, r) for x in data]
    clean = [run(off, x, np.random.default_rng(0)) for x in data]
    return _audit("mdm-round", *release, *clean, claimed_epsilon=claimed_gaussian(dp.noise_multiplier),
                         delta=DELTA, trials=trials, rng=rng)


# ------------------------------------------------------------------------------ FedDP-KMeans
@functools.lru_cache(maxsize=None)
def _feddp_setup(epsilon: float = 6.0):
    from pfl_cli.cluster import budget
    from pfl_cli.cluster.federated import ClientData

    radius = 4.0
    gen = np.random.default_rng(4)
    centres = np.array([[2.0, 0, 0, 0, 0], [-2.0, 1, 0, 0, 0], [0, -2.0, 1, 0, 0]])
    x0 = clip_l2(centres[gen.integers(0, 3, 150)] + 0.5 * gen.normal(size=(150, 5)), radius)
    x1 = np.vstack([x0, [radius, 0, 0, 0, 0]])       # one more point on the radius-Delta sphere
    data = [ClientData(x, np.arange(len(x) + 1)) for x in (x0, x1)]
    fractions = budget.resolve_fractions(None, "example", feddp_init=True, lloyds_steps=1)
    # composition="basic": per-step epsilons sum to the total (one accountant call, fast);
    # the audit checks each release against its own multiplier, whatever the split.
    plan = budget.plan_noise(epsilon, DELTA, fractions, budget.sensitivities("example", radius), lloyds_steps=1,
                             composition="basic")
    server = clip_l2(centres[gen.integers(0, 3, 40)] + 0.7 * gen.normal(size=(40, 5)), radius)
    return data, plan, server


def _triu(a: np.ndarray) -> np.ndarray:
    d = int(round(np.sqrt(a.shape[1])))
    rows, cols = np.triu_indices(d)
    return a.reshape(len(a), d, d)[:, rows, cols]


def _feddp_case(name: str, statistic, step: str, kind: str, trials: int, rng: np.random.Generator,
                transform=None) -> AuditResult:
    from pfl_cli.cluster.feddp_init import _release

    data, plan, server = _feddp_setup()
    scale = plan.scales[step]
    release = [lambda r, x=x: _release(statistic(x, server), scale, kind, r) for x in data]
    clean = [statistic(x, server) for x in data]
    mult = plan.info["noise_multipliers"][step]
    claim = claimed_gaussian(mult) if kind != "laplace" else claimed_laplace(mult)
    return _audit(name, *release, *clean, claimed_epsilon=claim, delta=DELTA if kind != "laplace" else 0.0,
                         trials=trials, rng=rng, transform=transform)


def _public_projection(data, server):
    from pfl_cli.cluster import federated
    from pfl_cli.cluster.feddp_init import server_projection

    projection = server_projection(federated.outer_product_sum(data[0]), 3)   # any public (released) projection
    return projection, server @ projection


def feddp_outer(trials: int, rng: np.random.Generator) -> AuditResult:
    from pfl_cli.cluster import federated

    return _feddp_case("feddp-init-outer", lambda x, q: federated.outer_product_sum(x), "outer", "symmetric", trials,
                       rng, transform=_triu)


def feddp_weights(trials: int, rng: np.random.Generator) -> AuditResult:
    from pfl_cli.cluster import federated

    data, _, server = _feddp_setup()
    projection, projected = _public_projection(data, server)
    return _feddp_case("feddp-init-weights", lambda x, q: federated.nearest_server_counts(x, projection, projected),
                       "weights", "laplace", trials, rng)


def _init_step3(which: int):
    from pfl_cli.cluster import federated

    data, _, server = _feddp_setup()
    projection, projected = _public_projection(data, server)
    xi = projected[:3]
    return lambda x, q: federated.cluster_sums_and_counts(x, xi, projection=projection)[which]


def feddp_sums(trials: int, rng: np.random.Generator) -> AuditResult:
    return _feddp_case("feddp-init-sums", _init_step3(0), "sums", "gaussian", trials, rng)


def feddp_counts(trials: int, rng: np.random.Generator) -> AuditResult:
    return _feddp_case("feddp-init-counts", _init_step3(1), "counts", "laplace", trials, rng)


def _lloyds(which: int):
    from pfl_cli.cluster import federated

    centers = np.array([[1.5, 0, 0, 0, 0], [-1.5, 1, 0, 0, 0], [0, -1.5, 1, 0, 0]])
    return lambda x, q: federated.cluster_sums_and_counts(x, centers)[which]


def feddp_lloyds_sums(trials: int, rng: np.random.Generator) -> AuditResult:
    return _feddp_case("feddp-lloyds-sums", _lloyds(0), "lloyds_sums", "gaussian", trials, rng)


def feddp_lloyds_counts(trials: int, rng: np.random.Generator) -> AuditResult:
    return _feddp_case("feddp-lloyds-counts", _lloyds(1), "lloyds_counts", "laplace", trials, rng)


CASES: dict[str, Callable[[int, np.random.Generator], AuditResult]] = {
    "gaussian-sum": gaussian_sum,
    "laplace": laplace,
    "dp-fedavg-step": dp_fedavg,
    "mdm-init": mdm_init,
    "mdm-round": mdm_round,
    "feddp-init-outer": feddp_outer,
    "feddp-init-weights": feddp_weights,
    "feddp-init-sums": feddp_sums,
    "feddp-init-counts": feddp_counts,
    "feddp-lloyds-sums": feddp_lloyds_sums,
    "feddp-lloyds-counts": feddp_lloyds_counts,
}
BROKEN: dict[str, Callable[[int, np.random.Generator], AuditResult]] = {"broken-gaussian-sum": broken_gaussian_sum}
