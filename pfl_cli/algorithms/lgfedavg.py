"""LG-FedAvg (Liang et al., 2020, Algorithm 1): local representations, a global head.

The mirror image of FedPer: every client keeps its own body (local representation) and
the server averages only the head, weighted by client data size. Each round a cohort
client trains its body and the global head jointly with k local SGD steps (or
``local_epochs``). A new client trains its own body from the shared initialization for
``new_client_epochs`` epochs under the frozen global head.
"""

from __future__ import annotations

from dataclasses import dataclass

from pfl_cli.algorithms.partial import PartialSharing, PartialSharingConfig
from pfl_cli.fl.config import key


@dataclass(frozen=True)
class LGFedAvgConfig(PartialSharingConfig):
    """LG-FedAvg's keys (a new client trains its own body for new_client_epochs)."""

    algorithm: str = key("lg-fedavg", "the algorithm these keys configure")


class LGFedAvg(PartialSharing):
    name = "lg-fedavg"
    compressible_upload = True  # the shared part's delta from the global one (PartialSharing.run_round)
    individual_reads = ""  # runs under --secagg: its shared head averaged from sums (fl.secagg.cohort_mean)
    averages_updates = True  # its server averages the shared head: an update attack and an aggregator act there
    async_ready = ("its shared head is averaged from client deltas and the bodies stay local: the head could take FedBuff's buffered step")
    search_space = {"lr": "log:1e-3:1"}
    search_space_source = ("Liang et al. 2020: the client lr is its one tuned key")
    tune_group = "train"
    paper = "LG-FedAvg: Liang et al., 2020"
    new_client_protocol = "its own body trained new_client_epochs under the frozen global head"
    config = LGFedAvgConfig
    shared_part = "head"

