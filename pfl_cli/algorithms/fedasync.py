"""FedAsync: asynchronous federated optimization (Xie, Koyejo, Gupta, arXiv:1903.03934, 2019, Alg. 1).

``concurrency`` clients train at once, each from the model version tau it downloaded (``local_steps`` local SGD
steps), and send their model ``x_new``. The server mixes every arriving model into the global one at once (Alg. 1,
server "Updater"):

    x_t = (1 - alpha_t) x_{t-1} + alpha_t x_new,    alpha_t = alpha s(t - tau)

with the staleness function s (§5.2): ``constant`` s = 1, ``polynomial`` s_a(t - tau) = (t - tau + 1)^-a, or
``hinge`` s_{a,b}(t - tau) = 1 if t - tau <= b else 1 / (a (t - tau - b) + 1). t counts the server's updates.

In pflx a round is ``clients_per_round`` arrivals, each one server update (default 10, FedBuff's K, so that a round
of either holds as many client updates; 1 makes a round one update of Alg. 1); ``--rounds``, evaluation,
checkpoints and ``--resume`` count rounds. The simulated clock advances to each arrival (:mod:`pfl_cli.fl.asynchronous`; client durations from the conditions' ``compute_speed`` and
``network_speed``). A new client gets the global model, or it fine-tuned ``finetune_steps`` local steps.

A worker's local objective (Alg. 1, worker "Optimizer") is regularized around the model x_tau it downloaded,

    g_{x_tau}(x; z) = f(x; z) + rho/2 ||x - x_tau||^2,

so its local SGD steps add ``rho (x - x_tau)`` to each gradient (``rho``; each in-flight job keeps its own x_tau, so
the jobs of one batched call have one anchor each). ``rho = 0`` (the default) is plain local SGD, the solver every
other pflx method shares.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from pfl_cli.algorithms.base import Algorithm
from pfl_cli.fl.asynchronous import STALENESS, GlobalModelOnTheClock, staleness_weight
from pfl_cli.fl.config import NEEDS, check_own_keys, key
from pfl_cli.fl.finetune import FinetuneAdapterKeys

XIE = "Xie et al. (2019)"


@dataclass(frozen=True)
class FedAsyncConfig(FinetuneAdapterKeys):
    """FedAsync's keys: the mixing weight alpha, the staleness function, the concurrency and the local steps."""

    algorithm: str = key("fedasync", "the algorithm these keys configure")
    rounds: int = key(1000, "rounds of clients_per_round arrivals (each arrival one server update)")
    clients_per_round: int = key(10, "arrivals per pflx round (each mixed into the model at once: a server update)",
                                 f"pflx: FedBuff's K = 10 (Nguyen et al. 2022 §6), so that a round of either holds "
                                 f"as many client updates; {XIE} Alg. 1 updates at every arrival (1: a round of one)")
    concurrency: int = key(30, "clients training at once (a new one starts whenever one answers); at most the train "
                               "clients with labels",
                           f"{XIE} Alg. 1: the scheduler keeps workers busy; pflx: FedBuff's default, for comparison")
    local_steps: int = key(50, "local SGD steps of a client's job", "pflx: FedAvg's default (thesis §4.4: k = 50)")
    alpha: float = key(0.6, "alpha: the mixing weight of an arriving model, in (0, 1]",
                       f"{XIE} §6: alpha = 0.6 in the comparisons of FedAsync's variants")
    staleness: str = key("polynomial", "s: how alpha decays with the staleness t - tau: constant | polynomial | hinge",
                         f"{XIE} §5.2 defines the three; polynomial is its FedAsync+Poly", choices=STALENESS)
    staleness_a: float = key(0.5, "a of the polynomial (t - tau + 1)^-a and of the hinge 1 / (a (t - tau - b) + 1)",
                             f"{XIE} §6: a = 0.5 for Poly")
    staleness_b: float = key(4.0, "b: the hinge's staleness without decay", f"{XIE} §6: Hinge with b = 4")
    rho: float = key(0.0, "rho: weight of the worker's regularizer rho/2 ||x - x_tau||^2 around the model it "
                          "downloaded (0: plain local SGD)",
                     f"{XIE} Alg. 1 (the worker's objective g_{{x_tau}}); 0, pflx's default, is plain local SGD as in "
                     "every other pflx method (Alg. 1's regularizer switched off)")
    finetune_steps: int = key(0, "local steps from the global model before evaluation (0: the global model)",
                              "pflx: FedAvg's new-client protocol (the global model as-is)")

    def validate(self) -> None:
        super().validate()
        check_own_keys(self, {"concurrency": "an integer >= 1", "alpha": "a number in (0, 1]",
                              "rho": "a finite number >= 0",
                              "staleness_a": "a finite number >= 0", "staleness_b": "a finite number >= 0"})
        if self.clients_per_round is None:
            from pfl_cli.errors import ConfigError

            raise ConfigError("clients_per_round is the arrivals of one fedasync round; null is not a count. Set an "
                              "integer >= 1 (1: a round is one update of Alg. 1).")


