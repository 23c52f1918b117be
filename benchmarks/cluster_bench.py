"""Benchmark: full FedDP-KMeans on the thesis's mixture (100 clients x 1000 points, d=100, k=10).

Target: under 5 s on the 2-core dev machine. Prints the time of ``fit_feddp_kmeans`` (FedDP-Init
+ 1 FedDP-Lloyds step, budget calibration included) and, as the in-run baseline, one
non-private centralized k-means (k-means++ + Lloyd) on the same pooled data.

    python benchmarks/cluster_bench.py
"""

from __future__ import annotations

import sys
import time

import numpy as np
from verdict import Verdicts

from pfl_cli.cluster import fit_feddp_kmeans
from pfl_cli.cluster.kmeans import kmeans, kmeans_cost
from pfl_cli.data.synthetic import GaussianMixtureSpec, client_points, server_points

TARGET_S = 5.0


def main() -> int:
    spec = GaussianMixtureSpec()  # d=100, k=10, 100 clients x 1000 points, |Q| = 300
    x, _, owner = client_points(spec)
    q, _ = server_points(spec)
    offsets = np.searchsorted(owner, np.arange(spec.num_clients + 1))
    rows = []
    for label, kw in (("FedDP-Init, T=0", dict(lloyds_steps=0)), ("FedDP-Init + 1 FedDP-Lloyds", dict(lloyds_steps=1))):
        start = time.perf_counter()
        res = fit_feddp_kmeans(x, offsets, q, k=10, epsilon=1.0, rng=np.random.default_rng(0), **kw)
        rows.append((label, time.perf_counter() - start, kmeans_cost(x, res.centers) / len(x), res.epsilon))
    start = time.perf_counter()
    ref = kmeans(x, 10, rng=np.random.default_rng(0), n_init=1)
    base = time.perf_counter() - start
    print(f"data: {spec.num_clients} clients x {spec.client_size} points, d={spec.d}, k={spec.k}")
    v = Verdicts()
    for label, secs, cost, eps in rows:
        v.check(label, f"{secs:.2f} s", f"< {TARGET_S:.0f} s", secs < TARGET_S)
        v.note("  vs centralized k-means, cost/m, epsilon", f"{secs / base:.2f}x, {cost:.3f}, {eps:.4f}")
    v.note("centralized k-means (reference), cost/m", f"{base:.2f} s, {ref.cost / len(x):.3f}")
    return v.finish()


if __name__ == "__main__":
    sys.exit(main())
