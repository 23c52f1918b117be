"""FedPer (Arivazhagan, Aggarwal, Singh, Choudhary, 2019): base layers shared, personalization layers local.

Each round a cohort client trains its whole net (the global body with its own head) with
k local SGD steps (or ``local_epochs``), as in FedAvg; the server averages the bodies
weighted by client data size and each client keeps its head. New clients: as FedRep, a
fresh head trained ``new_client_epochs`` epochs on the frozen body.
"""

from __future__ import annotations

from pfl_cli.algorithms.partial import PartialSharing


class FedPer(PartialSharing):
    name = "fedper"
    shared_part = "body"

