"""Centralized reference: one model trained on the pooled train splits of every train client.

The upper bound a federated-learning table prints beside its methods (issue 40): no federation, no
client drift, the same model, optimizer and amount of training as a federated run of the same config,
scored the same way (``metrics.json``, ``clients.csv``, ``pflx predict``, ``pflx compare``).

The same number of sample passes, per round: the round loop draws the round's cohort exactly as a
federated run of the same seed does (``clients_per_round`` train clients with labels), and the one model
takes as many SGD steps of ``batch_size`` samples as that cohort takes in all: ``|cohort| x local_steps``,
or under ``local_epochs`` E ``sum_i E x ceil(n_i / b)`` over the cohort's clients. Its batches are drawn
from the pool (the fit samples of every labeled train client, reshuffled each pass), not from the cohort's
clients: every round processes the federated round's number of samples. The optimizer is FedAvg's client
SGD (``lr``, ``momentum``, ``client_clip``, ``lambda_theta``) run as one optimizer over the whole run: its
momentum buffer is carried from round to round (checkpointed), as centralized training keeps it (a
federated client's buffer starts fresh each round).

Every client, seen in training or not, gets the one model, or it fine-tuned ``finetune_steps`` local steps
on its own data (FedAvg's protocol). Nothing is exchanged (0 floats a client and round). ``server_lr``
and ``server_momentum`` are refused (there is no server step). A partition without train clients
(every client holdout) is refused by ``pflx train`` as for every algorithm (``--partition``, one line, exit 2);
one whose train clients have no labels, by the round loop (``check_trainable``): nothing to pool.

No DP variant (``--dp`` is refused): the engine's example-level DP-SGD block (:mod:`pfl_cli.fl.dpsgd`)
calibrates per client, each client's records sampled at its own rate and its steps counted per client
cohort; a pooled DP-SGD needs the pool's size as a public bound and its own accounting of c x k steps a
round, which is not built here.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from pfl_cli.algorithms.fedavg import FedAvg, FedAvgConfig
from pfl_cli.fl.config import key
from pfl_cli.fl.params import broadcast


@dataclass(frozen=True)
class CentralizedConfig(FedAvgConfig):
    """FedAvg's keys (the round sets the amount of training); no server step."""

    algorithm: str = key("centralized", "the algorithm these keys configure")


class Centralized(FedAvg):
    name = "centralized"
    paper = "centralized reference: one model on the pooled train splits (the upper bound of FL tables)"
    new_client_protocol = "the one model, or it fine-tuned finetune_steps steps"
    config = CentralizedConfig
    dp_unit = None
    models_upload = False
    upload_under_dp = False
    serves_unlabeled = "centralized without --finetune-steps (one model)"
    not_distributed = "it trains one model on the pooled data of every train client in one process"
    search_space = {"lr": "log:1e-3:1"}
    search_space_source = ("tuned as the federated runs it bounds: McMahan et al. 2017, §3, the lr tuned per task "
                           "(a grid of two to three decades)")
    tune_group = "train"
    inert_keys = {k: "it trains one model on the pooled data, with no server step (the centralized reference)"
                  for k in ("server_lr", "server_momentum")}

    def build(self) -> None:
        import torch

        from pfl_cli.fl.store import ROLE_TRAIN, Padded

        super().build()
        del self.server_buf  # no server step
        fit = self.store.fit
        train = np.asarray(self.store.clients(ROLE_TRAIN))
        train = train[np.asarray(self.store.labeled)[train]]
        if len(train):
            rows, length = fit.rows(torch.as_tensor(train, device=self.device))
            pooled = torch.cat([r[:n] for r, n in zip(rows, length.tolist())])
        else:  # prediction on a partition without train clients: nothing to pool, nothing trained here
            pooled = torch.zeros(0, dtype=torch.long, device=self.device)
        self.pool = Padded(pooled.unsqueeze(0) if len(pooled) else torch.zeros((1, 1), dtype=torch.long,
                                                                               device=self.device),
                           torch.as_tensor([len(pooled)], device=self.device))
        self.momentum_buf = {k: v.new_zeros((1, *v.shape)) for k, v in self.global_params.items()}

    def round_steps(self, cohort) -> int:
        """The SGD steps the round's cohort takes in all in a federated run of this config."""
        epochs = self.round_schedule().get("epochs")
        if epochs:
            return int(self.epoch_steps(cohort, epochs)[1].sum())
        return len(cohort) * int(self.cfg.local_steps)

    def run_round(self, t, cohort, gen):
        import torch

        from pfl_cli.fl.batches import CohortBatches
        from pfl_cli.fl.cohort import local_sgd

        steps = self.round_steps(cohort)
        one = torch.zeros(1, dtype=torch.long, device=self.device)
        batches = CohortBatches(self.pool, one, steps, self.cfg.batch_size, gen)
        theta, loss = local_sgd(self.net, broadcast(self.global_params, 1), self.store, batches,
                                momentum_state=self.momentum_buf, **self.sgd_options())
        self.global_params = {k: v[0] for k, v in theta.items()}
        return loss

    def state(self):
        return {"global": {k: v.detach().clone() for k, v in self.global_params.items()},
                "momentum": {k: v.detach().clone() for k, v in self.momentum_buf.items()}}

    def load_state(self, state):
        self.global_params = {k: v.to(self.device) for k, v in state["global"].items()}
        self.momentum_buf = {k: v.to(self.device) for k, v in state["momentum"].items()}

    @staticmethod
    def floats_per_client_round(arch: dict) -> int:
        """Nothing is exchanged: the data are pooled."""
        return 0

