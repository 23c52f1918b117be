"""FedDP-Lloyds (thesis §6.3.2, Algorithm 12): private Lloyd steps.

for t = 1..T: clients assign their points to the nearest of nu^{t-1} in the **full**
space and send per-cluster sums and counts; the server receives their secure-aggregation
sums plus Gaussian / Laplace noise and sets nu_j^t = m_j / n_j.

Per-round noise (``budget.plan_noise``): ``basic_text`` -- the text's
``Delta * sigma(eps_G / T, delta / T)`` and ``Lap(T / eps_L)`` (default); ``pld_joint`` --
the T rounds calibrated together by the PLD accountant, as the authors' code does [C].
"""

from __future__ import annotations

from typing import Callable

import numpy as np

from pfl_cli.cluster import federated
from pfl_cli.cluster.federated import ClientData
from pfl_cli.cluster.feddp_init import _release, server_centers


def feddp_lloyds(
    data: ClientData,
    centers: np.ndarray,
    *,
    steps: int,
    sums_scale: float,
    counts_scale: float,
    clip_sums: float | None,
    clip_counts: float | None,
    rng: np.random.Generator,
    on_step: Callable[[str], None] | None = None,
) -> np.ndarray:
    """Run ``steps`` rounds of FedDP-Lloyds from ``centers``; returns the (k, d) centers.

    ``sums_scale`` / ``counts_scale`` are the per-round noise (0: non-private); the clip
    bounds are the client-level ones (None at data-point level). ``on_step(name)`` is called
    after each round (progress).
    """
    centers = np.array(centers, dtype=np.float64)
    for t in range(steps):  # lines 2-12
        sums, counts = federated.cluster_sums_and_counts(data, centers, clip_sums=clip_sums, clip_counts=clip_counts)
        noisy_sums = _release(sums, sums_scale, "gaussian", rng)
        noisy_counts = _release(counts, counts_scale, "laplace", rng)
        centers = server_centers(noisy_sums, noisy_counts, fallback=centers)
        if on_step is not None:
            on_step(f"FedDP-Lloyds step {t + 1}/{steps}")
    return centers
