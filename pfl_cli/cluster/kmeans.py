"""Weighted k-means kernels: distances, cost, k-means++ and Lloyd's algorithm.

Private kernels of the ``cluster`` stage; they assume clean inputs (validated by
:func:`pfl_cli.cluster.api.fit_feddp_kmeans`) and take an explicit ``rng``.

- k-means cost, thesis eq. (2.3): ``cost(X, C) = sum_x min_c ||x - c||^2`` (optionally weighted).
- :func:`kmeans_plusplus` -- Algorithm 2 (D^2 seeding), with per-point weights and greedy
  local trials (the variant scikit-learn uses).
- :func:`lloyd` -- Algorithm 1, weighted, until the assignments stop changing.
- :func:`kmeans` -- best of ``n_init`` k-means++ + Lloyd runs.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from scipy import sparse

_CHUNK_ROWS = 8192  # rows per distance block: bounds memory at chunk x k floats


def sq_distances(x: np.ndarray, centers: np.ndarray) -> np.ndarray:
    """Squared Euclidean distances, shape (n_points, n_centers), clamped at 0."""
    d2 = (x * x).sum(axis=1)[:, None] - 2.0 * (x @ centers.T) + (centers * centers).sum(axis=1)[None, :]
    return np.maximum(d2, 0.0, out=d2)


def assign(x: np.ndarray, centers: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Nearest center of each point and its squared distance (ties: lowest index).

    Returns
    -------
    labels : ndarray of shape (n_points,), int64
    min_sq : ndarray of shape (n_points,), float64
    """
    n = x.shape[0]
    labels = np.empty(n, dtype=np.int64)
    min_sq = np.empty(n, dtype=np.float64)
    for start in range(0, n, _CHUNK_ROWS):
        block = sq_distances(x[start : start + _CHUNK_ROWS], centers)
        lab = block.argmin(axis=1)
        labels[start : start + len(lab)] = lab
        min_sq[start : start + len(lab)] = block[np.arange(len(lab)), lab]
    return labels, min_sq


def kmeans_cost(x: np.ndarray, centers: np.ndarray, weights: np.ndarray | None = None) -> float:
    """k-means cost (thesis eq. 2.3), weighted by ``weights`` when given."""
    _, min_sq = assign(x, centers)
    return float(min_sq.sum() if weights is None else min_sq @ weights)


def cluster_sums(x: np.ndarray, labels: np.ndarray, k: int, weights: np.ndarray | None = None):
    """Per-cluster (weighted) sums, shape (k, d), and (weighted) counts, shape (k,)."""
    w = np.ones(len(labels)) if weights is None else np.asarray(weights, dtype=np.float64)
    onehot = sparse.csr_matrix((w, (labels, np.arange(len(labels)))), shape=(k, len(labels)))
    return np.asarray(onehot @ x), np.bincount(labels, weights=w, minlength=k)


def kmeans_plusplus(
    x: np.ndarray, k: int, *, rng: np.random.Generator, weights: np.ndarray | None = None
) -> np.ndarray:
    """k-means++ seeding (thesis Algorithm 2), each point's D^2 probability times its weight.

    Greedy: ``2 + floor(ln k)`` candidates per step, the one lowering the cost most is kept.

    Returns
    -------
    ndarray of shape (k, d)
    """
    n = x.shape[0]
    w = np.ones(n) if weights is None else np.asarray(weights, dtype=np.float64)
    trials = 2 + int(math.log(k))
    centers = np.empty((k, x.shape[1]))
    centers[0] = x[rng.choice(n, p=w / w.sum())]  # line 1: a (weighted) uniform random point
    closest = sq_distances(x, centers[:1])[:, 0]
    for j in range(1, k):
        pot = closest * w
        total = pot.sum()
        if total <= 0:  # every point sits on a center already: any point will do
            cand = rng.choice(n, size=trials)
        else:
            cand = np.searchsorted(np.cumsum(pot), rng.random(trials) * total)
            cand = np.minimum(cand, n - 1)
        cand_d = np.minimum(closest[None, :], sq_distances(x, x[cand]).T)
        best = int(np.argmin(cand_d @ w))
        centers[j] = x[cand[best]]
        closest = cand_d[best]
    return centers


@dataclass(frozen=True)
class KMeansFit:
    """Result of :func:`lloyd` / :func:`kmeans`."""

    centers: np.ndarray
    labels: np.ndarray
    cost: float
    n_iter: int


def lloyd(
    x: np.ndarray,
    centers: np.ndarray,
    *,
    weights: np.ndarray | None = None,
    max_iter: int = 300,
    tol: float = 1e-4,
) -> KMeansFit:
    """Weighted Lloyd's algorithm (thesis Algorithm 1) from ``centers``.

    Stops when the assignments do not change, when the centers move by less than ``tol``
    times the data's mean per-feature variance in total (scikit-learn's rule; ``tol=0``
    keeps the exact rule of Algorithm 1), or after ``max_iter`` update steps. A cluster
    that loses all its points keeps its previous center.
    """
    centers = np.array(centers, dtype=np.float64)
    k = centers.shape[0]
    threshold = tol * float(np.mean(np.var(x, axis=0))) if tol > 0 else 0.0
    labels, _ = assign(x, centers)
    n_iter = 0
    for n_iter in range(1, max_iter + 1):
        sums, counts = cluster_sums(x, labels, k, weights)
        nonempty = counts > 0
        previous = centers.copy()
        centers[nonempty] = sums[nonempty] / counts[nonempty, None]  # update step
        new_labels, _ = assign(x, centers)  # assignment step
        if np.array_equal(new_labels, labels) or ((centers - previous) ** 2).sum() <= threshold:
            break
        labels = new_labels
    labels, min_sq = assign(x, centers)
    cost = float(min_sq.sum() if weights is None else min_sq @ weights)
    return KMeansFit(centers, labels, cost, n_iter)


def kmeans(
    x: np.ndarray,
    k: int,
    *,
    rng: np.random.Generator,
    weights: np.ndarray | None = None,
    n_init: int = 10,
    max_iter: int = 300,
) -> KMeansFit:
    """Best (lowest weighted cost) of ``n_init`` runs of k-means++ followed by Lloyd's."""
    best: KMeansFit | None = None
    for _ in range(n_init):
        fit = lloyd(x, kmeans_plusplus(x, k, rng=rng, weights=weights), weights=weights, max_iter=max_iter)
        if best is None or fit.cost < best.cost:
            best = fit
    assert best is not None
    return best
