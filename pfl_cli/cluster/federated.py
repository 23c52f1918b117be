"""The client side of the protocol: what each client computes, summed by secure aggregation.

Every function here simulates n clients at once and returns **only the sum over clients**
of their statistics (thesis §2.4.2: the server sees the secure-aggregation sum, to which
one central noise draw is added). Client-level DP clips each client's statistic before
the sum (thesis D.7.4); this is done by per-client scale factors, vectorized over
clients: no loop over clients and no per-client array is ever returned.

Clients' points are stored grouped by client: client i holds
``points[offsets[i]:offsets[i + 1]]``.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from scipy import sparse

from pfl_cli.cluster.kmeans import assign, cluster_sums

_GRAM_BUDGET = 2_000_000  # floats per chunk of padded per-client blocks


@dataclass(frozen=True)
class ClientData:
    """All clients' points, grouped by client.

    Attributes
    ----------
    points : ndarray of shape (m, d), float64
    offsets : ndarray of shape (n_clients + 1,), int64
        Client i holds ``points[offsets[i]:offsets[i + 1]]``.
    """

    points: np.ndarray
    offsets: np.ndarray

    @property
    def num_clients(self) -> int:
        return len(self.offsets) - 1

    @property
    def sizes(self) -> np.ndarray:
        return np.diff(self.offsets)

    @property
    def owner(self) -> np.ndarray:
        """Client of each point, shape (m,)."""
        return np.repeat(np.arange(self.num_clients), self.sizes)


def _clip_factor(norms: np.ndarray, bound: float | None) -> np.ndarray:
    """min(1, bound / norm) per client (1 when no bound): the scale of thesis D.7.4."""
    if bound is None:
        return np.ones_like(norms)
    return np.where(norms > bound, bound / np.where(norms > 0, norms, 1.0), 1.0)


def _outer_frobenius_norms(data: ClientData) -> np.ndarray:
    """||P_i P_i^T||_F of every client (= ||P_i^T P_i||_F: the smaller Gram is used)."""
    sizes, d = data.sizes, data.points.shape[1]
    width = int(sizes.max()) if len(sizes) else 0
    norms = np.zeros(data.num_clients)
    if width == 0:
        return norms
    per_client = width * d + min(width, d) ** 2
    step = max(1, _GRAM_BUDGET // per_client)
    cols = np.arange(width)
    for start in range(0, data.num_clients, step):  # chunks of clients bound the memory
        stop = min(start + step, data.num_clients)
        idx = data.offsets[start:stop, None] + cols[None, :]
        valid = cols[None, :] < sizes[start:stop, None]
        block = data.points[np.where(valid, idx, 0)] * valid[..., None]  # (c, width, d), zero padded
        gram = np.einsum("cad,cbd->cab", block, block) if width <= d else np.einsum("cad,cae->cde", block, block)
        norms[start:stop] = np.sqrt((gram**2).sum(axis=(1, 2)))
    return norms


def outer_product_sum(data: ClientData, *, clip: float | None = None) -> np.ndarray:
    """Step 1 client statistic: sum_i P_i P_i^T, each term Frobenius-clipped to ``clip``.

    Returns
    -------
    ndarray of shape (d, d)
    """
    x = data.points
    if clip is None:
        return x.T @ x
    factor = _clip_factor(_outer_frobenius_norms(data), clip)[data.owner]
    return (x * factor[:, None]).T @ x


def nearest_server_counts(
    data: ClientData, projection: np.ndarray, projected_server: np.ndarray, *, clip: float | None = None
) -> np.ndarray:
    """Step 2 client statistic: sum_i w(Pi P_i), each client's histogram L1-clipped to ``clip``.

    w_q counts the client points whose nearest projected server point is q (ties to the
    lowest index).

    Returns
    -------
    ndarray of shape (n_server,)
    """
    nearest, _ = assign(data.points @ projection, projected_server)
    weights = None if clip is None else _clip_factor(data.sizes.astype(np.float64), clip)[data.owner]
    return np.bincount(nearest, weights=weights, minlength=len(projected_server)).astype(np.float64)


def _labels(data: ClientData, centers: np.ndarray, projection: np.ndarray | None) -> np.ndarray:
    if projection is None:  # FedDP-Lloyds: assignment in the full space
        return assign(data.points, centers)[0]
    return assign(data.points @ projection, centers)[0]  # FedDP-Init step 3: projected space


def _per_client_cluster(data: ClientData, labels: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """Sums (n, k, d) and counts (n, k) of every (client, cluster) pair, in one sparse product."""
    n, d = data.num_clients, data.points.shape[1]
    key = data.owner * k + labels
    onehot = sparse.csr_matrix((np.ones(len(key)), (key, np.arange(len(key)))), shape=(n * k, len(key)))
    sums = np.asarray(onehot @ data.points).reshape(n, k, d)
    counts = np.bincount(key, minlength=n * k).reshape(n, k).astype(np.float64)
    return sums, counts


def cluster_sums_and_counts(
    data: ClientData,
    centers: np.ndarray,
    *,
    projection: np.ndarray | None = None,
    clip_sums: float | None = None,
    clip_counts: float | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """Step 3 (data-point level) and FedDP-Lloyds statistic: sum_i m_j^i and sum_i n_j^i.

    Points go to their nearest center, in the projected space when ``projection`` (d, k')
    is given (``centers`` are then projected coordinates). With clip bounds (client level)
    each client's stacked sums (k, d) are Frobenius-clipped and its counts L1-clipped.

    Returns
    -------
    sums : ndarray of shape (k, d)
    counts : ndarray of shape (k,)
    """
    k = centers.shape[0]
    labels = _labels(data, centers, projection)
    if clip_sums is None and clip_counts is None:
        return cluster_sums(data.points, labels, k)
    sums, counts = _per_client_cluster(data, labels, k)
    fs = _clip_factor(np.sqrt((sums**2).sum(axis=(1, 2))), clip_sums)
    fc = _clip_factor(counts.sum(axis=1), clip_counts)
    return np.einsum("n,nkd->kd", fs, sums), fc @ counts


def cluster_means_and_indicators(
    data: ClientData, centers: np.ndarray, *, projection: np.ndarray, clip_means: float, clip_indicators: float
) -> tuple[np.ndarray, np.ndarray]:
    """Step 3 at client level (D.7.4): sum_i u^i and sum_i c^i, each clipped.

    u_j^i = m_j^i / n_j^i (0 when n_j^i = 0) is client i's mean of cluster j, Frobenius-
    clipped over (k, d) to ``clip_means``; c_j^i = 1[n_j^i > 0], L1-clipped to
    ``clip_indicators``.

    Returns
    -------
    means_sum : ndarray of shape (k, d)
    indicators_sum : ndarray of shape (k,)
    """
    k = centers.shape[0]
    sums, counts = _per_client_cluster(data, _labels(data, centers, projection), k)
    means = sums / np.maximum(counts, 1.0)[..., None]
    indicators = (counts > 0).astype(np.float64)
    fm = _clip_factor(np.sqrt((means**2).sum(axis=(1, 2))), clip_means)
    fi = _clip_factor(indicators.sum(axis=1), clip_indicators)
    return np.einsum("n,nkd->kd", fm, means), fi @ indicators
