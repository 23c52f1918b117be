"""Drawing new clients from an MDM (thesis §3.1, Eqs. (3.1)-(3.3)), all clients at once.

For each client: ``k ~ Categorical(tau)``, ``m ~ pi_k`` (uniform within its size bin),
``p ~ Dir(alpha_k)``, ``c ~ Mult(m, p)``.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from pfl_cli.errors import check_param
from pfl_cli.mdm.model import MDMParams


@dataclass(frozen=True)
class SampledClients:
    """Simulated clients: ``component`` (n,), ``sizes`` (n,), ``proportions`` (n, C), ``counts`` (n, C)."""

    component: np.ndarray
    sizes: np.ndarray
    proportions: np.ndarray
    counts: np.ndarray


def _categorical_rows(probs: np.ndarray, rows: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """One draw from ``probs[rows[i]]`` for every i, by inverse CDF on the stacked rows."""
    k, s = probs.shape
    cdf = np.cumsum(probs, axis=1)
    cdf /= cdf[:, -1:]
    # Row r's CDF shifted by r makes one increasing array; search it once for all draws.
    stacked = (cdf + np.arange(k)[:, None]).ravel()
    u = rng.random(len(rows))
    idx = np.searchsorted(stacked, rows + u, side="right") - rows * s
    return np.clip(idx, 0, s - 1)


def dirichlet_rows(alpha: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """One ``Dir(alpha[i])`` draw per row, stable for tiny alpha.

    ``Gamma(a) = Gamma(a + 1) * U^(1/a)`` in log space keeps rows with all-small
    parameters from underflowing to 0/0.
    """
    log_g = np.log(rng.standard_gamma(alpha + 1.0)) + np.log(rng.random(alpha.shape)) / alpha
    log_g -= log_g.max(axis=1, keepdims=True)
    p = np.exp(log_g)
    return p / p.sum(axis=1, keepdims=True)


def sample_sizes(params: MDMParams, component: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """A size ``m ~ pi_k`` for each client's component (uniform within a bin)."""
    b = _categorical_rows(params.size_probs, component, rng)
    lo, width = params.size_edges[b], np.diff(params.size_edges)[b]
    return lo + np.floor(rng.random(len(b)) * width).astype(np.int64)


def sample_clients(params: MDMParams, num_clients: int, *, rng: np.random.Generator) -> SampledClients:
    """Draw ``num_clients`` clients from the MDM (vectorized over clients).

    Parameters
    ----------
    params : MDMParams
    num_clients : int
    rng : numpy.random.Generator

    Returns
    -------
    SampledClients

    Examples
    --------
    >>> p = MDMParams(np.array([0.5, 0.5]), np.array([[1.0, 1.0], [5.0, 0.1]]), np.array([[1.0], [1.0]]), np.array([10, 11]))
    >>> s = sample_clients(p, 4, rng=np.random.default_rng(0))
    >>> s.counts.sum(axis=1).tolist()
    [10, 10, 10, 10]
    """
    ok = isinstance(num_clients, (int, np.integer)) and not isinstance(num_clients, bool) and num_clients >= 0
    check_param("num_clients", ok, "must be an integer >= 0", num_clients)
    n = int(num_clients)
    component = _categorical_rows(params.tau[None, :], np.zeros(n, dtype=np.int64), rng)
    sizes = sample_sizes(params, component, rng)
    proportions = dirichlet_rows(params.alpha[component], rng)
    counts = rng.multinomial(sizes, proportions) if n else np.zeros((0, params.num_categories), dtype=np.int64)
    return SampledClients(component, sizes, proportions, np.asarray(counts, dtype=np.int64))
