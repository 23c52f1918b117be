"""Federated algorithms plugged into the round loop of ``pfl_cli.fl``: one module each.

Which names exist, built-in or plugin, is :mod:`pfl_cli.registry`'s to say.
"""

from __future__ import annotations

import importlib

# Name -> module, imported on first use: importing the package (as every algorithm module does) must not
# import torch, which a refusal or an "up to date" answer of `pflx train` never needs (DESIGN section 2).
_WHERE = {
    "APFL": "pfl_cli.algorithms.apfl",
    "Algorithm": "pfl_cli.algorithms.base",
    "CENTAUR": "pfl_cli.algorithms.centaur",
    "Ditto": "pfl_cli.algorithms.ditto",
    "FedAvg": "pfl_cli.algorithms.fedavg",
    "FedPer": "pfl_cli.algorithms.fedper",
    "FedProx": "pfl_cli.algorithms.fedprox",
    "FedRep": "pfl_cli.algorithms.fedrep",
    "FedTTA": "pfl_cli.algorithms.fedtta",
    "FLowDUP": "pfl_cli.algorithms.flowdup",
    "LDFedAvg": "pfl_cli.algorithms.flowdup",
    "HyperFL": "pfl_cli.algorithms.hyperfl",
    "KNNPer": "pfl_cli.algorithms.knnper",
    "LDPFedAvg": "pfl_cli.algorithms.ldp_fedavg",
    "LGFedAvg": "pfl_cli.algorithms.lgfedavg",
    "Local": "pfl_cli.algorithms.local",
    "HyperFLLPM": "pfl_cli.algorithms.hyperfl_lpm",
    "PeFLL": "pfl_cli.algorithms.pefll",
    "PerFedAvg": "pfl_cli.algorithms.perfedavg",
    "PFedHN": "pfl_cli.algorithms.pfedhn",
    "PFedHNPC": "pfl_cli.algorithms.pfedhn",
    "PFedMe": "pfl_cli.algorithms.pfedme",
    "PPSGD": "pfl_cli.algorithms.ppsgd",
}


def __getattr__(name: str):
    if name in _WHERE:
        return getattr(importlib.import_module(_WHERE[name]), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = ["APFL", "Algorithm", "CENTAUR", "Ditto", "FLowDUP", "FedAvg", "FedPer", "FedTTA", "FedProx", "FedRep", "HyperFL",
           "HyperFLLPM", "KNNPer", "LDFedAvg", "LDPFedAvg", "LGFedAvg", "Local", "PFedHN", "PFedHNPC", "PFedMe", "PPSGD", "PeFLL",
           "PerFedAvg"]
