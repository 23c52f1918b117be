"""Ditto (Li, Hu, Beirami, Smith, ICML 2021, Algorithm 1).

A global model trained by FedAvg, and on every client a personal model v_k trained on
F_k(v) + lambda/2 ||v - w^t||^2 (Eq. 2) around the round's global model w^t. A cohort
client runs FedAvg's local steps on w (lines 5-6) and the same number of steps on its own
v_k (line 7, s = the local steps); only w is exchanged. Personal models start from the
initial global model w^0 (v_k^0 = w^0), live on the device for all clients and are saved.
With lambda = 0 they are exactly local training. A new client trains its personal model
from the global one for ``new_client_epochs`` epochs with the same proximal term.

``adapters=lora`` (:mod:`pfl_cli.fl.adapters`): w and every v_k are LoRA adapters and a classifier on model_arch's net
frozen: the global adapters train by FedAvg, each client's personal adapters by Eq. 2, regularized toward the
round's global adapters (the proximal term over the adapters' A, B and the classifier).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import numpy as np

from pfl_cli.algorithms.base import Algorithm, PrivateState
from pfl_cli.algorithms.fedavg import FedAvg, FedAvgRoundConfig
from pfl_cli.fl.adapters import AdapterKeys, AdapterTraining, adapted_arch
from pfl_cli.fl.config import key
from pfl_cli.fl.params import stack


DEFAULT_LAMBDA = 0.1  # one of the paper's grid {0.01, 0.05, 0.1, 0.2, 0.5, 1, 2} (Table 9)


def ditto_lambda(cfg) -> float:
    return DEFAULT_LAMBDA if cfg.lam is None else float(cfg.lam)


@dataclass(frozen=True)
class DittoConfig(FedAvgRoundConfig, AdapterKeys):
    """Ditto's keys: FedAvg's round for w, and the personal models' objective and optimizer."""

    algorithm: str = key("ditto", "the algorithm these keys configure")
    lam: float = key(0.1, "lambda: proximal weight of a personal model to the global one (Eq. 2)",
                     "Ditto (Li et al. 2021) Table 9: grid {0.01, ..., 2}")
    personal_momentum: Optional[float] = key(None, "momentum of the personal steps (null: the client optimizer's, "
                                             "as w's steps)", "Ditto Alg. 1 lines 5 and 7: w and v_k take the "
                                             "same SGD step")
    personal_clip: float = key(0.0, "gradient-norm clip of the personal steps (0 = off)",
                               "Ditto Alg. 1 line 7: plain SGD")
    new_client_epochs: int = key(20, "epochs a new client trains its personal model",
                                 "thesis §4.4, App. B.1.2: new clients fine-tune 20 epochs")


class Ditto(AdapterTraining, PrivateState, FedAvg):
    name = "ditto"
    async_ready = ("its global model is FedAvg's (which FedBuff or FedAsync could aggregate) and each personal model trains on its own client against the model it downloaded")
    averages_updates = True  # FedAvg.aggregate: an update attack and a robust aggregator act there (issue 48)
    individual_reads = ""  # runs under --secagg: its global model is FedAvg's round (FedAvg.aggregate's secure sums)
    search_space = {"lr": "log:1e-3:1", "lam": "choice:0.01,0.1,0.5,1,2"}
    search_space_source = ("Li et al., Ditto (ICML 2021), §5 and App. C: lambda tuned on validation data over a grid "
                           "within [0.01, 2]")
    tune_group = "train"
    paper = "Ditto: Li, Hu, Beirami, Smith, ICML 2021"
    new_client_protocol = "a personal model trained new_client_epochs with the proximal term"
    config = DittoConfig
    dp_unit = None  # its own round: no DP variant (FedAvg's DP-FedAvg is not inherited)

    @staticmethod
    def resolve_arch(cfg, store) -> dict:
        return adapted_arch(cfg, store, Algorithm.resolve_arch(cfg, store))

    def build(self) -> None:
        super().build()
        self.personalized = True
        self.private = self.new_private_state(self.global_params)

    def run_round(self, t, cohort, gen):
        anchor = {k: v.clone() for k, v in self.global_params.items()}  # w^t
        loss = super().run_round(t, cohort, gen)
        v, _, _ = self.cohort_sgd(self.private.gather(cohort), cohort, gen, **self.round_schedule(),
                                  prox_mu=ditto_lambda(self.cfg), prox_anchor=anchor, sgd=self.personal_sgd())
        self.private.scatter(cohort, v)
        return loss

    def own_models(self, rows):
        return self.private.gather(rows)

    def new_clients(self, clients: np.ndarray, gen):
        """The personal model trained from the global one, with the proximal term to it."""
        if not self.cfg.new_client_epochs:
            return stack(self.global_params, len(clients))
        return self.train_clients(self.global_params, clients, gen, epochs=self.cfg.new_client_epochs,
                                  prox_mu=ditto_lambda(self.cfg), prox_anchor=self.global_params,
                                  sgd=self.personal_sgd())

    def personal_sgd(self) -> dict:
        """Alg. 1 lines 5 and 7: v_k steps like w (the client optimizer's momentum; no clip) unless set.

        With plain steps against w's momentum 0.9, v_k moved 10x slower than w: on digits Dirichlet 0.3 (40 train
        clients, 40 rounds) its train clients scored 58 % while the global model scored 96 %."""
        momentum = self.cfg.personal_momentum
        return {"momentum": self.cfg.momentum if momentum is None else momentum, "clip": self.cfg.personal_clip}
