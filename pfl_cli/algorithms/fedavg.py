"""FedAvg (thesis Alg. 3/4) with a server learning rate, and optional fine-tuning for new clients.

Each round the cohort starts from the global model, runs k local SGD steps (or
``local_epochs`` passes) and the server moves the global model by ``server_lr`` times the
data-size-weighted mean of the clients' deltas (Alg. 3 line 9 is ``server_lr = 1``),
optionally with server momentum. A client's model is the global model, or the global model
after ``finetune_steps`` local steps on its own data.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import numpy as np

from pfl_cli.algorithms.base import Algorithm
from pfl_cli.attack.protocol import Attackable
from pfl_cli.fl.config import TrainConfig, key
from pfl_cli.fl.params import broadcast, cpu_tree, stack, weighted_mean
from pfl_cli.privacy.randomness import mechanism_generator


@dataclass(frozen=True)
class FedAvgRoundConfig(TrainConfig):
    """The keys of FedAvg's round, shared by the algorithms built on it; defaults: PeFLL's baseline protocol."""

    algorithm: str = key("fedavg", "the algorithm these keys configure")
    rounds: int = key(5000, "communication rounds", "thesis §4.4, App. B.1.2: all methods but Local train 5000 rounds")
    clients_per_round: Optional[int] = key(5, "cohort size of every round (null: every train client)",
                                           "thesis §4.4: FEMNIST 5 clients per round")
    local_steps: int = key(50, "k: client SGD steps per round", "thesis §4.4: k = 50")
    local_epochs: Optional[int] = key(None, "epochs of local SGD per round instead of local_steps (null: steps)")
    server_lr: float = key(1.0, "server step on the mean delta", "thesis Alg. 3 line 9: the mean model (step 1)")
    server_momentum: float = key(0.0, "server momentum on the mean delta", "thesis Alg. 3: none")


@dataclass(frozen=True)
class FedAvgConfig(FedAvgRoundConfig):
    """FedAvg's keys."""

    finetune_steps: int = key(0, "local steps from the global model before evaluation (0: the global model)",
                              "thesis §4.4, App. B.1.2: a new client uses the global model as-is")


class FedAvg(Attackable, Algorithm):
    name = "fedavg"
    search_space = {"lr": "log:1e-3:1"}
    search_space_source = ("McMahan et al. 2017, §3: the client lr is tuned per task (a grid of two to three "
                           "decades); Scott 2026 thesis App. C.1.2: the local lr tuned on validation clients")
    tune_group = "train"
    paper = "FedAvg: McMahan et al., AISTATS 2017 (thesis Alg. 3/4)"
    new_client_protocol = "the global model, or it fine-tuned finetune_steps steps"
    config = FedAvgConfig
    dp_unit = "client"
    dp_contribution = "model delta"
    default_server_lr = 1.0
    serves_unlabeled = "fedavg without --finetune-steps (one global model)"
    # The run axis (pfl_cli.fl.stack): a round's local training is one plain cohort SGD call, so runs that differ
    # only in these keys train stacked in one process; declared per class, never inherited.
    stackable = True
    stack_keys = ("seed", "lr", "momentum", "lambda_theta", "client_clip", "server_lr", "server_momentum")

    @property
    def finetune_steps(self) -> int:
        """``finetune_steps`` of the config; 0 for the algorithms built on FedAvg whose config has none (Ditto)."""
        return getattr(self.cfg, "finetune_steps", 0)

    @property
    def needs_labels_to_predict(self) -> bool:
        return self.finetune_steps > 0

    def build(self) -> None:
        self.net = self.client_net()
        self.global_params = {k: v.detach().clone() for k, v in self.net.named_parameters()}
        self.server_buf = {k: v.new_zeros(v.shape) for k, v in self.global_params.items()}
        self.personalized = self.finetune_steps > 0

    def run_round(self, t, cohort, gen):
        import torch

        if len(cohort) == 0:  # an empty Poisson cohort (DP): no client trains, the noise is still added
            theta, loss = stack(self.global_params, 0), torch.zeros(0)
        else:
            # local SGD copies its start into the stack it trains: no second cohort-sized copy here
            theta, loss, _ = self.cohort_sgd(broadcast(self.global_params, len(cohort)), cohort, gen,
                                             **self.round_schedule(), **self.local_objective())
        self.aggregate(t, cohort, theta)
        return loss

    def aggregate(self, t: int, cohort, theta: dict) -> None:
        """The server's half of round ``t``: the cohort's models ``theta`` (c, ...) -> the new global model.

        Alg. 3 line 9 (the data-size-weighted mean), or under ``--dp`` DP-FedAvg (McMahan et al.
        2018, Alg. 1): clipped deltas, noisy sum / (q N), even for an empty Poisson cohort.
        A Flower deployment's ServerApp calls it with the models its nodes sent.
        """
        self.record_exchange(self.global_params, theta, len(cohort))
        if self.dp is not None:
            deltas = {k: theta[k] - g for k, g in self.global_params.items()}
            self.server_update(self.dp.private_mean(deltas, mechanism_generator(self.cfg, f"dp-noise-{t}",
                                                                            self.device)))
        else:
            self.server_step(weighted_mean(self.store, cohort, theta))

    def local_objective(self) -> dict:
        """Extra terms of the clients' local objective (FedProx adds its proximal term)."""
        return {}

    def server_step(self, mean: dict) -> None:
        """Move the global model towards the cohort's mean model ``mean`` (Alg. 3 line 9)."""
        self.server_update({k: mean[k] - g for k, g in self.global_params.items()})

    def server_update(self, mean_delta: dict) -> None:
        """Move the global parameters by ``server_lr`` times the (momentum-averaged) mean delta."""
        cfg = self.cfg
        lr = cfg.server_lr if cfg.server_lr is not None else self.default_server_lr
        for k, g in self.global_params.items():
            self.server_buf[k] = cfg.server_momentum * self.server_buf[k] + mean_delta[k]
            self.global_params[k] = g + lr * self.server_buf[k]

    def protocol(self, new: bool) -> dict:
        steps = self.finetune_steps
        return {"protocol": f"global model fine-tuned {steps} local steps" if steps else "global model",
                "rounds": 0}

    models_upload = True     # also Ditto's and kNN-Per's: their global model takes FedAvg's round
    upload_under_dp = True  # client-level DP-FedAvg: the client's delta, clipped and noised only in the sum

    def upload(self, x, y, *, steps: int, noise_gen=None, start=None, clients=None, private=None):
        """Alg. 3 line 7: the client's delta after ``steps`` local steps from the global model (0: its gradient).

        Under client-level ``--dp`` the server receives each delta before the noise of the sum is
        added, clipped by a positive factor (which cosine matching does not see).
        """
        start = stack(self.global_params, x.shape[0]) if start is None else start
        return self.local_update(start, x, y, steps), start

    def personalize(self, clients: np.ndarray, gen):
        if self.finetune_steps > 0:
            return self.train_clients(self.global_params, clients, gen, steps=self.finetune_steps), True
        return self.global_params, False

    def state(self):
        return {"global": {k: v.detach().clone() for k, v in self.global_params.items()},
                "server_buf": {k: v.detach().clone() for k, v in self.server_buf.items()}}

    def load_state(self, state):
        self.global_params = {k: v.to(self.device) for k, v in state["global"].items()}
        self.server_buf = {k: v.to(self.device) for k, v in state["server_buf"].items()}

    def weights(self):
        return {"client": cpu_tree(self.global_params)}

    def load_weights(self, weights):
        self.global_params = {k: v.to(self.device) for k, v in weights["client"].items()}
