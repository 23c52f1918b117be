"""Baseline initializations of thesis §6.5 / App. D.7.3.

The DP baselines are an initialization that spends no privacy (it uses only the public
server data, or nothing) followed by FedDP-Lloyds, which gets the whole budget:

- ``server-kmeans++`` -- k-means++ (Algorithm 2) on the server data Q.
- ``server-lloyds`` -- full k-means (k-means++ + Lloyd, best of 10) on Q.
- ``sphere-packing`` -- data-independent packing of [-r, r]^d [SCL+17], r = max |coordinate| of Q [C].
- ``random`` -- k distinct server points chosen uniformly at random (Forgy on Q).
- ``kfed`` -- k-FED [DLS21], non-private and one-shot (only with ``--no-dp``): each client
  clusters its own data, the server merges the client centers.
"""

from __future__ import annotations

import numpy as np

from pfl_cli.cluster.federated import ClientData
from pfl_cli.cluster.kmeans import assign, kmeans, kmeans_plusplus, lloyd, sq_distances

from pfl_cli.cluster.config import SERVER_INITS  # noqa: E402,F401 - re-exported


def server_init(name: str, server: np.ndarray, k: int, *, rng: np.random.Generator) -> np.ndarray:
    """Centers (k, d) of a server-only baseline ``name`` (no privacy spent)."""
    if name == "server-kmeans++":
        return kmeans_plusplus(server, k, rng=rng)
    if name == "server-lloyds":
        return kmeans(server, k, rng=rng, n_init=10).centers
    if name == "random":
        return server[rng.choice(len(server), size=k, replace=False)].copy()
    return sphere_packing(server, k, rng=rng)


def sphere_packing(server: np.ndarray, k: int, *, rng: np.random.Generator, attempts: int = 1000,
                   tol: float = 1e-4) -> np.ndarray:
    """Sphere packing [SCL+17]: the largest a such that k centers in [-r, r]^d lie >= a from
    every cube corner and >= 2a from each other, found by bisection on a.

    Each center is the first of ``attempts`` uniform draws that fits.
    """
    d = server.shape[1]
    r = float(np.abs(server).max()) or 1.0

    def place(a: float) -> np.ndarray | None:
        centers: list[np.ndarray] = []
        for _ in range(k):
            cand = rng.uniform(-r, r, size=(attempts, d))
            ok = np.sqrt(((r - np.abs(cand)) ** 2).sum(axis=1)) >= a  # distance to the nearest corner
            if centers:
                ok &= np.sqrt(sq_distances(cand, np.array(centers)).min(axis=1)) >= 2 * a
            hits = np.flatnonzero(ok)
            if len(hits) == 0:
                return None
            centers.append(cand[hits[0]])
        return np.array(centers)

    lo, hi = 0.0, r * np.sqrt(d)
    best = place(lo)
    while hi - lo > tol * max(hi, 1.0):
        mid = 0.5 * (lo + hi)
        found = place(mid)
        if found is None:
            hi = mid
        else:
            lo, best = mid, found
    return best


def _batched_local_kmeans(data: ClientData, k: int, *, rng: np.random.Generator, max_iter: int = 50):
    """k-means on every client at once (padded arrays): centers (n, kc, d) and a valid mask."""
    sizes, n, d = data.sizes, data.num_clients, data.points.shape[1]
    kc = int(min(k, sizes.min()))
    width = int(sizes.max())
    cols = np.arange(width)
    valid = cols[None, :] < sizes[:, None]
    pts = data.points[np.where(valid, data.offsets[:-1, None] + cols[None, :], 0)] * valid[..., None]
    # Init: kc distinct random points per client (random keys, invalid slots last).
    keys = np.where(valid, rng.random((n, width)), np.inf)
    first = np.argsort(keys, axis=1)[:, :kc]
    centers = np.take_along_axis(pts, first[..., None], axis=1)
    norms = (pts**2).sum(axis=2)
    for _ in range(max_iter):
        d2 = norms[..., None] - 2 * np.einsum("nwd,nkd->nwk", pts, centers) + (centers**2).sum(axis=2)[:, None, :]
        labels = d2.argmin(axis=2)
        onehot = (labels[..., None] == np.arange(kc)) & valid[..., None]  # (n, width, kc)
        counts = onehot.sum(axis=1)
        sums = np.einsum("nwk,nwd->nkd", onehot.astype(np.float64), pts)
        new = np.where(counts[..., None] > 0, sums / np.maximum(counts, 1)[..., None], centers)
        if np.allclose(new, centers):
            break
        centers = new
    return centers


def kfed(data: ClientData, k: int, *, rng: np.random.Generator) -> np.ndarray:
    """k-FED [DLS21], one shot: local k-means on every client, then the server starts from
    one random client's centers, greedily adds the farthest client centers up to k, and
    runs one Lloyd step over all client centers. Not private.
    """
    local = _batched_local_kmeans(data, k, rng=rng)
    flat = local.reshape(-1, local.shape[2])
    chosen = list(local[rng.integers(data.num_clients)])
    while len(chosen) < k:
        _, far = assign(flat, np.array(chosen))
        chosen.append(flat[int(np.argmax(far))])
    return lloyd(flat, np.array(chosen[:k]), max_iter=1).centers
