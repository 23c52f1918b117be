"""Algorithm 5: Dirichlet-Multinomial Mixture initialization by moment matching (thesis §3.3.2).

Each client of a cohort S_0 picks a component ``k_i ~ U{1..K}`` and uploads
``E^i`` (one-hot at ``(k_i, m_i)``), ``P^i`` (row ``k_i`` = ``c_i / m_i``) and ``Q^i``
(row ``k_i`` = ``(c_i / m_i)^2``). The server sees only the sums (Eq. 3.7) and sets

    tau^(0) = 1/K                                                           (Eq. 3.5)
    pi_k^(0) = E_k / n_k,  n_k = sum_s E_ks                                   (Eq. 3.6)
    alpha_k^(0) = (Pbar_kj - Qbar_kj) / (Qbar_kj - Pbar_kj^2) * Pbar_k       (Eq. 3.9, A.3-A.4)

The thesis matches the moments of category ``j = 1``; the default here is the category
with the largest mean proportion (thesis §3.3.2, Algorithm 5), which is never absent from a
component and has the smallest relative variance. ``moment_category="first"`` gives the
thesis's choice.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from pfl_cli.mdm.model import ALPHA_FLOOR, MDMParams

MOMENT_CATEGORIES = ("argmax", "first")
# alpha_0 is clipped into this range when a component's proportions have (almost) no
# variance (alpha_0 -> inf) or no mass off the simplex vertices (alpha_0 -> 0).
ALPHA0_RANGE = (1e-2, 1e6)


@dataclass(frozen=True)
class InitStatistics:
    """The sums of Algorithm 5 line 8: ``e`` (K, S), ``p`` (K, C), ``q`` (K, C)."""

    e: np.ndarray
    p: np.ndarray
    q: np.ndarray


def init_client_sums(counts: np.ndarray, size_bin: np.ndarray, num_components: int, num_bins: int,
                     rng: np.random.Generator) -> InitStatistics:
    """Sum the clients' uploads of Algorithm 5 (lines 2-8) over a cohort (vectorized).

    Parameters
    ----------
    counts : ndarray of shape (n, C)
        The cohort's histograms (no empty row).
    size_bin : ndarray of shape (n,)
        Size bin of each client.
    """
    n = counts.shape[0]
    k = rng.integers(num_components, size=n)                               # line 3: k_i ~ U{1..K}
    if n >= num_components and len(np.unique(k)) < num_components:
        # Guard (pflx's, around thesis Algorithm 5): an empty component has n_k = 0; give each one client.
        k[rng.permutation(n)[:num_components]] = np.arange(num_components)
    prop = counts / counts.sum(axis=1, keepdims=True)                       # line 5: c_i / m_i
    onehot = np.zeros((n, num_components))
    onehot[np.arange(n), k] = 1.0
    e = np.zeros((num_components, num_bins))
    np.add.at(e, (k, size_bin), 1.0)                                        # line 4
    return InitStatistics(e=e, p=onehot.T @ prop, q=onehot.T @ (prop * prop))   # lines 5, 6, 8


def init_from_sums(sums: InitStatistics, size_edges: np.ndarray, *, moment_category: str = "argmax") -> MDMParams:
    """The server side of Algorithm 5 (lines 9-13) from summed statistics, with guards.

    Sums may be noisy (DP): negative entries are clamped first.
    """
    e = np.maximum(sums.e, 0.0)
    k, c = sums.p.shape
    n_k = np.maximum(e.sum(axis=1), 1.0)                                    # line 9 (typo "S" = M)
    p_bar = np.clip(sums.p / n_k[:, None], 0.0, 1.0)                        # line 10
    q_bar = np.clip(sums.q / n_k[:, None], 0.0, 1.0)
    tau = np.full(k, 1.0 / k)                                               # line 11, Eq. (3.5)
    pi = np.where(e.sum(axis=1, keepdims=True) > 0, e / np.maximum(e.sum(axis=1, keepdims=True), 1e-300),
                  1.0 / e.shape[1])                                         # line 12, Eq. (3.6)
    if moment_category == "first":
        j = np.zeros(k, dtype=np.int64)
    else:
        j = np.argmax(p_bar, axis=1)
    rows = np.arange(k)
    pj, qj = p_bar[rows, j], q_bar[rows, j]
    num, var = pj - qj, qj - pj * pj                                        # Eq. (A.3)
    with np.errstate(divide="ignore", invalid="ignore"):
        alpha0 = np.where(var > 1e-12, num / np.where(var > 1e-12, var, 1.0), ALPHA0_RANGE[1])
    alpha0 = np.clip(np.nan_to_num(alpha0, nan=ALPHA0_RANGE[0]), *ALPHA0_RANGE)
    mean = p_bar / np.maximum(p_bar.sum(axis=1, keepdims=True), 1e-300)
    mean = np.where(p_bar.sum(axis=1, keepdims=True) > 0, mean, 1.0 / c)
    alpha = alpha0[:, None] * mean                                          # line 13, Eq. (A.4)
    # A category absent from a component's init clients would get alpha = 0 (invalid).
    floor = np.maximum(1e-3 * alpha.mean(axis=1, keepdims=True), ALPHA_FLOOR)
    alpha = np.maximum(alpha, floor)
    return MDMParams(tau=tau, alpha=alpha, size_probs=pi, size_edges=size_edges)


def moment_match(proportions: np.ndarray, *, moment_category: str = "argmax") -> np.ndarray:
    """Dirichlet parameters from the first two moments of proportion vectors (Eqs. A.1-A.4).

    Parameters
    ----------
    proportions : ndarray of shape (n, C)
        Rows on the simplex, assumed drawn from one Dirichlet.

    Returns
    -------
    ndarray of shape (C,)

    Examples
    --------
    >>> rng = np.random.default_rng(0)
    >>> a = moment_match(rng.dirichlet([2.0, 4.0, 6.0], size=200000))
    >>> bool(np.allclose(a, [2.0, 4.0, 6.0], rtol=0.03))
    True
    """
    p = np.asarray(proportions, dtype=np.float64)
    sums = InitStatistics(e=np.full((1, 1), float(len(p))), p=p.sum(axis=0)[None, :], q=(p * p).sum(axis=0)[None, :])
    return init_from_sums(sums, np.array([1, 2]), moment_category=moment_category).alpha[0]
