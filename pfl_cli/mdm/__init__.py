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

from pfl_cli.mdm.fit import MDMFit, check_counts, fit_mdm, server_update
from pfl_cli.mdm.model import MDMParams, dm_log_pmf, log_likelihood
from pfl_cli.mdm.sample import SampledClients, sample_clients

__all__ = [
    "MDMFit", "MDMParams", "SampledClients", "check_counts", "dm_log_pmf", "fit_mdm", "log_likelihood",
    "sample_clients", "server_update",
]
