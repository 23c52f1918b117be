"""The Mixture-of-Dirichlet-Multinomials (MDM) model: parameters, pmf, log-likelihood.

Thesis ch. 3 (§3.3.1, Eqs. (3.1)-(3.4)). A client is a histogram ``c`` over ``C`` categories
with ``m = sum(c)`` samples. Under the model a client is one draw of

    k ~ Categorical(tau), m ~ pi_k, p ~ Dir(alpha_k), c ~ Mult(m, p)          (Eqs. 3.1-3.3)

so its probability is ``q(c, m) = sum_k tau_k p(c | m, alpha_k) pi_k(m)`` and the data
log-likelihood is ``L = sum_i log q(c_i, m_i)`` (Eq. 3.4). Everything is computed in log
space with ``gammaln``.

The number-of-samples distribution ``pi_k`` lives on integer bins ``[edges[b],
edges[b+1])``: one bin per integer ``1..M`` (the thesis's per-integer ``Pi``) or wider bins
(``sample_bins``); within a bin sizes are uniform, so ``pi_k(m) = Pi[k, b(m)] / width_b``
and ``q`` stays a normalized pmf over ``(c, m)``.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

# Numeric guards (pflx's, around thesis Eqs. (3.1)-(3.4)). A size bin a component never saw has Pi = 0; its log
# is floored so that a client whose size no component covers still gets finite weights.
LOG_PI_FLOOR = float(np.log(1e-12))
ALPHA_FLOOR = 1e-6
TAU_FLOOR = 1e-12


@dataclass(frozen=True)
class MDMParams:
    """Parameters ``(tau, A, Pi)`` of an MDM with K components over C categories.

    Attributes
    ----------
    tau : ndarray of shape (K,)
        Component weights, on the simplex.
    alpha : ndarray of shape (K, C)
        Dirichlet parameters, all > 0.
    size_probs : ndarray of shape (K, S)
        ``Pi``: each row a distribution over the S size bins.
    size_edges : ndarray of shape (S + 1,), int64
        Bin ``b`` holds the sizes ``edges[b] <= m < edges[b + 1]``; one bin per integer
        ``1..M`` is ``edges = [1, 2, ..., M + 1]``.
    """

    tau: np.ndarray
    alpha: np.ndarray
    size_probs: np.ndarray
    size_edges: np.ndarray

    def __post_init__(self) -> None:
        tau = np.asarray(self.tau, dtype=np.float64)
        alpha = np.asarray(self.alpha, dtype=np.float64)
        probs = np.asarray(self.size_probs, dtype=np.float64)
        edges = np.asarray(self.size_edges, dtype=np.int64)
        k = tau.shape[0] if tau.ndim == 1 else -1
        if tau.ndim != 1 or alpha.ndim != 2 or alpha.shape[0] != k or probs.ndim != 2 or probs.shape[0] != k:
            raise ValueError(
                f"MDMParams shapes must be tau (K,), alpha (K, C), size_probs (K, S); got {tau.shape}, "
                f"{alpha.shape}, {probs.shape}."
            )
        if edges.shape != (probs.shape[1] + 1,) or edges[0] < 1 or np.any(np.diff(edges) < 1):
            raise ValueError(f"size_edges must be {probs.shape[1] + 1} increasing integers >= 1; got {edges.tolist()}.")
        if not (np.all(np.isfinite(alpha)) and np.all(alpha > 0)):
            raise ValueError("alpha must be finite and > 0 everywhere.")
        if not (np.all(np.isfinite(tau)) and np.all(tau >= 0) and abs(tau.sum() - 1) < 1e-6):
            raise ValueError(f"tau must be a distribution (>= 0, sums to 1); got {tau.tolist()}.")
        if not (np.all(np.isfinite(probs)) and np.all(probs >= 0) and np.allclose(probs.sum(axis=1), 1, atol=1e-6)):
            raise ValueError("each row of size_probs must be a distribution (>= 0, sums to 1).")
        for name, value in (("tau", tau), ("alpha", alpha), ("size_probs", probs), ("size_edges", edges)):
            value.setflags(write=False)
            object.__setattr__(self, name, value)

    @property
    def num_components(self) -> int:
        return int(self.tau.shape[0])

    @property
    def num_categories(self) -> int:
        return int(self.alpha.shape[1])

    @property
    def max_samples(self) -> int:
        """M, the largest size the model can produce."""
        return int(self.size_edges[-1] - 1)

    @property
    def binned(self) -> bool:
        return bool(np.any(np.diff(self.size_edges) > 1))

    def size_bin(self, sizes: np.ndarray) -> np.ndarray:
        """Bin index of each size (sizes outside ``[1, M]`` get -1)."""
        sizes = np.asarray(sizes, dtype=np.int64)
        b = np.searchsorted(self.size_edges, sizes, side="right") - 1
        return np.where((sizes >= self.size_edges[0]) & (sizes < self.size_edges[-1]), b, -1)

    def size_marginal(self) -> np.ndarray:
        """``sum_k tau_k Pi_k``: the distribution of sizes over the bins."""
        return self.tau @ self.size_probs

    def mean_size(self) -> np.ndarray:
        """Expected size per component, shape (K,)."""
        mids = (self.size_edges[:-1] + self.size_edges[1:] - 1) / 2.0
        return self.size_probs @ mids


def integer_size_edges(max_samples: int) -> np.ndarray:
    """Edges of one size bin per integer ``1..M``."""
    return np.arange(1, int(max_samples) + 2, dtype=np.int64)


def binned_size_edges(max_samples: int, num_bins: int) -> np.ndarray:
    """Edges of ``num_bins`` near-equal-width integer bins covering ``1..M`` (fewer if M is small)."""
    edges = np.unique(np.rint(np.linspace(1, int(max_samples) + 1, int(num_bins) + 1)).astype(np.int64))
    return edges


def dm_log_pmf(counts: np.ndarray, alpha: np.ndarray) -> np.ndarray:
    """Dirichlet-multinomial log pmf ``log p(c | m, alpha)`` (thesis Eq. 3.1), ``m = sum(c)``.

    Parameters
    ----------
    counts : array_like of shape (n, C)
        Non-negative integer histograms.
    alpha : array_like of shape (C,) or (K, C)
        Dirichlet parameters, > 0.

    Returns
    -------
    ndarray of shape (n,) for one alpha, (n, K) for K of them.

    Examples
    --------
    >>> float(np.exp(dm_log_pmf([[1, 0]], [1.0, 1.0]))[0])  # uniform p: P(c = (1, 0)) = 1/2
    0.5
    """
    c = np.asarray(counts, dtype=np.float64)
    a = np.asarray(alpha, dtype=np.float64)
    single = a.ndim == 1
    a = np.atleast_2d(a)
    m = c.sum(axis=1)
    a0 = a.sum(axis=1)
    # Eq. (3.1): lgamma(a0) + lgamma(m+1) - lgamma(m+a0) + sum_j [lgamma(c_j+a_j) - lgamma(a_j) - lgamma(c_j+1)]
    from scipy.special import gammaln  # here, not at import: a refused mdm-fit / simulate never loads scipy

    head = gammaln(a0)[None, :] + gammaln(m + 1)[:, None] - gammaln(m[:, None] + a0[None, :])
    body = (gammaln(c[:, None, :] + a[None, :, :]) - gammaln(a)[None, :, :]).sum(axis=2) - gammaln(c + 1).sum(axis=1)[:, None]
    out = head + body
    return out[:, 0] if single else out


def component_log_joint(counts: np.ndarray, params: MDMParams) -> np.ndarray:
    """``log tau_k + log p(c_i | m_i, alpha_k) + log pi_k(m_i)`` for every client and component, (n, K).

    The direct (dense) evaluation; :mod:`pfl_cli.mdm.fit` has the fast chunked kernel.
    Sizes outside the model's range get ``-inf``.
    """
    c = np.asarray(counts, dtype=np.int64)
    m = c.sum(axis=1)
    b = params.size_bin(m)
    width = np.diff(params.size_edges).astype(np.float64)
    with np.errstate(divide="ignore"):
        log_pi = np.maximum(np.log(params.size_probs), LOG_PI_FLOOR) - np.log(width)[None, :]
        log_tau = np.log(params.tau)
    out = dm_log_pmf(c, params.alpha) + log_tau[None, :]
    out += np.where(b[:, None] >= 0, log_pi.T[np.maximum(b, 0)], -np.inf)
    return out


def log_likelihood(counts: np.ndarray, params: MDMParams, *, per_client: bool = False):
    """The MDM log-likelihood ``sum_i log q(c_i, m_i)`` (thesis Eq. 3.4).

    Parameters
    ----------
    counts : array_like of shape (n, C)
    params : MDMParams
    per_client : bool, default=False
        Return the n terms ``log q(c_i, m_i)`` instead of their sum.

    Examples
    --------
    >>> p = MDMParams(np.array([1.0]), np.array([[1.0, 1.0]]), np.array([[1.0]]), np.array([1, 2]))
    >>> round(float(log_likelihood([[1, 0], [0, 1]], p)), 6)  # two clients, each probability 1/2
    -1.386294
    """
    from scipy.special import logsumexp

    terms = logsumexp(component_log_joint(counts, params), axis=1)
    return terms if per_client else float(terms.sum())


# ---------------------------------------------------------------------------- mdm.json
def params_to_dict(params: MDMParams) -> dict:
    """The model part of ``mdm.json`` (DESIGN.md §3): K, C, tau, alpha, num_samples.

    ``num_samples.support`` lists the sizes 1..M for a per-integer model; for a binned
    one it lists each bin's smallest size, and ``bin_edges`` gives bin ``b`` as
    ``[bin_edges[b], bin_edges[b+1])`` (sizes uniform within a bin).
    """
    edges = params.size_edges
    return {
        "num_components": params.num_components,
        "num_categories": params.num_categories,
        "tau": [float(t) for t in params.tau],
        "alpha": [[float(a) for a in row] for row in params.alpha],
        "num_samples": {
            "kind": "binned" if params.binned else "integer",
            "support": [int(s) for s in edges[:-1]],
            "probs": [[float(p) for p in row] for row in params.size_probs],
            "bin_edges": [int(e) for e in edges],
        },
    }


def params_from_dict(doc: dict, *, where: str = "mdm.json") -> MDMParams:
    """Read the parameters written by :func:`params_to_dict`; ``ValueError`` naming the problem."""
    try:
        ns = doc["num_samples"]
        support = np.asarray(ns["support"], dtype=np.int64)
        edges = ns.get("bin_edges")
        edges = np.append(support, support[-1] + 1) if edges is None else np.asarray(edges, dtype=np.int64)
        params = MDMParams(tau=np.asarray(doc["tau"], dtype=np.float64), alpha=np.asarray(doc["alpha"], dtype=np.float64),
                           size_probs=np.asarray(ns["probs"], dtype=np.float64), size_edges=edges)
    except (KeyError, TypeError, IndexError, AttributeError, OverflowError) as err:
        raise ValueError(f"{where}: not an MDM document (missing or malformed {err}).") from None
    except ValueError as err:
        raise ValueError(f"{where}: {err}") from None
    if doc.get("num_components", params.num_components) != params.num_components or \
            doc.get("num_categories", params.num_categories) != params.num_categories:
        raise ValueError(f"{where}: num_components/num_categories disagree with the shapes of tau and alpha.")
    return params
