"""Descriptor analysis (PeFLL thesis §4.4, Fig. 4.1, Figs. B.12-B.14).

Do clients with similar data get similar descriptors? For each unseen client i, Spearman's
rank correlation between its descriptor distances d^v_ij = ||v(S_i) - v(S_j)|| and its
label-distribution distances d^pi_ij = ||pi_i - pi_j|| to every other client j, averaged over
the unseen clients. pi_i is the empirical class distribution of client i's fit samples (the
samples its descriptor is built from).
"""

from __future__ import annotations

import numpy as np


def label_distributions(store, clients: np.ndarray) -> np.ndarray:
    """pi (n, C): the class proportions of each client's fit samples with labels (zeros for none)."""
    import torch

    from pfl_cli.fl.distributed import split_cohort

    sel = torch.as_tensor(np.asarray(clients, dtype=np.int64), device=store.device)
    rows, length = store.fit.rows(sel)
    return split_cohort(_label_distributions, store, rows, {"rows": rows, "length": length}, store=store).cpu().numpy()


def _label_distributions(store, rows, length):
    import torch

    y = store.y_eval[rows]
    valid = (torch.arange(rows.shape[1], device=rows.device) < length[:, None]) & (y >= 0)
    counts = torch.zeros(len(rows), store.num_classes, device=rows.device)
    counts.scatter_add_(1, y.clamp_min(0), valid.to(counts.dtype))
    return counts / counts.sum(1, keepdim=True).clamp_min(1.0)


def mean_spearman(queries: np.ndarray, a: np.ndarray, b: np.ndarray) -> float:
    """Mean over ``queries`` of Spearman's rho between rows of distance matrices ``a`` and ``b`` (self excluded)."""
    from scipy.stats import rankdata

    n = a.shape[0]
    rhos = []
    keep = ~np.eye(n, dtype=bool)
    ra = rankdata(a[queries][keep[queries]].reshape(len(queries), n - 1), axis=1)
    rb = rankdata(b[queries][keep[queries]].reshape(len(queries), n - 1), axis=1)
    ra -= ra.mean(1, keepdims=True)
    rb -= rb.mean(1, keepdims=True)
    denom = np.sqrt((ra ** 2).sum(1) * (rb ** 2).sum(1))
    rhos = np.where(denom > 0, (ra * rb).sum(1) / np.where(denom > 0, denom, 1.0), np.nan)
    return float(np.nanmean(rhos)) if np.isfinite(rhos).any() else float("nan")


def descriptor_rank_correlation(alg, queries: np.ndarray) -> float:
    """Spearman correlation of descriptor and label-distribution distances, averaged over ``queries``.

    ``alg`` is a PeFLL model (``descriptors(clients, gen)``); every client of the store is a
    comparison point. NaN when there are fewer than two queries' worth of clients.
    """
    import torch

    from pfl_cli.rng import torch_generator

    store = alg.store
    everyone = np.arange(store.num_clients)
    if len(queries) == 0 or store.num_clients < 3:
        return float("nan")
    v = alg.descriptors(everyone, torch_generator(alg.cfg.seed, "descriptor-analysis")).detach().cpu().double()
    pi = torch.as_tensor(label_distributions(store, everyone), dtype=torch.float64)
    return mean_spearman(np.asarray(queries), torch.cdist(v, v).numpy(), torch.cdist(pi, pi).numpy())
