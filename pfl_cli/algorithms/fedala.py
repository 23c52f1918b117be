"""FedALA (Zhang, Hua, Wang, Song, Xue, Ma, Guan, AAAI 2023): adaptive local aggregation, then FedAvg.

Each client keeps its local model theta_i. A cohort client receives the global model Theta and,
before training, forms theta_hat_i from theta_i and Theta by element-wise aggregation whose
weights it learns on a random ``ala_sample`` share of its data (the ALA module, Eq. and
procedure of §"Adaptive Local Aggregation"; :mod:`pfl_cli.fl.ala`): the layers below the top
``ala_layers`` take Theta, the top ones theta_i + (Theta - theta_i) * W_i. It then trains
theta_hat_i with FedAvg's local steps (or ``local_epochs``), uploads it and keeps it as its new
theta_i; the server averages the uploads weighted by client data size (FedAvg). W_i persists on
the client. A client's first aggregation is its "start phase": W is trained pass after pass
until the last ``ala_num_pre_loss`` pass losses have a standard deviation below
``ala_threshold``; later rounds take one pass. A client's first round has no local model yet:
it trains from Theta itself (ALA would return Theta: theta_i = Theta).

Exchanged: the whole model down and up (2 x |client net| floats per cohort client and round).
A train client's personalized model is its local model as it last trained it. A new client has
no local model, so ALA is the identity: it trains the global model on its data for
``new_client_epochs`` epochs (pflx's fine-tuning protocol for new clients).

With ``ala_every_client`` (the authors' code, PFLlib's ``serverala.py``: ``send_models`` runs
``local_initialization`` on every client each round, and ``evaluate`` scores those models), ALA
runs on every train client, not only the cohort, each time the global model changes: at the end of
every round, after the server's average, each train client forms theta_hat_i from its local model
(the initial model for a client that has not trained yet) and the new Theta, and keeps it as its
local model. The next cohort trains from those (the global model did not change in between, so this
is the authors' order), and a train client's personalized model is its ALA-aggregated model, the one
the authors' code evaluates. Off (the default), ALA runs for the cohort only, before its training, as
the procedure of the paper's §"Adaptive Local Aggregation" describes it (a selected client receives
Theta and forms theta_hat_i). On the conformance task (docs/performance/conformance.md, 50 rounds,
seeds 0-2) the two agree with every client every round (81.2 and 81.3 %, PFLlib 81.1 %); with 5 of
20 clients a round the cohort-only default scores 82.5 %, the every-client order 67.6 % (PFLlib, the
authors' order: 66.3 %): a client outside the cohort has its lower layers replaced by the global
model's every round, wearing away what its last training personalized.

Departures, said here: the start phase is capped at ``ala_max_start_epochs`` passes (the paper
and PFLlib train until converged, which PFLlib's README warns can stall with a small threshold);
the ``s`` share is a uniformly random subset of the client's samples each round (PFLlib takes a
random contiguous slice); ``ala_layers`` counts layers (the paper's p), where PFLlib's
``layer_idx`` counts parameter tensors.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from pfl_cli.algorithms.base import PrivateState, epochs_protocol
from pfl_cli.algorithms.fedavg import FedAvg, FedAvgRoundConfig
from pfl_cli.fl.config import check_own_keys, key
from pfl_cli.fl.params import stack

STARTED = "ala_started"  # private flag: 1.0 once a client has left its start phase


@dataclass(frozen=True)
class FedALAConfig(FedAvgRoundConfig):
    """FedALA's keys: FedAvg's round and the ALA module's constants."""

    algorithm: str = key("fedala", "the algorithm these keys configure")
    ala_eta: float = key(1.0, "eta: step size of the element-wise aggregation weights",
                         "FedALA (AAAI 2023) authors' code, system/run_me.sh: -et 1")
    ala_sample: float = key(0.8, "s: share of a client's training data the weights are learned on",
                            "FedALA (AAAI 2023) authors' code, system/run_me.sh: -s 80")
    ala_layers: int = key(1, "p: top layers aggregated element-wise (the layers below take the global model)",
                          "FedALA (AAAI 2023) authors' code, system/run_me.sh: -p 2 (parameter tensors: the last layer's weight and bias)")
    ala_threshold: float = key(0.01, "start phase: train the weights until the std of the last num_pre_loss "
                               "pass losses is below this",
                               "FedALA (AAAI 2023) authors' code, README: threshold 0.01 in the paper")
    ala_num_pre_loss: int = key(10, "start phase: pass losses the convergence test looks at",
                                "FedALA (AAAI 2023) authors' code, ALA.py: num_pre_loss = 10")
    ala_every_client: bool = key(False, "run ALA on every train client each round against the new global model "
                                 "(their personalized model is the ALA-aggregated one), not on the cohort alone",
                                 "FedALA (AAAI 2023) authors' code, PFLlib serverala.py send_models: "
                                 "local_initialization on every client")
    ala_max_start_epochs: int = key(100, "start phase: at most this many passes (a bound the paper has not)")
    new_client_epochs: int = key(20, "epochs a new client trains the global model on its data",
                                 "PeFLL (ICLR 2024) App. A.2: new clients of the baselines train 20 local epochs")

    def validate(self) -> None:
        super().validate()
        check_own_keys(self, {"ala_eta": "a finite number > 0", "ala_sample": "a fraction in (0, 1]",
                              "ala_layers": "an integer >= 1", "ala_threshold": "a finite number >= 0",
                              "ala_num_pre_loss": "an integer >= 1", "ala_max_start_epochs": "an integer >= 1",
                              "new_client_epochs": "an integer >= 0"})


