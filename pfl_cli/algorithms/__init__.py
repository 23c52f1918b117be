"""Federated algorithms plugged into the round loop of ``pfl_cli.fl``: one module each."""

from __future__ import annotations

from pfl_cli.algorithms.base import Algorithm
from pfl_cli.algorithms.fedavg import FedAvg
from pfl_cli.algorithms.local import Local
from pfl_cli.algorithms.hyperfl import HyperFL
from pfl_cli.algorithms.pefll import PeFLL
from pfl_cli.algorithms.pfedhn import PFedHN, PFedHNPC

REGISTRY: dict[str, type[Algorithm]] = {cls.name: cls for cls in (PeFLL, FedAvg, Local, PFedHN, PFedHNPC, HyperFL)}

__all__ = ["Algorithm", "FedAvg", "HyperFL", "Local", "PFedHN", "PFedHNPC", "PeFLL", "REGISTRY"]
