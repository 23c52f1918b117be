"""Robust aggregation: the "protection" registry of the server's average (``--set aggregator=NAME``).

Each entry is one small class whose :meth:`Aggregator.combine` turns the cohort's updates, a ``[clients, params]``
matrix ``X`` of model deltas, into the one delta the server applies. Every kernel is torch ops over the whole
matrix (sorts along the client axis, ``torch.cdist`` for Krum's pairwise distances): no Python loop over clients.
Per-client loops live only in the tests, as the slow, obviously correct references.

``mean`` is FedAvg's data-size-weighted mean (McMahan et al. 2017, Alg. 1), computed by
:func:`pfl_cli.fl.params.weighted_mean` as it is without this module, bit for bit. The others are unweighted, as
in their papers, except ``norm-bound``, which weighs the clipped deltas as FedAvg does.

``f`` is the number of Byzantine clients an aggregator tolerates in a cohort of ``n``:
``f = floor(robust_fraction * n)``. ``clip`` is the radius of ``centered-clip`` and ``norm-bound`` (None: the
median norm of the cohort's vectors that get clipped, a scale-free default of pflx's).

Only an algorithm whose server averages the cohort's models declares ``averages_updates = True`` (on its own
class, never inherited: :func:`averages_updates`); any other aggregator than ``mean`` on another algorithm is
refused before any work (:func:`check_aggregator`).
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod


def averages_updates(cls) -> bool:
    """Whether algorithm class ``cls`` declares (itself, not through a parent) that its server averages the
    cohort's models in :meth:`FedAvg.aggregate`, the step a robust aggregator replaces."""
    return bool(cls.__dict__.get("averages_updates", False))


class Aggregator(ABC):
    """One entry: ``name``, the paper, which keys it reads, and the smallest cohort it is defined for. Abstract:
    ``mean`` is the entry :class:`Mean`."""

    name = ""
    paper = ""
    weighted = False       # reads the clients' data sizes
    uses_f = False         # reads robust_fraction
    uses_clip = False      # reads robust_clip
    uses_center = False    # reads the server's previous step

    @staticmethod
    def min_clients(f: int) -> int:
        """The smallest cohort of which ``f`` may be Byzantine."""
        return 1

    @abstractmethod
    def combine(self, X, w, *, f: int, clip: float | None, center):
        """``X`` (n, P) deltas, ``w`` (n,) weights summing to 1 -> the aggregate (P,)."""


class Mean(Aggregator):
    name = "mean"
    paper = "FedAvg: McMahan et al., AISTATS 2017, Alg. 1 (the data-size-weighted mean)"
    weighted = True

    def combine(self, X, w, *, f, clip, center):
        return w @ X


class Median(Aggregator):
    name = "median"
    paper = "Yin et al., ICML 2018, Def. 1 (coordinate-wise median; the mean of the two middle values for even n)"

    def combine(self, X, w, *, f, clip, center):
        return coordinate_median(X)


class TrimmedMean(Aggregator):
    name = "trimmed-mean"
    paper = "Yin et al., ICML 2018, Def. 2 (coordinate-wise beta-trimmed mean, beta n = f values cut at each end)"
    uses_f = True

    @staticmethod
    def min_clients(f: int) -> int:
        return 2 * f + 1

    def combine(self, X, w, *, f, clip, center):
        n = X.shape[0]
        return row_mean(sort_clients(X)[f:n - f])


class Krum(Aggregator):
    name = "krum"
    paper = "Blanchard et al., NeurIPS 2017, §4 (Krum: the update closest to its n - f - 2 nearest neighbours)"
    uses_f = True
    select = 1

    @staticmethod
    def min_clients(f: int) -> int:
        return 2 * f + 3

    def chosen(self, n: int, f: int) -> int:
        return self.select

    def combine(self, X, w, *, f, clip, center):
        scores = krum_scores(squared_distances(X), f)
        pick = scores.argsort(stable=True)[:self.chosen(X.shape[0], f)]
        return row_mean(X[pick])


class MultiKrum(Krum):
    name = "multi-krum"
    paper = "Blanchard et al., NeurIPS 2017, §4 (Multi-Krum: the mean of the m = n - f best-scored updates)"

    def chosen(self, n: int, f: int) -> int:
        return n - f


