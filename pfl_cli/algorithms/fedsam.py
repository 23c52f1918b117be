"""FedSAM (Qu, Li, Duan, Liu, Tang, Lu, ICML 2022, Alg. 1; Caldarola, Caputo, Ciccone, ECCV 2022, §4).

FedAvg whose clients take sharpness-aware local steps: on each batch a client takes the gradient g of
its loss at w, the perturbation ``eps = rho g / ||g||`` (its own norm over the whole model), and steps w
with the gradient taken at ``w + eps`` on the same batch (SAM, Foret et al., ICLR 2021, Eq. 2-3); the
server averages the cohort's models by data size (FedAvg, McMahan et al. 2017). The SAM gradient goes
through pflx's client optimizer as the plain gradient would (clipping, weight decay, ``momentum``): SAM
wraps a base optimizer, and Qu et al.'s base optimizer is SGD. The steps are :mod:`pfl_cli.fl.sam`'s,
vectorized over the cohort (two vmapped forward and backward passes a step, or two per client with
``cohort_exec=loop``).

FedSAM is FedAvg with ``sam_rho`` (fedavg's option, off by default; fedprox has it too): its round is
:class:`~pfl_cli.algorithms.fedavg.FedAvg`'s, the same code, and ``--algorithm fedavg --set sam_rho=R``
trains the same weights bit for bit (``tests/algorithms/test_fedavg_sam.py``). This module keeps the
papers' method under its name: SAM's radius on by default, its tuning space over rho, and what FedAvg's
declarations say of plain local SGD that SAM steps change (no ``pflx attack`` model of the upload, no DP
variant declared, one process).

Exchanged: the global model down and the local model up (2 x |client net| floats a cohort client and
round, as FedAvg: SAM is local work only). A new client (and every client at prediction) gets the
global model, fine-tuned ``finetune_steps`` plain local steps as FedAvg's protocol (the papers
evaluate the global model).

Departures, said here: the default radius is SAM's own 0.05 (Foret et al. 2021; the FedSAM papers tune
rho per dataset: Caldarola et al.'s code runs CIFAR-10 with rho 0.1 for SAM and 0.7 for ASAM,
``paper_experiments/cifar10.sh`` of github.com/debcaldarola/fedsam; Qu et al.'s values and the papers'
texts were not at hand, issue 40). No ``--dp`` variant is declared, and ``rho = 0`` is refused (FedAvg exactly: use
``--algorithm fedavg``).
"""

from __future__ import annotations

from dataclasses import dataclass

from pfl_cli.algorithms.fedavg import FedAvg, FedAvgFinetuneConfig, sam_rho_key
from pfl_cli.fl.config import check_own_keys, key


@dataclass(frozen=True)
class FedSAMConfig(FedAvgFinetuneConfig):
    """FedSAM's keys: FedAvg's round and the SAM radius rho."""

    algorithm: str = key("fedsam", "the algorithm these keys configure")
    sam_rho: float = sam_rho_key(0.05, "Foret et al. (ICLR 2021): rho = 0.05, SAM's usual radius; Qu et al. (ICML "
                                       "2022) and Caldarola et al. (ECCV 2022) tune rho per dataset (Caldarola's "
                                       "code, debcaldarola/fedsam paper_experiments/cifar10.sh: 0.1 for SAM)",
                                 "rho: radius of the SAM perturbation of every local step (Foret et al. 2021, Eq. 2)")

    def validate(self) -> None:
        super().validate()
        check_own_keys(self, {"sam_rho": "a finite number > 0"})


class FedSAM(FedAvg):
    name = "fedsam"
    compressible_upload = True  # FedAvg's round and upload (its aggregate compresses the deltas)
    averages_updates = True  # FedAvg.aggregate: an update attack and a robust aggregator act there (issue 48)
    individual_reads = ""  # runs under --secagg: FedAvg's aggregate_secure (pfl_cli.fl.secagg)
    paper = "FedSAM: Qu et al., ICML 2022 (Alg. 1); Caldarola et al., ECCV 2022"
    new_client_protocol = "the global model, or it fine-tuned finetune_steps steps"
    config = FedSAMConfig
    dp_unit = None  # no DP variant declared (FedAvg's DP-FedAvg is not inherited)
    models_upload = False  # its local steps are SAM steps, not FedAvg's upload
    serves_unlabeled = "fedsam without --finetune-steps (one global model)"
    not_distributed = "its sharpness-aware local steps run in one process (no sharding of the cohort across ranks)"
    search_space = {"lr": "log:1e-3:1", "sam_rho": "choice:0.01,0.02,0.05,0.1,0.2,0.5"}
    search_space_source = ("Caldarola et al., FedSAM (ECCV 2022), §5 and Qu et al. (ICML 2022), §5: rho tuned per "
                           "dataset over 0.01 to 0.5 around SAM's 0.05 (Foret et al. 2021); the client lr per task")
    tune_group = "train"
    # the round is FedAvg's: local_objective() carries sam_rho to cohort_sgd's SAM steps (Qu et al. Alg. 1)
