"""FedDP-Init (thesis §6.3.1, Algorithm 11): private initial centers.

Step 1  clients: sum_i P_i P_i^T  -> + symmetric Gaussian -> server: top-k' eigenvectors Pi
Step 2  clients: sum_i w(Pi P_i)  -> + Laplace            -> server: weighted k-means on Pi Q
Step 3  clients: per-cluster sums and counts of their points, assigned in the projected
        space to the server's centers xi_j -> + Gaussian / Laplace -> server: nu_j = m_j / n_j

The boundary is explicit: the client side (:mod:`pfl_cli.cluster.federated`) returns sums
over clients only; :func:`_release` adds the one central noise draw; the ``server_*``
functions below receive nothing but those noisy sums (d x d, |Q|, k x d, k) and public
data (the server's own points Q, earlier public outputs).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np
from scipy import linalg

from pfl_cli.cluster import federated
from pfl_cli.cluster.federated import ClientData
from pfl_cli.cluster.kmeans import kmeans
from pfl_cli.privacy import gaussian_noise, laplace_noise, symmetric_gaussian_noise


def _release(total: np.ndarray, scale: float, kind: str, rng: np.random.Generator) -> np.ndarray:
    """Secure-aggregation sum plus one central noise draw (none when ``scale`` is 0: --no-dp)."""
    if scale == 0:
        return np.array(total, dtype=np.float64)
    if kind == "symmetric":
        return total + symmetric_gaussian_noise(total.shape[0], scale, rng)
    if kind == "gaussian":
        return total + gaussian_noise(total.shape, scale, rng)
    return total + laplace_noise(total.shape, scale, rng)


# ---------------------------------------------------------------------------- server side
def server_projection(noisy_outer: np.ndarray, dim: int) -> np.ndarray:
    """Step 1, server: orthonormal top-``dim`` eigenvectors of the noisy sum, shape (d, dim).

    Largest algebraic eigenvalues, as ``eigh(..., subset_by_index=(d - k, d - 1))`` [C].
    Projected points are used through their coordinates ``x @ V`` (distances equal those
    of ``V V^T x``).
    """
    d = noisy_outer.shape[0]
    _, vectors = linalg.eigh(noisy_outer, subset_by_index=(d - dim, d - 1))
    return vectors[:, ::-1]


def server_weighted_kmeans(
    projected_server: np.ndarray,
    noisy_weights: np.ndarray,
    k: int,
    *,
    min_weight: float,
    rng: np.random.Generator,
    n_init: int = 10,
) -> tuple[np.ndarray, np.ndarray]:
    """Step 2/3, server: k-means on Pi Q, point q weighted by its noisy weight.

    Server points with ``w_q < min_weight`` are dropped [C] (the thesis's code uses 5); if
    fewer than ``k`` remain, the ``k`` heaviest are kept.

    Returns
    -------
    xi : ndarray of shape (k, dim)
        Centers in projected coordinates.
    kept : ndarray of shape (n_server,), bool
    """
    kept = (noisy_weights >= min_weight) & (noisy_weights > 0)
    if kept.sum() < k:
        kept = np.zeros(len(noisy_weights), dtype=bool)
        kept[np.argsort(-noisy_weights, kind="stable")[:k]] = True
    weights = np.maximum(noisy_weights[kept], 1e-12)
    fit = kmeans(projected_server[kept], k, rng=rng, weights=weights, n_init=n_init)
    return fit.centers, kept


def server_centers(noisy_sums: np.ndarray, noisy_counts: np.ndarray, fallback: np.ndarray) -> np.ndarray:
    """Step 3 / Lloyd update, server: nu_j = m_j / n_j.

    A cluster whose noisy count is below 1 keeps ``fallback[j]`` (a public earlier
    estimate), instead of dividing by ~0 (pflx's empty-cluster guard around thesis Algorithm 11).
    """
    ok = noisy_counts >= 1.0
    centers = np.array(fallback, dtype=np.float64)
    centers[ok] = noisy_sums[ok] / noisy_counts[ok, None]
    return centers


def weighted_server_costs(
    projected_server: np.ndarray, noisy_weights: np.ndarray, ks, *, min_weight: float, rng, n_init: int = 10
) -> list[float]:
    """Choosing k (App. D.8.3, Fig. D.5): W(k) = weighted k-means cost / total weight.

    Post-processing of steps 1-2 only, so it costs no privacy.
    """
    out = []
    for k in ks:
        xi, kept = server_weighted_kmeans(projected_server, noisy_weights, k, min_weight=min_weight, rng=rng,
                                          n_init=n_init)
        w = np.maximum(noisy_weights[kept], 1e-12)
        d2 = ((projected_server[kept][:, None, :] - xi[None, :, :]) ** 2).sum(axis=2).min(axis=1)
        out.append(float(d2 @ w / w.sum()))
    return out


# ---------------------------------------------------------------------------- the protocol
@dataclass(frozen=True)
class InitResult:
    """Output of :func:`feddp_init`."""

    centers: np.ndarray  # (k, d)
    projection: np.ndarray  # (d, k')
    projected_server: np.ndarray  # (n_server, k')
    noisy_weights: np.ndarray  # (n_server,)
    server_kept: np.ndarray  # (n_server,) bool


def feddp_init(
    data: ClientData,
    server: np.ndarray,
    k: int,
    *,
    scales: dict[str, float],
    clip: dict[str, float] | None,
    projection_dim: int,
    min_weight: float,
    rng: np.random.Generator,
    n_init: int = 10,
    on_step: Callable[[str], None] | None = None,
) -> InitResult:
    """Run FedDP-Init (Algorithm 11).

    Parameters
    ----------
    data : ClientData
        Client points, already clipped to the radius at data-point level.
    server : ndarray of shape (n_server, d)
    k : int
    scales : dict
        Noise of each release (``outer``, ``weights``, ``sums``, ``counts``); 0 = none.
    clip : dict or None
        Client-level bounds (``outer``, ``weights``, ``sums``, ``counts``); None at data-point level.
    projection_dim : int
        k' >= k, the projection's dimension (k unless choosing k with a larger k').
    min_weight : float
        Server points with a smaller noisy weight are dropped.
    rng : numpy.random.Generator
    on_step : callable(name), optional
        Called after each of the three steps with its name (progress; public facts only).
    """
    on_step = on_step or (lambda name: None)
    noise_rng, server_rng = rng.spawn(2)
    c = clip or {}
    # Step 1 (lines 1-5): noisy sum of outer products, sensitivity Delta^2 (or B1).
    noisy_outer = _release(federated.outer_product_sum(data, clip=c.get("outer")), scales["outer"], "symmetric",
                           noise_rng)
    projection = server_projection(noisy_outer, projection_dim)
    projected_server = server @ projection
    on_step("FedDP-Init step 1/3: projection")
    # Step 2 (lines 6-16): noisy nearest-server-point histogram, L1 sensitivity 1 (or B2).
    counts = federated.nearest_server_counts(data, projection, projected_server, clip=c.get("weights"))
    noisy_weights = _release(counts, scales["weights"], "laplace", noise_rng)
    on_step("FedDP-Init step 2/3: server weights")
    # Step 3 (lines 17-25): weighted k-means on Pi Q, then one assign-and-average in the full space.
    xi, kept = server_weighted_kmeans(projected_server, noisy_weights, k, min_weight=min_weight, rng=server_rng,
                                      n_init=n_init)
    if clip is None:
        sums, cnt = federated.cluster_sums_and_counts(data, xi, projection=projection)
    else:  # client level: mean of the per-client means (D.7.4)
        sums, cnt = federated.cluster_means_and_indicators(data, xi, projection=projection,
                                                          clip_means=c["sums"], clip_indicators=c["counts"])
    noisy_sums = _release(sums, scales["sums"], "gaussian", noise_rng)
    noisy_counts = _release(cnt, scales["counts"], "laplace", noise_rng)
    centers = server_centers(noisy_sums, noisy_counts, fallback=xi @ projection.T)
    on_step("FedDP-Init step 3/3: centers")
    return InitResult(centers, projection, projected_server, noisy_weights, kept)