class FedALA(PrivateState, FedAvg):
    name = "fedala"
    individual_reads = ""  # under --secagg the mean of the models from the cohort's sums (server_mean)
    paper = "FedALA: Zhang et al., AAAI 2023"
    new_client_protocol = "the global model trained new_client_epochs (ALA is the identity without a local model)"
    config = FedALAConfig
    dp_unit = None  # no DP variant declared (FedAvg's DP-FedAvg is not inherited)
    models_upload = False  # its upload starts from the ALA-aggregated model, not the global one
    averages_updates = True  # its server averages the uploaded models (server_mean): an attack and an aggregator act
    serves_unlabeled = ""
    not_distributed = "its adaptive local aggregation runs in one process (no sharding of the cohort across ranks)"
    search_space = {"lr": "log:1e-3:1", "ala_eta": "log:0.1:10", "ala_sample": "float:0.05:1"}
    search_space_source = ("Zhang et al., FedALA (AAAI 2023): the client lr per dataset, and the "
                           "hyperparameter study of eta and s")
    tune_group = "train"

    @property
    def finetune_steps(self) -> int:
        return 0

    def build(self) -> None:
        import torch

        from pfl_cli.fl.ala import top_layers

        super().build()
        self.personalized = True
        names = list(self.global_params)
        self.top = top_layers(names, self.cfg.ala_layers)
        template = {**self.global_params,
                    **{f"W.{k}": torch.ones_like(self.global_params[k]) for k in self.top},
                    STARTED: torch.tensor(0.0, device=self.device)}
        self.private = self.new_private_state(template)

    def _ala(self, clients, row: dict, gen):
        """ALA of ``clients`` (their private ``row``) against the current global model: theta_hat, W, started."""
        from pfl_cli.fl.ala import adaptive_local_aggregation

        cfg = self.cfg
        hat, w, _ = adaptive_local_aggregation(
            self.net, {k: row[k] for k in self.global_params}, self.global_params,
            {k: row[f"W.{k}"] for k in self.top}, row[STARTED] > 0.5, self.store, clients, gen,
            top=self.top, share=cfg.ala_sample, batch_size=cfg.batch_size, eta=cfg.ala_eta,
            threshold=cfg.ala_threshold, num_pre_loss=cfg.ala_num_pre_loss,
            max_start_epochs=cfg.ala_max_start_epochs)
        return hat, w

    def _every_client_round(self, t, cohort, gen):
        """``ala_every_client``: the cohort trains from its stored local model (ALA-aggregated with this
        global model at the end of the last round; the global model itself before any ALA), then every
        train client aggregates with the new global model (PFLlib serverala.py send_models)."""
        import torch

        from pfl_cli.fl.store import ROLE_TRAIN

        row = self.private.gather(cohort)
        has = self.private.has[cohort]
        start = stack(self.global_params, len(cohort))
        for k in start:
            start[k][has] = row[k][has]
        theta, loss, _ = self.cohort_sgd(start, cohort, gen, **self.round_schedule())
        sent = self.byzantine_uploads(t, cohort, theta)  # a malicious client keeps what it trained
        self.record_exchange(self.global_params, sent, len(cohort))
        self.server_step(self.server_mean(cohort, sent))
        self.private.scatter(cohort, theta)
        train = torch.as_tensor(self.store.clients(ROLE_TRAIN), device=cohort.device)
        everyone = self.private.gather(train)
        hat, w = self._ala(train, everyone, gen)
        self.private.scatter(train, {**hat, **{f"W.{k}": w[k] for k in self.top},
                                     STARTED: torch.ones_like(everyone[STARTED])})
        return loss

    def server_mean(self, cohort, theta: dict) -> dict:
        """FedAvg's mean of the uploaded models, or under ``--secagg`` the same mean from the cohort's sums
        (:func:`~pfl_cli.fl.secagg.cohort_mean`) of copies of the models: the upload is a copy, each client keeps
        its own model (its private state) for its next ALA."""
        if not self.cfg.secagg:
            return super().server_mean(cohort, theta)
        from pfl_cli.fl.secagg import cohort_mean

        return cohort_mean(self.store, cohort, {k: v.clone() for k, v in theta.items()}, secagg=True)

    def run_round(self, t, cohort, gen):
        import torch

        from pfl_cli.fl.ala import adaptive_local_aggregation

        cfg = self.cfg
        if cfg.ala_every_client:
            return self._every_client_round(t, cohort, gen)
        row = self.private.gather(cohort)
        local = {k: row[k] for k in self.global_params}
        weights = {k: row[f"W.{k}"] for k in self.top}
        has = self.private.has[cohort]
        start = stack(self.global_params, len(cohort))  # a client's first round: theta_i = Theta, ALA is moot
        started = row[STARTED] > 0.5
        if bool(has.any()):
            sel = torch.nonzero(has).flatten()
            hat, w, _ = adaptive_local_aggregation(
                self.net, {k: v[sel] for k, v in local.items()}, self.global_params,
                {k: v[sel] for k, v in weights.items()}, started[sel], self.store, cohort[sel], gen,
                top=self.top, share=cfg.ala_sample, batch_size=cfg.batch_size, eta=cfg.ala_eta,
                threshold=cfg.ala_threshold, num_pre_loss=cfg.ala_num_pre_loss,
                max_start_epochs=cfg.ala_max_start_epochs)
            for k in start:
                start[k][sel] = hat[k]
            for k in self.top:
                weights[k][sel] = w[k]
            started = started | has  # a client's first aggregation was its start phase
        theta, loss, _ = self.cohort_sgd(start, cohort, gen, **self.round_schedule())
        sent = self.byzantine_uploads(t, cohort, theta)  # a malicious client keeps what it trained
        self.record_exchange(self.global_params, sent, len(cohort))
        self.server_step(self.server_mean(cohort, sent))
        self.private.scatter(cohort, {**theta, **{f"W.{k}": weights[k] for k in self.top},
                                      STARTED: started.to(row[STARTED].dtype)})
        return loss

    def own_models(self, rows):
        row = self.private.gather(rows)
        return {k: row[k] for k in self.global_params}

    def new_clients(self, clients: np.ndarray, gen) -> dict:
        if not self.cfg.new_client_epochs:
            return stack(self.global_params, len(clients))
        return self.train_clients(self.global_params, clients, gen, epochs=self.cfg.new_client_epochs)

    def protocol(self, new: bool) -> dict:
        return epochs_protocol(new, self.cfg.new_client_epochs,
                               "its local model as last trained",
                               "global model trained {e} epochs",
                               "global model")
