"""MOON: model-contrastive federated learning (Li, He, Song, CVPR 2021, Alg. 1, Eq. 3-4).

Each round a cohort client starts from the global model w^t and trains its local model on the
supervised loss plus ``mu`` times the model-contrastive loss (Eq. 4): the cosine similarity of its
representation z to the global model's z_glob against its similarity to the client's previous local
model's z_prev, at temperature ``tau`` (Eq. 3; :mod:`pfl_cli.fl.contrastive`). The server averages the
cohort's models by data size (Alg. 1 line 8). Every client keeps its last local model w_i^{t-1}
(:class:`~pfl_cli.fl.client_state.ClientState`, one model-sized row per client, in the checkpoint so
``--resume`` continues byte for byte); before a client's first round it is the initial model w^0, as
the authors' code starts every party's previous model from the initial nets. The local steps are
vectorized over the cohort (:func:`pfl_cli.fl.sam.local_steps`): three forward passes a step (the
trained model, the global one, the previous ones) and one backward.

Exchanged: the global model down and the local model up (2 x |client net| floats a cohort client and
round, as FedAvg; the previous model never leaves the client). A new client (and every client at
prediction) gets the global model, fine-tuned ``finetune_steps`` plain local steps as FedAvg's protocol
(the paper evaluates the global model, §4.2).

Departures, said here: the representation is ``features()``, the layer the client net's classifier
reads; the paper's nets add a two-layer projection head before the output layer (§3.2) and contrast its
output. pflx's client nets have none, so a MOON model stays the same net that ``predict`` and every other
algorithm serve; a net without ``features()`` / ``head()`` is refused in one line. The round (lr,
local steps, momentum) is pflx's FedAvg's; the paper's SGD lr 0.01, momentum 0.9 and 10 local epochs
(§4.1; the authors' README runs ``--lr 0.01 --epochs 10``) are ``--lr 0.01 --local-epochs 10``. No
``--dp`` variant is declared.

Defaults checked (issue 40) against the authors' code, github.com/QinbinLi/MOON (the paper's text was
not at hand): ``main.py`` defaults ``--mu 1`` and ``--temperature 0.5``; the README's CIFAR-10 command
sets ``--mu 5 --lr 0.01 --epochs 10`` and advises tuning mu over {0.001, 0.01, 0.1, 1, 5, 10} and the
temperature over {0.1, 0.5, 1.0} outside the paper's settings.
"""

from __future__ import annotations

from dataclasses import dataclass

from pfl_cli.algorithms.fedavg import FedAvg, FedAvgFinetuneConfig
from pfl_cli.fl.config import check_own_keys, key
from pfl_cli.fl.params import broadcast


@dataclass(frozen=True)
class MoonConfig(FedAvgFinetuneConfig):
    """MOON's keys: FedAvg's round, the contrastive weight mu and the temperature tau."""

    algorithm: str = key("moon", "the algorithm these keys configure")
    moon_mu: float = key(1.0, "mu: weight of the model-contrastive loss (Eq. 4)",
                         "Li et al. (CVPR 2021) §4.1: mu tuned from {0.1, 1, 5, 10}, 1 for CIFAR-100 and "
                         "Tiny-ImageNet (5 for CIFAR-10); the authors' code (QinbinLi/MOON main.py) defaults "
                         "--mu 1 and its README runs CIFAR-10 with --mu 5")
    moon_tau: float = key(0.5, "tau: temperature of the model-contrastive loss (Eq. 3)",
                          "Li et al. (CVPR 2021) §4.1: the temperature is 0.5 (SimCLR's); the authors' code "
                          "(QinbinLi/MOON main.py) defaults --temperature 0.5")

    def validate(self) -> None:
        super().validate()
        check_own_keys(self, {"moon_mu": "a finite number > 0", "moon_tau": "a finite number > 0"})


class Moon(FedAvg):
    name = "moon"
    averages_updates = True  # FedAvg.aggregate: an update attack and a robust aggregator act there (issue 48)
    individual_reads = ""  # runs under --secagg: FedAvg's aggregate_secure (pfl_cli.fl.secagg)
    paper = "MOON: Li, He, Song, CVPR 2021 (Alg. 1, Eq. 3-4)"
    new_client_protocol = "the global model, or it fine-tuned finetune_steps steps"
    config = MoonConfig
    dp_unit = None  # no DP variant declared (FedAvg's DP-FedAvg is not inherited)
    models_upload = False  # its local objective adds the contrastive term, not FedAvg's upload
    serves_unlabeled = "moon without --finetune-steps (one global model)"
    not_distributed = "its contrastive local steps run in one process (no sharding of the cohort across ranks)"
    search_space = {"lr": "log:1e-3:1", "moon_mu": "choice:0.1,1,5,10"}
    search_space_source = ("Li et al., MOON (CVPR 2021), §4.1: mu tuned from {0.1, 1, 5, 10}, tau fixed at 0.5; "
                           "the client lr per task")
    tune_group = "train"

    def build(self) -> None:
        from pfl_cli.fl.client_state import ClientState
        from pfl_cli.fl.contrastive import RepresentationNet

        super().build()
        self.rep = RepresentationNet(self.net, self.name)
        self.previous = ClientState(self.global_params, self.store.num_clients, self.store.partition_sha)

    def run_round(self, t, cohort, gen):
        from pfl_cli.fl.cohort import resolve_cohort_exec
        from pfl_cli.fl.contrastive import moon_grad_fn
        from pfl_cli.fl.sam import local_steps

        cfg = self.cfg
        batches = self.local_batches(cohort, gen, **self.round_schedule())
        how = resolve_cohort_exec(cfg.cohort_exec, self.net, self.device)
        grad_fn = moon_grad_fn(self.rep, self.store, how, self.global_params, self.previous.gather(cohort),
                               mu=float(cfg.moon_mu), tau=float(cfg.moon_tau))
        theta, loss = local_steps(grad_fn, broadcast(self.global_params, len(cohort)), batches,
                                  sgd=self.sgd_update_options())
        self.previous.scatter(cohort, theta)                  # w_i^t: the next round's z_prev
        self.aggregate(t, cohort, theta)                      # Alg. 1 line 8: sum_i |D_i| / |D| w_i^t
        return loss

    def state(self):
        return {**super().state(), "previous": self.previous.state()}

    def load_state(self, state):
        super().load_state(state)
        self.previous.load_state(state["previous"], self.device)