# the staleness function's parameters act only where it has them (check_inert refuses them elsewhere)
NEEDS["staleness_a"] = (lambda cfg: getattr(cfg, "staleness", "constant") != "constant",
                        "beside staleness=constant (s = 1 has no parameter)")
NEEDS["staleness_b"] = (lambda cfg: getattr(cfg, "staleness", "constant") == "hinge",
                        "without staleness=hinge (only the hinge has b)")


class FedAsync(GlobalModelOnTheClock, Algorithm):
    name = "fedasync"
    compressible_upload = True  # each job's delta from the model it downloaded (AsyncServer._train)
    individual_reads = ("each client's update as it arrives (asynchronous: there is no cohort whose sum "  # --secagg
                        "secure aggregation could reveal alone)")
    paper = "FedAsync: Xie, Koyejo, Gupta, 2019 (Alg. 1; staleness functions §5.2)"
    new_client_protocol = "the global model, or it fine-tuned finetune_steps steps"
    config = FedAsyncConfig
    dp_unit = None  # no DP variant
    not_distributed = "its asynchronous server simulates every in-flight client's job in one process"
    asynchronous = True
    mixes_each_arrival = True  # x_t = (1 - alpha_t) x_{t-1} + alpha_t x_new at every arrival
    serves_unlabeled = "fedasync without --finetune-steps (one global model)"
    search_space = {"lr": "log:1e-3:1", "alpha": "choice:0.1,0.3,0.6,0.9",
                    "staleness": "choice:constant,polynomial,hinge", "rho": "choice:0,0.001,0.01,0.1"}
    search_space_source = (f"{XIE} §6: alpha compared over 0.1 to 0.9 and the three staleness functions; the client "
                           "lr tuned per task; pflx: rho (Alg. 1's regularizer) over decades with 0")
    tune_group = "train"

    @staticmethod
    def uploads(start: dict, theta: dict) -> dict:
        """Alg. 1's worker message: its trained model x_new."""
        return dict(theta)

    def job_objective(self, start: dict) -> dict:
        """Alg. 1's worker objective: ``rho/2 ||x - x_tau||^2`` around each job's own downloaded model ``start``."""
        rho = float(self.cfg.rho)
        return {"prox_mu": rho, "prox_anchors": start} if rho else {}

    def mix(self, model: dict, stale: int) -> None:
        """Alg. 1's Updater: ``x <- (1 - alpha_t) x + alpha_t x_new``, ``alpha_t = alpha s(t - tau)``."""
        cfg = self.cfg
        weight = float(cfg.alpha) * float(staleness_weight(np.array([stale]), cfg.staleness, a=cfg.staleness_a,
                                                           b=cfg.staleness_b)[0])
        self.global_params = mixed(self.global_params, model, weight)



def mixed(x: dict, x_new: dict, alpha_t: float) -> dict:
    """``(1 - alpha_t) x + alpha_t x_new`` (Xie et al. 2019, Alg. 1)."""
    return {k: (1.0 - alpha_t) * v + alpha_t * x_new[k] for k, v in x.items()}
