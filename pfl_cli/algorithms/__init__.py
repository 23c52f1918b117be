"""Federated algorithms plugged into the round loop of ``pfl_cli.fl``: one module each."""

from __future__ import annotations

from pfl_cli.algorithms.base import Algorithm
from pfl_cli.algorithms.centaur import CENTAUR
from pfl_cli.algorithms.fedavg import FedAvg
from pfl_cli.algorithms.ldp_fedavg import LDPFedAvg
from pfl_cli.algorithms.local import Local
from pfl_cli.algorithms.pefll import PeFLL
from pfl_cli.algorithms.ppsgd import PPSGD

REGISTRY: dict[str, type[Algorithm]] = {cls.name: cls for cls in (PeFLL, FedAvg, Local, LDPFedAvg, PPSGD, CENTAUR)}

__all__ = ["Algorithm", "CENTAUR", "FedAvg", "LDPFedAvg", "Local", "PPSGD", "PeFLL", "REGISTRY"]
