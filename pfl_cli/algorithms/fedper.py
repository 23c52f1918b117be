"""FedPer (Arivazhagan, Aggarwal, Singh, Choudhary, 2019): base layers shared, personalization layers local.

Each round a cohort client trains its whole net (the global body with its own head) with
k local SGD steps (or ``local_epochs``), as in FedAvg; the server averages the bodies
weighted by client data size and each client keeps its head. New clients: as FedRep, a
fresh head trained ``new_client_epochs`` epochs on the frozen body.
"""

from __future__ import annotations

from dataclasses import dataclass

from pfl_cli.algorithms.partial import PartialSharing, PartialSharingConfig
from pfl_cli.fl.config import key


@dataclass(frozen=True)
class FedPerConfig(PartialSharingConfig):
    """FedPer's keys."""

    algorithm: str = key("fedper", "the algorithm these keys configure")


class FedPer(PartialSharing):
    name = "fedper"
    compressible_upload = True  # the shared part's delta from the global one (PartialSharing.run_round)
    individual_reads = ""  # runs under --secagg: its shared body averaged from sums (fl.secagg.cohort_mean)
    averages_updates = True  # its server averages the shared body: an update attack and an aggregator act there
    async_ready = ("its shared body is averaged from client deltas as FedAvg's model is, and each head stays on its client: the body could take FedBuff's buffered step")
    search_space = {"lr": "log:1e-3:1"}
    search_space_source = ("Arivazhagan et al. 2019: the client lr is its one tuned key")
    tune_group = "train"
    paper = "FedPer: Arivazhagan et al., 2019"
    new_client_protocol = "a fresh head trained new_client_epochs on the frozen body"
    config = FedPerConfig
    shared_part = "body"

