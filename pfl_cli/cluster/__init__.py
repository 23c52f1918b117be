"""Differentially private federated k-means: FedDP-Init + FedDP-Lloyds (thesis ch. 6).

See :func:`fit_feddp_kmeans` (the public entry point) and :func:`evaluate_clustering`.
"""

from pfl_cli.lazy import lazy_names

# The names load on first use (PEP 562): ClusterConfig reads pfl_cli.cluster.config alone, so a refused
# `pflx cluster` never loads the core's scipy and dp_accounting (issue 49, finding 20).
_WHERE = {"INITS": "config", "ClusterConfig": "config", "ClusterResult": "api", "evaluate_clustering": "api",
          "fit_feddp_kmeans": "api"}

__all__ = ["INITS", "ClusterConfig", "ClusterResult", "evaluate_clustering", "fit_feddp_kmeans"]


__getattr__, __dir__ = lazy_names(__name__, _WHERE)
