"""FedProx (Li et al., MLSys 2020, Algorithm 2).

FedAvg whose clients minimize the proximal objective h_k(w; w^t) = F_k(w) + mu/2 ||w - w^t||^2
(Eq. 2) around the round's global model w^t; the server aggregates as FedAvg. With
``mu = 0`` it is FedAvg exactly. A new client uses the global model (or fine-tunes it with
``finetune_steps``, as FedAvg).

``sam_rho > 0``: every local step is a SAM step (Foret et al., ICLR 2021, Eq. 2-3; :mod:`pfl_cli.fl.sam`):
the perturbation and the second gradient are the data loss's, and the proximal gradient ``mu (w - w^t)``
joins the base optimizer's step at ``w`` as weight decay does (the proximal term's curvature is ``mu I``
everywhere: perturbing it sharpens nothing). With ``mu = 0`` that is FedSAM exactly.
"""

from __future__ import annotations

from dataclasses import dataclass

from pfl_cli.algorithms.fedavg import FedAvg, FedAvgFinetuneConfig, check_sam_rho, sam_rho_key
from pfl_cli.fl.config import key


@dataclass(frozen=True)
class FedProxConfig(FedAvgFinetuneConfig):
    """FedProx's keys: FedAvg's and the proximal weight."""

    algorithm: str = key("fedprox", "the algorithm these keys configure")
    mu: float = key(0.01, "proximal weight mu of Eq. 2 (0 = FedAvg)", "FedProx paper §5.2 grid {0.001, 0.01, 0.1, 1}")
    sam_rho: float = sam_rho_key(source="Li et al. (MLSys 2020): plain local SGD on h_k (its local solver)")

    def validate(self) -> None:
        super().validate()
        check_sam_rho(self)


class FedProx(FedAvg):
    name = "fedprox"
    averages_updates = True  # FedAvg.aggregate: an update attack and a robust aggregator act there (issue 48)
    individual_reads = ""  # runs under --secagg: FedAvg's aggregate_secure (pfl_cli.fl.secagg)
    search_space = {"lr": "log:1e-3:1", "mu": "choice:0.001,0.01,0.1,1"}
    search_space_source = ("Li et al., FedProx (MLSys 2020), §5.3: mu selected from {0.001, 0.01, 0.1, 1}")
    tune_group = "train"
    paper = "FedProx: Li et al., MLSys 2020"
    new_client_protocol = "the global model, or it fine-tuned finetune_steps steps"
    config = FedProxConfig
    models_upload = False  # its local steps add the proximal term, not FedAvg's upload
    # Li et al. 2020, §3 (gamma-inexact solutions) and §5.2: a straggler's partial work is aggregated, not dropped
    partial_work = True
    compressible_upload = True
    stackable = True  # the proximal weight is one more per-row setting of the stacked step (pfl_cli.fl.stack)
    stack_keys = FedAvg.stack_keys + ("mu",)

    def local_objective(self) -> dict:
        return {"prox_mu": self.cfg.mu, "prox_anchor": self.global_params, **super().local_objective()}
