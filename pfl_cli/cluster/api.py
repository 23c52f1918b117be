"""The validated public entry point of the ``cluster`` stage: FedDP-KMeans.

>>> import numpy as np
>>> from pfl_cli.data.synthetic import GaussianMixtureSpec, client_points, server_points
>>> spec = GaussianMixtureSpec(d=20, k=3, num_clients=10, client_size=200)
>>> x, _, owner = client_points(spec)
>>> q, _ = server_points(spec)
>>> offsets = np.searchsorted(owner, np.arange(11))
>>> res = fit_feddp_kmeans(x, offsets, q, k=3, epsilon=1.0, rng=np.random.default_rng(0))
>>> res.centers.shape, res.epsilon <= 1.0
((3, 20), True)
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Callable, Optional, Sequence

import numpy as np

from pfl_cli.cluster import baselines, budget
from pfl_cli.cluster.federated import ClientData
from pfl_cli.cluster.feddp_init import feddp_init, weighted_server_costs
from pfl_cli.cluster.feddp_lloyds import feddp_lloyds
from pfl_cli.cluster.kmeans import kmeans, kmeans_cost, lloyd
from pfl_cli.cluster.config import DEFAULT_DELTA, INITS, ClusterConfig  # noqa: F401 - re-exported
from pfl_cli.errors import InputError, check_param
from pfl_cli.privacy import PrivacyLedger, UNITS, clip_l2  # noqa: F401


@dataclass(frozen=True)
class ClusterResult:
    """Result of :func:`fit_feddp_kmeans`.

    Attributes
    ----------
    centers : ndarray of shape (k, d)
        Final centers (after FedDP-Lloyds).
    init_centers : ndarray of shape (k, d)
        Centers before FedDP-Lloyds.
    epsilon : float or None
        Accounted total epsilon at ``delta`` (None without DP); always <= the target.
    ledger : PrivacyLedger or None
        One event per release, for ``privacy.json``.
    budget : dict
        Per-step nominal epsilons, sensitivities and noise scales.
    k_selection : dict or None
        ``{"k": [...], "weighted_cost": [...]}`` from the server's weighted data (Fig. D.5).
    """

    centers: np.ndarray
    init_centers: np.ndarray
    k: int
    init: str
    privacy_unit: str
    epsilon: Optional[float]
    delta: Optional[float]
    accountant: Optional[str]
    ledger: Optional[PrivacyLedger]
    radius: float
    clipped_fraction: float
    lloyds_steps: int
    projection_dim: Optional[int]
    server_points_kept: Optional[int]
    budget: dict = field(default_factory=dict)
    k_selection: Optional[dict] = None


def default_lloyds_steps(init: str) -> int:
    """0 for FedDP-Init (Tables D.4/D.5: most Pareto-optimal runs use none), 2 for DP baselines."""
    return 0 if init in ("feddp", "kfed") else 2


def progress_steps(init: str, lloyds_steps: int | None, k_candidates: Sequence[int] | None = None) -> int:
    """Steps :func:`fit_feddp_kmeans` reports: 3 FedDP-Init releases (Alg. 11) or 1 baseline init, 1 for
    the k-candidate costs (FedDP-Init only), 1 per FedDP-Lloyds round (Alg. 12; None: the default)."""
    feddp = init == "feddp"
    rounds = default_lloyds_steps(init) if lloyds_steps is None else int(lloyds_steps)
    return (3 if feddp else 1) + (1 if feddp and k_candidates else 0) + rounds


class _StepCounter:
    """``step(name)``: one protocol step done, reported as ``on_progress(done, total, {"step": name})``."""

    def __init__(self, on_progress: Callable[[int, int, dict], None] | None, total: int) -> None:
        self.on_progress, self.total, self.done = on_progress, total, 0

    def __call__(self, name: str) -> None:
        self.done += 1
        if self.on_progress is not None:
            self.on_progress(self.done, self.total, {"step": name})


def _check_choice(name: str, value: Any, choices: Sequence[str]) -> None:
    check_param(name, value in choices, f"must be one of {', '.join(choices)}", value)


def _validate(points, offsets, server, k, epsilon, delta, radius, privacy_unit, init, lloyds_steps,
              lloyds_calibration, composition, min_server_weight, k_candidates) -> None:
    check_param("client points", points.ndim == 2 and points.shape[0] >= 1,
                "must be a (n_points, d) array with at least one point", points.shape)
    check_param("client points", points.shape[1] >= 1, "must have at least one feature per point", points.shape,
                fix="The partition's dataset has no feature columns.")
    check_param("client points", bool(np.isfinite(points).all()), "must be finite", "NaN or inf values")
    check_param("client offsets", offsets.ndim == 1 and offsets[0] == 0 and offsets[-1] == len(points)
                and bool(np.all(np.diff(offsets) >= 0)), "must be CSR offsets over the client points",
                offsets[:3].tolist())
    check_param("server data", server.ndim == 2 and server.shape[0] >= 1, "must be a (n_server, d) array",
                server.shape)
    check_param("server data dimension", server.shape[1] == points.shape[1],
                f"must equal the client data dimension {points.shape[1]}", server.shape[1],
                fix="Use server data with the same features as the clients.")
    check_param("server data", bool(np.isfinite(server).all()), "must be finite", "NaN or inf values")
    ok_k = isinstance(k, (int, np.integer)) and not isinstance(k, bool) and k >= 1
    check_param("k", ok_k, "must be an integer >= 1", k)
    check_param("k", k <= server.shape[0], f"must be <= the number of server points ({server.shape[0]})", k,
                fix="Lower --k or add server data.")
    check_param("k", init not in ("feddp", "kfed") or k <= points.shape[1],
                f"must be <= the data dimension ({points.shape[1]}) for the rank-k projection", k)
    if epsilon is not None:
        ok = isinstance(epsilon, (int, float)) and not isinstance(epsilon, bool) and math.isfinite(epsilon)
        check_param("epsilon", ok and epsilon > 0, "must be a finite number > 0", epsilon,
                    fix="Pass --dp eps=E with E > 0, or --no-dp.")
    check_param("delta", isinstance(delta, (int, float)) and 0 < delta < 1, "must be in the open interval (0, 1)",
                delta)
    if radius is not None:
        check_param("radius", isinstance(radius, (int, float)) and math.isfinite(radius) and radius > 0,
                    "must be a finite number > 0", radius)
    _check_choice("privacy unit", privacy_unit, UNITS)
    _check_choice("init", init, INITS)
    check_param("init", not (init == "kfed" and epsilon is not None), "kfed is not private; use it with --no-dp",
                init)
    check_param("lloyds steps", isinstance(lloyds_steps, (int, np.integer)) and lloyds_steps >= 0,
                "must be an integer >= 0", lloyds_steps)
    _check_choice("lloyds calibration", lloyds_calibration, budget.LLOYDS_CALIBRATIONS)
    _check_choice("composition", composition, budget.COMPOSITIONS)
    check_param("min server weight", math.isfinite(min_server_weight) and min_server_weight >= 0,
                "must be a finite number >= 0", min_server_weight)
    for kc in k_candidates or ():
        check_param("k candidates", isinstance(kc, (int, np.integer)) and 1 <= kc <= server.shape[0],
                    f"must be integers in [1, {server.shape[0]}] (the number of server points)", kc)


def fit_feddp_kmeans(
    points: np.ndarray,
    offsets: np.ndarray,
    server: np.ndarray,
    *,
    k: int,
    epsilon: float | None = None,
    delta: float = DEFAULT_DELTA,
    privacy_unit: str = "example",
    radius: float | None = None,
    split: Sequence[float] | None = None,
    min_server_weight: float = 5.0,
    lloyds_steps: int | None = None,
    lloyds_calibration: str = "basic_text",
    composition: str = "pld",
    init: str = "feddp",
    client_clip: dict[str, float] | None = None,
    k_candidates: Sequence[int] | None = None,
    server_n_init: int = 10,
    gaussian_method: str = "analytic",
    rng: np.random.Generator,
    on_progress: Callable[[int, int, dict], None] | None = None,
    _noise_factor: float = 1.0,
) -> ClusterResult:
    """Differentially private federated k-means: FedDP-Init + FedDP-Lloyds (thesis ch. 6).

    Parameters
    ----------
    points : ndarray of shape (m, d)
        All clients' points, grouped by client.
    offsets : ndarray of shape (n_clients + 1,)
        Client i holds ``points[offsets[i]:offsets[i + 1]]``.
    server : ndarray of shape (n_server, d)
        The server's own (public, possibly out-of-distribution) data Q.
    k : int
        Number of clusters, <= n_server and <= d.
    epsilon : float or None, default=None
        Total privacy budget; None runs the non-private federated variant (no clipping, no noise).
    delta : float, default=1e-6
    privacy_unit : {"example", "client"}, default="example"
        Data-point-level (every point clipped to ``radius``) or client-level DP (each
        client's statistics clipped to ``client_clip`` bounds).
    radius : float, optional
        Delta, the bound on point norms; default the server data's radius max ||q||.
    split : sequence of float, optional
        Budget fractions (eps1, eps2, eps3G, eps3L[, eps4G, eps4L]); default Tables D.2/D.3.
    min_server_weight : float, default=5.0
        Server points with a smaller noisy weight are dropped before the server's k-means [C].
    lloyds_steps : int, optional
        T; default 0 for FedDP-Init (Tables D.4/D.5), 2 for the DP baselines.
    lloyds_calibration : {"basic_text", "pld_joint"}, default="basic_text"
    composition : {"pld", "basic"}, default="pld"
        ``pld``: scale the split so the PLD-accounted total meets ``epsilon``;
        ``basic``: per-step epsilons sum to ``epsilon`` (Theorem 5).
    init : {"feddp", "server-kmeans++", "server-lloyds", "sphere-packing", "random", "kfed"}
    client_clip : dict, optional
        Client-level bounds by step (``outer``, ``weights``, ``sums``, ``counts``,
        ``lloyds_sums``, ``lloyds_counts``); defaults scale the authors' config with ``radius``.
    k_candidates : sequence of int, optional
        Also report W(k) of the server's weighted k-means for these k (Fig. D.5). It is
        post-processing of the releases the centers already use -- the same rank-k
        projection and the same noisy server weights -- so it costs no privacy and does
        not change the released centers.
    server_n_init : int, default=10
        Restarts of the server's weighted k-means.
    gaussian_method : {"analytic", "classic"}, default="analytic"
    rng : numpy.random.Generator
    on_progress : callable(done, total, status), optional
        Called after each protocol step (:func:`progress_steps` in all: FedDP-Init's three
        releases or the baseline's init, the k-candidate costs, each FedDP-Lloyds round) with
        ``status`` = ``{"step": name}``: public facts only, nothing computed from client data.
    _noise_factor : float, default=1.0
        Testing hook: scales every calibrated noise scale (0 = noise off through the DP
        code path, which is NOT private; the ledger still records the calibrated plan).

    Returns
    -------
    ClusterResult

    Raises
    ------
    InputError
        Any parameter out of range, dimensions that differ, k above the number of server points.
    """
    points = np.asarray(points, dtype=np.float64)
    offsets = np.asarray(offsets, dtype=np.int64)
    server = np.asarray(server, dtype=np.float64)
    T = default_lloyds_steps(init) if lloyds_steps is None else lloyds_steps
    _validate(points, offsets, server, k, epsilon, delta, radius, privacy_unit, init, T, lloyds_calibration,
              composition, min_server_weight, k_candidates)
    server_radius = float(np.linalg.norm(server, axis=1).max())
    if radius is None:
        check_param("radius", server_radius > 0, "must be > 0 (the server data's radius is the default)",
                    server_radius, fix="Pass --radius R.")
    delta_radius = float(radius if radius is not None else server_radius)
    dp = epsilon is not None
    feddp = init == "feddp"

    plan = clip = None
    if dp:
        plan, clip = _plan_noise(epsilon, delta, split, privacy_unit, delta_radius, client_clip, feddp=feddp,
                                 lloyds_steps=T, lloyds_calibration=lloyds_calibration, composition=composition,
                                 gaussian_method=gaussian_method)
        # Data-point clipping (thesis §6.5.1): every point to norm <= Delta before any computation.
        norms = np.linalg.norm(points, axis=1)
        clipped_fraction = float(np.mean(norms > delta_radius))
        points = clip_l2(points, delta_radius)
    else:
        clipped_fraction = 0.0
    scales = {s: v * _noise_factor for s, v in plan.scales.items()} if plan else {s: 0.0 for s in budget.STEPS}
    data = ClientData(points, offsets)
    init_rng, lloyds_rng = rng.spawn(2)
    total = progress_steps(init, T, k_candidates)
    step = _StepCounter(on_progress, total)

    init_centers, projection_dim, kept, k_selection = _initial_centers(
        data, server, k, init=init, scales=scales, clip=clip, min_server_weight=min_server_weight,
        server_n_init=server_n_init, k_candidates=k_candidates, rng=init_rng, step=step)
    if dp:  # post-processing: every point lies in the Delta-ball, so its centers may too
        init_centers = clip_l2(init_centers, delta_radius)

    centers = feddp_lloyds(
        data, init_centers, steps=T, sums_scale=scales["lloyds_sums"], counts_scale=scales["lloyds_counts"],
        clip_sums=clip["lloyds_sums"] if clip else None, clip_counts=clip["lloyds_counts"] if clip else None,
        rng=lloyds_rng, on_step=step,
    )
    if dp and T > 0:
        centers = clip_l2(centers, delta_radius)

    ledger, info = (None, {}) if plan is None else _ledger(
        plan, privacy_unit, delta, k_selection=bool(k_selection), composition=composition,
        lloyds_calibration=lloyds_calibration, gaussian_method=gaussian_method)
    return ClusterResult(
        centers=centers, init_centers=np.asarray(init_centers), k=int(k), init=init, privacy_unit=privacy_unit,
        epsilon=plan.epsilon if plan else None, delta=float(delta) if dp else None,
        accountant=plan.accountant if plan else None, ledger=ledger, radius=delta_radius,
        clipped_fraction=clipped_fraction, lloyds_steps=int(T), projection_dim=projection_dim,
        server_points_kept=kept, budget=info, k_selection=k_selection,
    )



def _plan_noise(epsilon, delta, split, privacy_unit, delta_radius, client_clip, *, feddp, lloyds_steps,
                lloyds_calibration, composition, gaussian_method):
    """The calibrated noise plan of every release, and the client-level clip bounds (None for example-level)."""
    fractions = budget.resolve_fractions(None if split is None else tuple(split), privacy_unit,
                                         feddp_init=feddp, lloyds_steps=lloyds_steps)
    sens = budget.sensitivities(privacy_unit, delta_radius, client_clip)
    plan = budget.plan_noise(epsilon, delta, fractions, sens, lloyds_steps=lloyds_steps,
                             lloyds_calibration=lloyds_calibration, composition=composition,
                             gaussian_method=gaussian_method)
    if plan.epsilon > epsilon:  # plan_noise verifies this; a guard against accountant drift
        raise InputError(f"accounted epsilon {plan.epsilon:.6g} exceeds the budget {epsilon:g}.")
    return plan, (sens if privacy_unit == "client" else None)


def _initial_centers(data, server, k, *, init, scales, clip, min_server_weight, server_n_init, k_candidates, rng,
                     step):
    """The initial centers: FedDP-Init (thesis Alg. 11) or a baseline, with FedDP-Init's k-candidate costs.

    Returns ``(centers, projection_dim, server points kept, k_selection)``; the last three are None
    for the baselines.
    """
    if init == "kfed":
        centers = baselines.kfed(data, k, rng=rng)
        step("k-FED init")
        return centers, None, None, None
    if init != "feddp":
        centers = baselines.server_init(init, server, k, rng=rng)
        step(f"{init} init")
        return centers, None, None, None
    projection_dim = k  # k_candidates reuse this projection: the released centers never depend on them
    out = feddp_init(data, server, k, scales=scales, clip=clip, projection_dim=projection_dim,
                     min_weight=min_server_weight, rng=rng, n_init=server_n_init, on_step=step)
    k_selection = None
    if k_candidates:
        ks = sorted(set(int(c) for c in k_candidates))
        costs = weighted_server_costs(out.projected_server, out.noisy_weights, ks, min_weight=min_server_weight,
                                      rng=rng, n_init=server_n_init)
        k_selection = {"k": ks, "weighted_cost": costs, "projection_dim": projection_dim}
        step("k candidates: server costs")
    return out.centers, projection_dim, int(out.server_kept.sum()), k_selection


def _ledger(plan, privacy_unit, delta, *, k_selection: bool, **calibration):
    """The privacy ledger of a DP run and the budget's record (``ClusterResult.budget``); ``calibration``:
    the composition, Lloyd calibration and Gaussian method the plan was made with."""
    notes = tuple(plan.notes)
    if k_selection:
        notes += ("k selection (--k-candidates): weighted k-means of the projected server data with the released "
                  "noisy weights and the same rank-k projection as the centers; post-processing, no privacy cost",)
    ledger = PrivacyLedger(privacy_unit, float(delta), plan.events, notes=notes)
    info = {"epsilons": plan.epsilons, "noise_scales": plan.scales, "sensitivities": plan.sensitivities,
            "nominal_scale": plan.nominal_scale, **calibration}
    return ledger, info

def evaluate_clustering(
    points: np.ndarray, centers: np.ndarray, *, rng: np.random.Generator, reference_n_init: int = 2,
    init_centers: np.ndarray | None = None,
) -> dict[str, float]:
    """k-means cost of ``centers`` on the clients' data, and the non-private centralized reference.

    ``normalized_cost`` = cost / number of client points (the thesis's metric, §6.5);
    ``centralized_kmeans_cost`` is k-means on all client data pooled (the "Optimal"
    baseline): the best of ``reference_n_init`` k-means++ + Lloyd runs and of Lloyd's
    started from ``centers``, so it never exceeds ``kmeans_cost``.
    """
    points = np.asarray(points, dtype=np.float64)
    m = len(points)
    cost = kmeans_cost(points, centers)
    ref = lloyd(points, centers)
    if reference_n_init > 0:
        other = kmeans(points, len(centers), rng=rng, n_init=reference_n_init)
        ref = other if other.cost < ref.cost else ref
    out = {
        "kmeans_cost": cost,
        "normalized_cost": cost / m,
        "centralized_kmeans_cost": ref.cost,
        "centralized_normalized_cost": ref.cost / m,
        "relative_gap": cost / ref.cost - 1.0 if ref.cost > 0 else 0.0,
        "num_points": m,
    }
    if init_centers is not None:
        out["init_normalized_cost"] = kmeans_cost(points, init_centers) / m
    return out
