"""Differentially private federated k-means: FedDP-Init + FedDP-Lloyds (thesis ch. 6).

See :func:`fit_feddp_kmeans` (the public entry point) and :func:`evaluate_clustering`.
"""

# The names load on first use (PEP 562): ClusterConfig reads pfl_cli.cluster.config alone, so a refused
# `pflx cluster` never loads the core's scipy and dp_accounting (issue 49, finding 20).
_WHERE = {"INITS": "config", "ClusterConfig": "config", "ClusterResult": "api", "evaluate_clustering": "api",
          "fit_feddp_kmeans": "api"}

__all__ = ["INITS", "ClusterConfig", "ClusterResult", "evaluate_clustering", "fit_feddp_kmeans"]


def __getattr__(name: str):
    if name not in _WHERE:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(f"{__name__}.{_WHERE[name]}"), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