class Bulyan(Aggregator):
    name = "bulyan"
    paper = ("El Mhamdi et al., ICML 2018, §4 (Bulyan: theta = n - 2f updates chosen by Krum one at a time, then per "
             "coordinate the mean of the beta = theta - 2f values closest to their median)")
    uses_f = True

    @staticmethod
    def min_clients(f: int) -> int:
        return 4 * f + 3

    def combine(self, X, w, *, f, clip, center):
        import torch

        n = X.shape[0]
        d2 = squared_distances(X)
        theta, beta = n - 2 * f, n - 4 * f
        left = torch.ones(n, dtype=torch.bool, device=X.device)
        picked = []
        for _ in range(theta):  # one Krum per selection, on the shrinking set: O(theta) ops on the (n, n) matrix
            m = int(left.sum())
            masked = d2.masked_fill(~(left[:, None] & left[None, :]), math.inf)
            scores = krum_scores(masked, f, neighbours=m - f - 2).masked_fill(~left, math.inf)
            i = int(scores.argmin())
            picked.append(i)
            left[i] = False
        # Per coordinate, the beta values closest to the median of the theta chosen ones: in sorted order they are
        # the window of beta consecutive values whose farther end is nearest the median (one of 2f + 1 windows).
        s = sort_clients(X[torch.as_tensor(picked, device=X.device)])
        med = _median_of_sorted(s)
        starts = torch.arange(theta - beta + 1, device=X.device)
        reach = torch.maximum(med - s[starts], s[starts + beta - 1] - med)          # (2f + 1, P)
        first = reach.argmin(dim=0)                                                   # the first minimal window
        rows = first[None, :] + torch.arange(beta, device=X.device)[:, None]          # (beta, P)
        return row_mean(s.gather(0, rows))


class CenteredClip(Aggregator):
    name = "centered-clip"
    paper = ("Karimireddy et al., ICML 2021, Alg. 2 / Eq. 2 (centered clipping: v + mean_i clip_tau(x_i - v), "
             "v the server's previous step)")
    uses_clip = True
    uses_center = True
    iterations = 1

    def combine(self, X, w, *, f, clip, center):
        v = X.new_zeros(X.shape[1]) if center is None else center
        for _ in range(self.iterations):
            diff = X - v
            v = v + clip_factors(diff.norm(dim=1), clip) @ diff / X.shape[0]
        return v


class NormBound(Aggregator):
    name = "norm-bound"
    paper = ("Sun et al., 'Can you really backdoor federated learning?', 2019, §3 (norm bounding: each update "
             "scaled to norm at most M, then FedAvg's mean)")
    weighted = True
    uses_clip = True

    def combine(self, X, w, *, f, clip, center):
        return (w * clip_factors(X.norm(dim=1), clip)) @ X


AGGREGATORS: dict[str, Aggregator] = {a.name: a for a in (Mean(), Median(), TrimmedMean(), Krum(), MultiKrum(),
                                                           Bulyan(), CenteredClip(), NormBound())}
AGGREGATOR_NAMES = tuple(AGGREGATORS)


# ------------------------------------------------------------------------------------------------ kernels
def coordinate_median(X):
    """Per coordinate, the middle value of the n rows (the mean of the two middle ones for even n)."""
    return _median_of_sorted(sort_clients(X))


