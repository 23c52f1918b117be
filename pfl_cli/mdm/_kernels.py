"""Vectorized kernels of MDM fitting (inputs assumed valid; no per-client Python loop).

The clients' histograms are re-encoded once as a sparse one-hot matrix ``Z`` (n x D) over
the D distinct *(category, count > 0)* pairs present in the data. Because the client
terms of Algorithm 6 depend on a count only through ``g(c + a) - g(a)`` (``g`` = lgamma
or digamma), which is 0 for ``c = 0``, every per-client sum over categories becomes one
sparse product with a K x D table evaluated once per round:

    sum_j [lgamma(c_ij + a_kj) - lgamma(a_kj)] = (Z @ T.T)[i, k],
    T[k, p] = lgamma(v_p + a_{k, j_p}) - lgamma(a_{k, j_p})

and the summed statistic ``u_k = sum_i w_ik (psi(c_i + a_k) - psi(a_k))`` (Eq. 3.16) is
``sum_p (Z.T @ w)[p, k] * (psi(v_p + a_{k,j_p}) - psi(a_{k,j_p}))`` grouped by category.
Clients are processed in fixed-size row chunks, so the work space does not grow with n.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

import numpy as np
from scipy import sparse
from scipy.special import digamma, gammaln

from pfl_cli.mdm.model import LOG_PI_FLOOR, MDMParams

CHUNK = 32768


@dataclass(frozen=True)
class ClientData:
    """Clients' histograms re-encoded for the kernels (built once per fit).

    Attributes
    ----------
    z : scipy.sparse.csr_matrix of shape (n, D)
        One-hot of each client's (category, count) pairs with count > 0.
    pair_cat, pair_val : ndarray of shape (D,)
        Category and count of each pair.
    sizes : ndarray of shape (n,)
        ``m_i``.
    size_idx : ndarray of shape (n,)
        Index of ``m_i`` in ``size_vals`` (distinct sizes).
    size_vals : ndarray of shape (Dm,)
    const : ndarray of shape (n,)
        Terms of ``log q`` that do not depend on the parameters: the multinomial
        coefficient ``lgamma(m+1) - sum_j lgamma(c_j+1)``.
    num_categories : int
    """

    z: sparse.csr_matrix
    pair_cat: np.ndarray
    pair_val: np.ndarray
    sizes: np.ndarray
    size_idx: np.ndarray
    size_vals: np.ndarray
    const: np.ndarray
    num_categories: int

    @property
    def num_clients(self) -> int:
        return int(self.sizes.shape[0])

    @cached_property
    def chunks(self) -> tuple["ClientData", ...]:
        """The clients in row blocks of at most ``CHUNK`` (sliced once, reused every round)."""
        n = self.num_clients
        if n <= CHUNK:
            return (self,)
        return tuple(self.rows(slice(s, min(s + CHUNK, n))) for s in range(0, n, CHUNK))

    def rows(self, rows: np.ndarray | slice) -> "ClientData":
        """The clients ``rows`` (a cohort or a chunk), sharing the pair encoding."""
        return ClientData(self.z[rows], self.pair_cat, self.pair_val, self.sizes[rows], self.size_idx[rows],
                          self.size_vals, self.const[rows], self.num_categories)


def encode(counts: np.ndarray) -> ClientData:
    """Build :class:`ClientData` from a dense (n, C) int64 count matrix with no empty row."""
    n, c = counts.shape
    rows, cols = np.nonzero(counts)
    vals = counts[rows, cols]
    # Distinct (category, count) pairs: key = category * (max+1) + count.
    base = int(vals.max()) + 1 if vals.size else 1
    keys, inverse = np.unique(cols.astype(np.int64) * base + vals, return_inverse=True)
    z = sparse.csr_matrix((np.ones(len(rows)), (rows, inverse.ravel())), shape=(n, len(keys)))
    sizes = counts.sum(axis=1)
    size_vals, size_idx = np.unique(sizes, return_inverse=True)
    const = gammaln(sizes + 1.0) - np.bincount(rows, weights=gammaln(vals + 1.0), minlength=n)
    return ClientData(z, (keys // base).astype(np.int64), (keys % base).astype(np.float64), sizes,
                      size_idx.ravel(), size_vals.astype(np.float64), const, c)


@dataclass(frozen=True)
class Tables:
    """Per-round K x D and K x Dm tables of the current parameters."""

    log_pair: np.ndarray     # lgamma(v + a) - lgamma(a) per pair, (K, D)
    log_size: np.ndarray     # lgamma(a0) - lgamma(m + a0) + log pi_k(m) per distinct size, (K, Dm)
    log_tau: np.ndarray      # (K,)


def tables(data: ClientData, params: MDMParams) -> Tables:
    a = params.alpha[:, data.pair_cat]
    log_pair = gammaln(data.pair_val[None, :] + a) - gammaln(a)
    a0 = params.alpha.sum(axis=1)[:, None]
    b = params.size_bin(data.size_vals.astype(np.int64))
    width = np.diff(params.size_edges).astype(np.float64)
    with np.errstate(divide="ignore"):
        log_pi = np.maximum(np.log(params.size_probs), LOG_PI_FLOOR) - np.log(width)[None, :]
    # Sizes outside the model's support (only possible for clients it was not fitted on).
    log_pi_m = np.where(b[None, :] >= 0, log_pi[:, np.maximum(b, 0)], LOG_PI_FLOOR)
    log_size = gammaln(a0) - gammaln(data.size_vals[None, :] + a0) + log_pi_m
    with np.errstate(divide="ignore"):
        log_tau = np.maximum(np.log(params.tau), LOG_PI_FLOOR)
    return Tables(log_pair, log_size, log_tau)


def e_step(chunk: ClientData, tab: Tables) -> tuple[np.ndarray, np.ndarray]:
    """Responsibilities ``w`` (K, rows) (Alg. 6 line 6) and ``log q`` per client (Eq. 3.4).

    ``w`` is a softmax in log space: the multinomial coefficient is the same for every
    component and cancels, so it enters only ``log q``. Arrays are component-major
    (K, rows) so the reductions over K run as whole-row operations.
    """
    logits = np.ascontiguousarray(np.asarray(chunk.z @ tab.log_pair.T).T)
    logits += tab.log_size[:, chunk.size_idx]
    logits += tab.log_tau[:, None]
    top = logits.max(axis=0)
    logits -= top
    w = np.exp(logits, out=logits)
    total = w.sum(axis=0)
    w /= total
    return w, top + np.log(total) + chunk.const


@dataclass(frozen=True)
class SummedStatistics:
    """The sums the server receives in one round of Algorithm 6 (Eqs. 3.15-3.16).

    ``omega`` (K,) = sum_i w^i; ``e`` (K, S) = sum_i E^i; ``u`` (K, C) = sum_i u^i;
    ``v`` (K,) = sum_i v^i; ``cohort_size`` = |S|, public. ``log_likelihood`` is the
    cohort's log-likelihood at the parameters the statistics were computed with.
    """

    omega: np.ndarray
    e: np.ndarray
    u: np.ndarray
    v: np.ndarray
    cohort_size: int
    log_likelihood: float = float("nan")


def summed_statistics(data: ClientData, params: MDMParams) -> SummedStatistics:
    """``sum_i`` of every client statistic of Algorithm 6 (lines 6-9) over ``data``, chunked."""
    k, s = params.num_components, params.size_probs.shape[1]
    tab = tables(data, params)
    omega = np.zeros(k)
    w_pair = np.zeros((k, tab.log_pair.shape[1]))
    w_size = np.zeros((k, len(data.size_vals)))
    ll = 0.0
    for chunk in data.chunks:
        w, logq = e_step(chunk, tab)
        omega += w.sum(axis=1)
        w_pair += np.asarray(chunk.z.T @ w.T).T
        for j in range(k):  # K bincounts, not a loop over clients
            w_size[j] += np.bincount(chunk.size_idx, weights=w[j], minlength=len(data.size_vals))
        ll += float(logq.sum())
    return _finish(data, params, omega, w_pair, w_size, ll, s)


def _finish(data, params, omega, w_pair, w_size, ll, s) -> SummedStatistics:
    a = params.alpha[:, data.pair_cat]
    dig_pair = digamma(data.pair_val[None, :] + a) - digamma(a)           # Eq. (3.13), per pair
    u = np.zeros((params.num_components, data.num_categories))
    for j in range(params.num_components):
        u[j] = np.bincount(data.pair_cat, weights=w_pair[j] * dig_pair[j], minlength=data.num_categories)
    a0 = params.alpha.sum(axis=1)[:, None]
    v = (w_size * (digamma(data.size_vals[None, :] + a0) - digamma(a0))).sum(axis=1)   # Eq. (3.14)
    b = params.size_bin(data.size_vals.astype(np.int64))
    e = np.zeros((params.num_components, s))
    inside = b >= 0
    for j in range(params.num_components):
        e[j] = np.bincount(b[inside], weights=w_size[j, inside], minlength=s)
    return SummedStatistics(omega, e, u, v, data.num_clients, ll)


def client_log_likelihood(data: ClientData, params: MDMParams) -> np.ndarray:
    """``log q(c_i, m_i)`` of every client (chunked)."""
    tab = tables(data, params)
    return np.concatenate([e_step(chunk, tab)[1] for chunk in data.chunks])


def client_statistics(data: ClientData, params: MDMParams, rows: slice | np.ndarray):
    """Per-client statistics ``(w, size_bin, u, v)`` of Algorithm 6 for ``rows`` (for clipping).

    ``w`` (r, K); ``size_bin`` (r,) -- ``E^i`` is ``w^i`` placed in column ``size_bin[i]``;
    ``u`` (r, K, C); ``v`` (r, K). Memory is r x K x C: call it chunk by chunk.
    """
    chunk = data.rows(rows)
    w = e_step(chunk, tables(chunk, params))[0].T
    a = params.alpha[:, data.pair_cat]
    dig_pair = digamma(data.pair_val[None, :] + a) - digamma(a)
    coo = chunk.z.tocoo()
    u = np.zeros((chunk.num_clients, params.num_components, data.num_categories))
    u[coo.row, :, data.pair_cat[coo.col]] = dig_pair[:, coo.col].T
    u *= w[:, :, None]
    a0 = params.alpha.sum(axis=1)
    m = chunk.sizes.astype(np.float64)[:, None]
    v = w * (digamma(m + a0[None, :]) - digamma(a0)[None, :])
    return w, params.size_bin(chunk.sizes), u, v
