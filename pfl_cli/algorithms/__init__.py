"""Federated algorithms plugged into the round loop of ``pfl_cli.fl``: one module each.

Which names exist, built-in or plugin, is :mod:`pfl_cli.registry`'s to say.
"""

from __future__ import annotations

from pfl_cli.algorithms.apfl import APFL
from pfl_cli.algorithms.base import Algorithm
from pfl_cli.algorithms.centaur import CENTAUR
from pfl_cli.algorithms.ditto import Ditto
from pfl_cli.algorithms.fedavg import FedAvg
from pfl_cli.algorithms.fedper import FedPer
from pfl_cli.algorithms.fedprox import FedProx
from pfl_cli.algorithms.fedrep import FedRep
from pfl_cli.algorithms.fedtta import FedTTA
from pfl_cli.algorithms.flowdup import FLowDUP, LDFedAvg
from pfl_cli.algorithms.hyperfl import HyperFL
from pfl_cli.algorithms.knnper import KNNPer
from pfl_cli.algorithms.ldp_fedavg import LDPFedAvg
from pfl_cli.algorithms.lgfedavg import LGFedAvg
from pfl_cli.algorithms.local import Local
from pfl_cli.algorithms.hyperfl_lpm import HyperFLLPM
from pfl_cli.algorithms.pefll import PeFLL
from pfl_cli.algorithms.perfedavg import PerFedAvg
from pfl_cli.algorithms.pfedhn import PFedHN, PFedHNPC
from pfl_cli.algorithms.pfedme import PFedMe
from pfl_cli.algorithms.ppsgd import PPSGD


__all__ = ["APFL", "Algorithm", "CENTAUR", "Ditto", "FLowDUP", "FedAvg", "FedPer", "FedTTA", "FedProx", "FedRep", "HyperFL",
           "HyperFLLPM", "KNNPer", "LDFedAvg", "LDPFedAvg", "LGFedAvg", "Local", "PFedHN", "PFedHNPC", "PFedMe", "PPSGD", "PeFLL",
           "PerFedAvg"]