def _median_of_sorted(s):
    n = s.shape[0]
    return s[(n - 1) // 2] if n % 2 else (s[n // 2 - 1] + s[n // 2]) / 2


def sort_clients(X):
    """``X`` sorted along the client axis (each coordinate's n values in increasing order).

    On the CPU by Batcher's odd-even merge sorting network (Batcher 1968; Knuth, TAOCP vol. 3, §5.3.4): O(n log^2 n)
    element-wise min / max ops, each over a whole row of P coordinates, which for a cohort's n of tens and P of
    many thousands is several times faster than ``torch.sort`` along a short axis (benchmarks/robust_bench.py);
    elsewhere ``torch.sort``. Equal values, equal results.
    """
    import torch

    if X.device.type != "cpu" or X.shape[0] > 256 or X.shape[0] == 0:
        return X.sort(dim=0).values
    rows = list(X.unbind(0))
    for a, b in _merge_network(X.shape[0]):
        rows[a], rows[b] = torch.minimum(rows[a], rows[b]), torch.maximum(rows[a], rows[b])
    return torch.stack(rows)


_NETWORKS: dict[int, list] = {}


def _merge_network(n: int) -> list:
    """The comparators (low, high) of Batcher's odd-even merge sort of ``n`` values: the network of the next power
    of two, without the comparators that touch a position >= n (those padding values would be +inf, so each such
    comparator leaves its pair as it is)."""
    if n not in _NETWORKS:
        size = 1
        while size < n:
            size *= 2
        pairs, p = [], 1
        while p < size:
            k = p
            while k >= 1:
                for j in range(k % p, size - k, 2 * k):
                    for i in range(min(k, size - j - k)):
                        if (i + j) // (p * 2) == (i + j + k) // (p * 2) and i + j + k < n:
                            pairs.append((i + j, i + j + k))
                k //= 2
            p *= 2
        _NETWORKS[n] = pairs
    return _NETWORKS[n]


def row_mean(X):
    """The mean of the rows of ``X`` as one matrix-vector product (a BLAS call, not a reduction over rows)."""
    return X.new_full((X.shape[0],), 1.0 / X.shape[0]) @ X


def squared_distances(X):
    """(n, n) squared Euclidean distances between the rows of ``X``: ``|x_i|^2 + |x_j|^2 - 2 x_i . x_j`` from one
    Gram matrix ``X X^T`` (what ``torch.cdist`` computes in its matrix-product mode, without its copies: twice as
    fast here on a cohort of 50 models of 10^5 parameters), clamped at 0 against rounding."""
    sq = (X * X).sum(dim=1)
    return (sq[:, None] + sq[None, :] - 2.0 * (X @ X.T)).clamp_min(0.0)


def krum_scores(d2, f: int, *, neighbours: int | None = None):
    """Krum's score of each row: the sum of its ``n - f - 2`` smallest squared distances to the other rows
    (Blanchard et al. 2017, §4); the diagonal (a row to itself) never counts."""
    import torch

    n = d2.shape[0]
    k = n - f - 2 if neighbours is None else neighbours
    off = d2.masked_fill(torch.eye(n, dtype=torch.bool, device=d2.device), math.inf)
    return off.sort(dim=1).values[:, :max(k, 0)].sum(dim=1)


def clip_factors(norms, clip: float | None):
    """``min(1, clip / norm)`` per row; ``clip`` None: the median of ``norms`` (pflx's scale-free default)."""
    import torch

    tau = float(norms.median()) if clip is None else float(clip)
    return torch.where(norms > tau, tau / norms.clamp_min(1e-30), torch.ones_like(norms))


# ------------------------------------------------------------------------------------------------ the server's use
def cohort_f(fraction: float, n: int) -> int:
    """The Byzantine clients an aggregator tolerates in a cohort of ``n``: ``floor(fraction * n)``."""
    return int(math.floor(fraction * n + 1e-9))


def robust_mean(cfg, store, cohort, theta: dict, reference: dict, *, center: dict | None = None,
                by_size: bool = True) -> dict:
    """The server's average of the cohort's models ``theta`` (c, ...) around ``reference`` under ``cfg.aggregator``.

    The deltas ``theta - reference`` are flattened into one ``[c, P]`` matrix, combined, and added back onto
    ``reference``; ``center`` is the server's previous step (centered clipping's start). ``mean`` is
    :func:`pfl_cli.fl.params.weighted_mean` itself; ``by_size`` False: the weights of the weighted aggregators
    (``mean``, ``norm-bound``) are uniform, as the algorithm's own mean is.
    """
    import torch

    from pfl_cli.errors import RunError
    from pfl_cli.fl.params import weighted_mean

    agg = AGGREGATORS[cfg.aggregator]
    if agg.name == "mean":
        return weighted_mean(store, cohort, theta, by_size=by_size)
    n = len(cohort)
    f = cohort_f(cfg.robust_fraction, n) if agg.uses_f else 0
    if n < agg.min_clients(f):
        raise RunError(f"aggregator {agg.name} with robust_fraction {cfg.robust_fraction} needs at least "
                       f"{agg.min_clients(f)} clients in a cohort (f = {f}); this round's cohort has {n}. Raise "
                       "clients_per_round or lower robust_fraction.")
    keys = list(theta)
    X = torch.cat([(theta[k] - reference[k]).reshape(n, -1) for k in keys], dim=1)
    size = store.fit.length[cohort].to(X.dtype) if by_size else X.new_ones(n)
    w = size / size.sum().clamp_min(1.0)
    c = None if center is None or not agg.uses_center else torch.cat([center[k].reshape(-1) for k in keys])
    out = agg.combine(X, w, f=f, clip=cfg.robust_clip, center=c).to(X.dtype)
    parts = out.split([reference[k].numel() for k in keys])
    return {k: reference[k] + p.view_as(reference[k]) for k, p in zip(keys, parts)}


def corrupt_uploads(alg, t: int, cohort, theta: dict, reference: dict | None = None) -> dict:
    """The cohort's uploads ``theta`` (c, ...) as the server receives them in round ``t``: with Byzantine clients
    (``alg.byzantine``, :mod:`pfl_cli.fl.byzantine`) the malicious rows' deltas from ``reference`` (default: the
    global model's same keys) replaced by the attack's; else ``theta`` itself. What a malicious client keeps for
    itself (its private state) is what it trained: only the upload is corrupted."""
    if alg.byzantine is None:
        return theta
    reference = {k: alg.global_params[k] for k in theta} if reference is None else reference
    return alg.byzantine.corrupt(t, cohort, reference, theta,
                                 default_server_lr=getattr(alg, "default_server_lr", 1.0))


def average_uploads(alg, cohort, theta: dict, reference: dict | None = None, *, by_size: bool = True,
                    secagg: bool = False) -> dict:
    """The server's average of the cohort's uploads ``theta`` (c, ...): the algorithm's own mean (by data size, or
    uniform with ``by_size`` False; under ``secagg`` from the cohort's sums only, :func:`pfl_cli.fl.secagg.
    cohort_mean`), or the robust aggregator ``alg.cfg.aggregator`` names (:func:`robust_mean`) around ``reference``
    (default: the global model's same keys), centred on the server's last step where it keeps one
    (``alg.server_buf``). With ``aggregator=mean`` it is the plain mean, bit for bit."""
    from pfl_cli.fl.secagg import cohort_mean

    cfg = alg.cfg
    if cfg.aggregator == "mean":
        return cohort_mean(alg.store, cohort, theta, by_size=by_size, secagg=secagg)
    reference = {k: alg.global_params[k] for k in theta} if reference is None else reference
    buf = getattr(alg, "server_buf", None)
    center = {k: buf[k] for k in theta} if buf and all(k in buf for k in theta) else None
    return robust_mean(cfg, alg.store, cohort, theta, reference, center=center, by_size=by_size)


def robust_delta(alg, cohort, deltas: dict, *, by_size: bool = False) -> dict:
    """The aggregate of the cohort's update vectors ``deltas`` (c, ...) under ``alg.cfg.aggregator`` (around 0),
    uniform weights unless ``by_size``: for a server that averages updates rather than models (SCAFFOLD's Delta y,
    FedDyn's moves, FedNova's normalized updates), where ``aggregator=mean`` keeps that server's own formula."""
    zeros = {k: v.new_zeros(v.shape[1:]) for k, v in deltas.items()}
    buf = getattr(alg, "server_buf", None)
    center = {k: buf[k] for k in deltas} if buf and all(k in buf for k in deltas) else None
    return robust_mean(alg.cfg, alg.store, cohort, deltas, zeros, center=center, by_size=by_size)


TABLE_BEGIN = "<!-- robust-table: generated by tests/fl/test_robust.py from the registry; do not edit -->"
TABLE_END = "<!-- /robust-table -->"


def table_markdown(algorithms) -> str:
    """docs/robustness.md's table between its markers: which algorithms of a registry ({name: class}, in its
    order) take update attacks and robust aggregators (they declare :func:`averages_updates`), which refuse them."""
    takes = [f"`{n}`" for n, cls in algorithms.items() if averages_updates(cls)]
    refuses = [f"`{n}`" for n, cls in algorithms.items() if not averages_updates(cls)]
    return "\n".join([TABLE_BEGIN, "", "| update attacks and robust aggregators | algorithms |", "|---|---|",
                      f"| taken ({len(takes)}) | {', '.join(takes)} |",
                      f"| refused ({len(refuses)}) | {', '.join(refuses)} |", "", TABLE_END])


def check_aggregator(cfg) -> None:
    """Refuse, in one line and before any work, an aggregator the algorithm cannot take, or a cohort it is not
    defined for (when the cohort size is known up front)."""
    from pfl_cli.errors import ConfigError

    agg = AGGREGATORS[cfg.aggregator]
    if agg.name == "mean":
        return
    cls = cfg.algorithm_class
    if not averages_updates(cls):
        raise ConfigError(f"aggregator {agg.name} needs an algorithm whose server averages the cohort's models "
                          f"(averages_updates); {cfg.algorithm!r} does not. Use aggregator=mean, or an algorithm "
                          "that declares it (fedavg, fedprox, scaffold, fedrep, ...: the table of docs/robustness.md).")
    if cfg.dp_epsilon is not None:
        raise ConfigError(f"aggregator {agg.name} with --dp: a DP server adds noise to the clipped sum of the "
                          "updates, which a robust aggregator would not be; drop one of them.")
    cohort = cfg.clients_per_round
    if agg.uses_f and cohort is not None:
        f = cohort_f(cfg.robust_fraction, cohort)
        if cohort < agg.min_clients(f):
            raise ConfigError(f"aggregator {agg.name} with robust_fraction {cfg.robust_fraction} needs at least "
                              f"{agg.min_clients(f)} clients per round (f = {f}); got clients_per_round {cohort}. "
                              "Raise clients_per_round or lower robust_fraction.")
