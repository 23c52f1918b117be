"""Differentially private federated k-means: FedDP-Init + FedDP-Lloyds (thesis ch. 6).

See :func:`fit_feddp_kmeans` (the public entry point) and :func:`evaluate_clustering`.
"""

from pfl_cli.cluster.api import INITS, ClusterConfig, ClusterResult, evaluate_clustering, fit_feddp_kmeans

__all__ = ["INITS", "ClusterConfig", "ClusterResult", "evaluate_clustering", "fit_feddp_kmeans"]
