"""MDM: Mixture-of-Dirichlet-Multinomials over client histograms (thesis ch. 3, App. A).

Fit how real clients' label histograms are distributed, then draw new clients that are
heterogeneous the same way:

>>> import numpy as np
>>> from pfl_cli.mdm import MDMParams, fit_mdm, sample_clients
>>> true = MDMParams(np.array([1.0]), np.array([[2.0, 1.0, 1.0]]), np.array([[1.0]]), np.array([30, 31]))
>>> counts = sample_clients(true, 500, rng=np.random.default_rng(0)).counts
>>> fit = fit_mdm(counts, num_components=1, rounds=20, rng=np.random.default_rng(1))
>>> fit.params.alpha.shape
(1, 3)
"""

from pfl_cli.lazy import lazy_names

# The names load on first use (PEP 562): the fit and the log-likelihood need scipy, which a refused
# or up-to-date mdm-fit / simulate never loads (issue 49, finding 20).
_WHERE = {
    "MDMFit": "fit", "check_counts": "fit", "fit_mdm": "fit", "server_update": "fit",
    "MDMParams": "model", "dm_log_pmf": "model", "log_likelihood": "model",
    "SampledClients": "sample", "sample_clients": "sample",
}

__all__ = [
    "MDMFit", "MDMParams", "SampledClients", "check_counts", "dm_log_pmf", "fit_mdm", "log_likelihood",
    "sample_clients", "server_update",
]


__getattr__, __dir__ = lazy_names(__name__, _WHERE)
