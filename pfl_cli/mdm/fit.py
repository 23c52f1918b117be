"""Algorithm 6: Dirichlet-Multinomial Mixture MLE by generalized EM (thesis §3.3.2-3.3.3).

Per round the server samples a cohort S, each client ``i`` in it computes from the
current ``(tau, Pi, A)`` its responsibilities ``w^i`` (line 6), ``E^i`` (line 7),
``u^i`` (Eq. 3.13) and ``v^i`` (Eq. 3.14), and the server, which sees only their sums,
updates

    tau = omega / |S|              (Eq. 3.17)
    pi_k = E_k / omega_k           (Eq. 3.18)
    alpha_k = alpha_k * u_k / v_k  (Eq. 3.19)

With the cohort equal to all clients this is the full-batch iteration of Theorem 1, a
generalized EM step: the log-likelihood (Eq. 3.4) never decreases. The kernels in
:mod:`pfl_cli.mdm._kernels` compute the sums for all clients at once; :func:`server_update`
uses nothing but them.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np

from pfl_cli.errors import InfeasibleError, InputError, PflxWarning, check_param
from pfl_cli.mdm import _kernels as K
from pfl_cli.mdm.dp import cap_client_sizes
from pfl_cli.mdm.init import MOMENT_CATEGORIES, init_client_sums, init_from_sums
from pfl_cli.mdm.model import ALPHA_FLOOR, TAU_FLOOR, MDMParams, binned_size_edges, integer_size_edges

OMEGA_MIN = 1e-8  # an (almost) empty component keeps its previous alpha and pi (a guard of pflx; thesis Algorithm 6 divides by omega_k)


@dataclass(frozen=True)
class MDMFit:
    """Result of :func:`fit_mdm`.

    Attributes
    ----------
    params : MDMParams
        The best restart's parameters.
    log_likelihood : float
        Eq. (3.4) on all fitted clients at ``params``.
    num_clients : int
        Clients fitted (clients with zero samples are skipped).
    num_skipped : int
        Clients skipped because they hold no sample.
    restart_log_likelihoods : tuple of float
        Final log-likelihood of each restart; ``best_restart`` indexes it.
    trace : tuple of (restart, round, clients, log_likelihood)
        Round ``t`` holds the log-likelihood of that round's cohort at the parameters
        before update ``t``; round ``rounds`` is the final value on all clients.
    history : tuple of MDMParams or None
        The best restart's parameters after init and after every round (``keep_history``).
    privacy : PrivacyLedger or None
        What a DP fit released.
    """

    params: MDMParams
    log_likelihood: float
    num_clients: int
    num_skipped: int
    rounds: int
    cohort_size: int
    restart_log_likelihoods: tuple
    best_restart: int
    trace: tuple
    history: tuple | None = None
    privacy: Any = None
    dp_info: dict | None = None

    @property
    def mean_log_likelihood(self) -> float:
        return self.log_likelihood / max(self.num_clients, 1)


# ---------------------------------------------------------------------------- validation
def check_counts(counts: Any, *, name: str = "counts", private: bool = False) -> tuple[np.ndarray, np.ndarray]:
    """Validate client histograms; return the non-empty rows (int64) and the empty-row mask.

    Raises ``InputError`` for a non-2-D, non-finite, negative or non-integer input; rows
    with zero samples are dropped with a :class:`~pfl_cli.errors.PflxWarning` that counts
    them, unless ``private`` (a DP fit prints no exact count).
    """
    try:
        arr = np.asarray(counts)
    except (TypeError, ValueError) as err:
        raise InputError(f"{name} must be a numeric matrix (clients x categories); {err}.") from None
    if arr.ndim != 2 or arr.shape[1] < 1:
        raise InputError(f"{name} must be a 2-D matrix, one row per client and one column per category; got shape {arr.shape}.")
    if arr.dtype.kind not in "biuf":
        raise InputError(f"{name} must hold numbers; got dtype {arr.dtype}.")
    if arr.dtype.kind == "f":
        if not np.all(np.isfinite(arr)):
            raise InputError(f"{name} must be finite; found NaN or infinite entries.")
        frac = arr != np.round(arr)
        if frac.any():
            i, j = map(int, np.argwhere(frac)[0])
            raise InputError(f"{name} must hold whole counts; got {arr[i, j].item()!r} at client {i}, category {j}.")
    if arr.size and arr.min() < 0:
        i, j = map(int, np.argwhere(arr < 0)[0])
        raise InputError(f"{name} must be >= 0; got {arr[i, j].item()!r} at client {i}, category {j}.")
    arr = arr.astype(np.int64)
    empty = arr.sum(axis=1) == 0
    if empty.any():
        what = "clients with zero samples" if private else f"{int(empty.sum())} of {len(arr)} clients with zero samples"
        warnings.warn(f"skipped {what} (they carry no histogram).", PflxWarning, stacklevel=3)
    return arr[~empty], empty


def _check_int(name: str, value: Any, low: int) -> int:
    ok = isinstance(value, (int, np.integer)) and not isinstance(value, bool)
    check_param(name, ok and value >= low, f"must be an integer >= {low}", value)
    return int(value)


def size_edges_for(sizes: np.ndarray, *, max_samples: int | None, sample_bins: int | None) -> np.ndarray:
    """Size-bin edges: one bin per integer ``1..M`` or ``sample_bins`` bins (M = max size by default)."""
    top = int(sizes.max())
    if max_samples is None:
        max_samples = top
    _check_int("max_samples", max_samples, 1)
    if top > max_samples:
        raise InputError(f"max_samples must be >= every client's size; got {max_samples}, and a client has {top} samples.")
    if sample_bins is None:
        return integer_size_edges(max_samples)
    _check_int("sample_bins", sample_bins, 1)
    return binned_size_edges(max_samples, sample_bins)


# ---------------------------------------------------------------------------- server side
def server_update(sums: K.SummedStatistics, params: MDMParams) -> MDMParams:
    """The server's update from summed client statistics (Alg. 6 lines 13-15, Eqs. 3.17-3.19).

    Guards (pflx's, around thesis Algorithm 6): a component with ``omega_k < 1e-8`` keeps its previous
    ``alpha_k`` and ``pi_k``; ``alpha`` is floored at 1e-6 and ``tau`` at 1e-12, then
    renormalized. Noisy (DP) sums are clamped at 0 first, so no NaN can come out.
    """
    omega = np.maximum(np.nan_to_num(sums.omega), 0.0)
    e = np.maximum(np.nan_to_num(sums.e), 0.0)
    u = np.maximum(np.nan_to_num(sums.u), 0.0)
    v = np.nan_to_num(sums.v)
    tau = np.maximum(omega / max(sums.cohort_size, 1), TAU_FLOOR)            # Eq. (3.17)
    tau = tau / tau.sum()
    e_tot = e.sum(axis=1)
    live = (omega >= OMEGA_MIN) & (e_tot > 0) & (v > 0)
    pi = params.size_probs.copy()
    pi[live] = e[live] / e_tot[live, None]                                   # Eq. (3.18); E_k sums to omega_k
    alpha = params.alpha.copy()
    with np.errstate(divide="ignore", invalid="ignore"):
        new = params.alpha[live] * u[live] / v[live, None]                   # Eq. (3.19)
    alpha[live] = np.where(np.isfinite(new), np.maximum(new, ALPHA_FLOOR), params.alpha[live])
    return MDMParams(tau=tau, alpha=alpha, size_probs=pi, size_edges=params.size_edges)


# ---------------------------------------------------------------------------- the fit
def fit_mdm(
    counts: np.ndarray,
    *,
    num_components: int,
    rng: np.random.Generator,
    rounds: int = 100,
    cohort_size: int | None = None,
    init_cohort_size: int | None = None,
    restarts: int = 1,
    max_samples: int | None = None,
    sample_bins: int | None = None,
    moment_category: str = "argmax",
    keep_history: bool = False,
    dp: Any = None,
    on_progress: Callable[[int, int, dict], None] | None = None,
) -> MDMFit:
    """Fit an MDM to client histograms: Algorithm 5, then ``rounds`` rounds of Algorithm 6.

    Parameters
    ----------
    counts : array_like of shape (n_clients, C)
        One histogram per client (non-negative integers). Rows with zero samples are
        skipped with a warning.
    num_components : int
        K, >= 1 and <= the number of non-empty clients.
    rng : numpy.random.Generator
        The only source of randomness (component draws, cohorts, restarts, DP noise).
    rounds : int, default=100
        T, the rounds of Algorithm 6 (the thesis's synthetic experiments use 100).
    cohort_size : int, optional
        Clients per round; default all clients: the full-batch iteration of Theorem 1.
    init_cohort_size : int, optional
        Clients of Algorithm 5's cohort; default ``cohort_size``.
    restarts : int, default=1
        Independent initializations; the one with the highest final log-likelihood wins
        (the objective is non-concave, thesis §3.3.3).
    max_samples : int, optional
        M, the largest client size the model covers; default the largest size seen.
        Required with ``dp`` (a public bound); larger clients are then cut down to M.
    sample_bins : int, optional
        Model sizes on this many equal-width bins of ``1..M`` instead of per integer.
    moment_category : {"argmax", "first"}, default="argmax"
        Category whose moments give alpha_0 in Algorithm 5 ("first" is the thesis's j = 1).
    keep_history : bool, default=False
        Keep the best restart's parameters after every round (recovery curves).
    dp : pfl_cli.mdm.dp.DPMechanism, optional
        Client-level differential privacy (see :func:`pfl_cli.mdm.dp.make_dp`).
    on_progress : callable(done, total, status), optional
        Called after every EM round with the rounds done over all restarts, ``restarts * rounds``
        and a dict of ``components``, ``restart``, ``restarts`` and, without ``dp`` only,
        ``mean_log_likelihood`` (the round's cohort at the parameters before the update): under
        ``dp`` it is computed on the private data and not released. Nothing is computed for it.

    Returns
    -------
    MDMFit

    Raises
    ------
    InputError
        Bad counts or parameters; fewer clients than components.

    Examples
    --------
    >>> from pfl_cli.mdm.sample import sample_clients
    >>> true = MDMParams(np.array([1.0]), np.array([[2.0, 1.0, 1.0]]), np.array([[1.0]]), np.array([30, 31]))
    >>> counts = sample_clients(true, 2000, rng=np.random.default_rng(0)).counts
    >>> fit = fit_mdm(counts, num_components=1, rounds=50, rng=np.random.default_rng(1))
    >>> bool(np.allclose(fit.params.alpha, [[2.0, 1.0, 1.0]], rtol=0.15))
    True
    """
    x, empty = check_counts(counts, private=dp is not None)
    n = x.shape[0]
    k = _check_int("num_components", num_components, 1)
    if dp is not None:
        if max_samples is None:
            raise InputError("max_samples is required with dp: a public bound M on a client's size (the size "
                             "model's support and the default clip); pflx never reads it from the private data.")
        x = cap_client_sizes(x, _check_int("max_samples", max_samples, 1))
    if n < k and dp is None:
        raise InfeasibleError(
            f"num_components {k} needs at least {k} clients with samples; got {n}"
            + (f" ({int(empty.sum())} empty clients skipped)" if empty.any() else "") + ". Lower --components."
        )
    rounds = _check_int("rounds", rounds, 0)
    restarts = _check_int("restarts", restarts, 1)
    cohort = n if cohort_size is None else min(_check_int("cohort_size", cohort_size, 1), n)
    init_cohort = cohort if init_cohort_size is None else min(_check_int("init_cohort_size", init_cohort_size, 1), n)
    check_param("moment_category", moment_category in MOMENT_CATEGORIES, f"must be one of {MOMENT_CATEGORIES}", moment_category)
    if not isinstance(rng, np.random.Generator):
        raise TypeError(f"rng must be a numpy.random.Generator; got {type(rng).__name__}.")
    edges = size_edges_for(x.sum(axis=1), max_samples=max_samples, sample_bins=sample_bins)
    data = K.encode(x)
    if dp is not None:
        dp = dp.bind(cohort_size=cohort_size, init_cohort_size=init_cohort_size if init_cohort_size is not None
                     else cohort_size, rounds=rounds, restarts=restarts, max_samples=int(edges[-1] - 1))
    runs = [
        _fit_once(x, data, k, edges, rounds, cohort, init_cohort, moment_category, keep_history, dp, r, child,
                  _round_reporter(on_progress, k, r, restarts, rounds, private=dp is not None))
        for r, child in enumerate(rng.spawn(restarts))
    ]
    lls = tuple(run[1] for run in runs)
    best = int(np.argmax(lls))
    params, ll, trace, history = runs[best]
    return MDMFit(
        params=params, log_likelihood=ll, num_clients=n, num_skipped=int(empty.sum()), rounds=rounds,
        cohort_size=cohort, restart_log_likelihoods=lls, best_restart=best,
        trace=tuple(row for run in runs for row in run[2]), history=history,
        privacy=None if dp is None else dp.ledger(), dp_info=None if dp is None else dp.info(),
    )


def _round_reporter(on_progress, k: int, restart: int, restarts: int, rounds: int, *, private: bool):
    """``tick(round, cohort log-likelihood, clients)`` for :func:`_fit_once`, or None without ``on_progress``."""
    if on_progress is None:
        return None

    def tick(t: int, ll: float, clients: int) -> None:
        status = {"components": k, "restart": restart + 1, "restarts": restarts}
        if not private:  # under DP the log-likelihood is computed on the private data: never shown
            status["mean_log_likelihood"] = ll / max(clients, 1)
        on_progress(restart * rounds + t, restarts * rounds, status)

    return tick


def _cohort(n: int, size: int, rng: np.random.Generator, dp, rate: float = 1.0) -> np.ndarray | slice:
    if dp is not None:
        return dp.cohort(n, rate, rng)
    if size >= n:
        return slice(0, n)
    return np.sort(rng.choice(n, size=size, replace=False))


def _fit_once(x, data, k, edges, rounds, cohort, init_cohort, moment_category, keep_history, dp, restart, rng,
              tick=None):
    """One initialization and ``rounds`` EM rounds; returns (params, final LL, trace rows, history)."""
    r_init, r_rounds, r_noise = rng.spawn(3)
    s = len(edges) - 1
    rows = _cohort(data.num_clients, init_cohort, r_init, dp, dp.init_rate if dp is not None else 1.0)
    sizes = x[rows].sum(axis=1)
    bins = np.searchsorted(edges, sizes, side="right") - 1
    if dp is None:
        sums = init_client_sums(x[rows], bins, k, s, r_init)
    else:
        sums = dp.noisy_init_sums(x[rows], bins, k, s, r_init, r_noise)
    params = init_from_sums(sums, edges, moment_category=moment_category)
    history = [params] if keep_history else None
    trace = []
    for t in range(rounds):
        rows = _cohort(data.num_clients, cohort, r_rounds, dp, dp.round_rate if dp is not None else 1.0)
        sub = data if isinstance(rows, slice) else data.rows(rows)  # full batch: reuse the cached chunks
        stats = K.summed_statistics(sub, params) if dp is None else dp.noisy_round_sums(sub, params, r_noise)
        trace.append((restart, t, sub.num_clients, float(stats.log_likelihood)))
        params = server_update(stats, params)
        if history is not None:
            history.append(params)
        if tick is not None:
            tick(t + 1, trace[-1][3], sub.num_clients)
    # Under DP the log-likelihood is not released (it is not a noised statistic).
    final = float("nan") if dp is not None else float(K.client_log_likelihood(data, params).sum())
    trace.append((restart, rounds, data.num_clients, final))
    return params, final, trace, None if history is None else tuple(history)
