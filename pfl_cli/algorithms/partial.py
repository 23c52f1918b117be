"""Shared base of the algorithms that share one part of the client net and keep the other private.

FedRep and FedPer share the body and keep a personal head; LG-FedAvg keeps a local body
and shares the head (the split is :mod:`pfl_cli.fl.split`). The private part of every
client lives in a :class:`~pfl_cli.fl.client_state.ClientState` on the device, is written
after each round the client takes part in, checkpointed, saved in ``model.pt`` and used by
``predict --clients train`` on the partition it was trained on. A client without private
state (new, or never sampled) gets a fresh private part trained on its own data for
``new_client_epochs`` epochs with the shared part frozen (PeFLL's baselines, thesis §4.4, App. B.1.2).
Only the shared part is exchanged: 2 x |shared| floats per cohort client and round.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import numpy as np

from pfl_cli.algorithms.base import Algorithm, PrivateState, epochs_protocol
from pfl_cli.fl.config import TrainConfig, key
from pfl_cli.fl.params import cpu_tree, stack
from pfl_cli.fl.robust import average_uploads, corrupt_uploads


class _GlobalModel(Algorithm):
    """The server's state: one global client net (only its shared part is ever updated)."""

    server_buf: dict | None = None  # the server momentum buffer of :meth:`server_average` (none before a step)

    def server_average(self, mean: dict) -> dict:
        """The global parameters after the server step towards the cohort's aggregate ``mean`` (its keys only).

        FedAvg's server step (:func:`pfl_cli.fl.server.momentum_step`) with the config's ``server_lr``
        and ``server_momentum``; their defaults (1, 0) give ``mean`` itself, the paper's aggregation. A
        config without those keys takes the mean.
        """
        from pfl_cli.fl.server import momentum_step

        lr, momentum = getattr(self.cfg, "server_lr", 1.0), getattr(self.cfg, "server_momentum", 0.0)
        params, self.server_buf = momentum_step(self.global_params, self.server_buf or {}, mean, lr=lr,
                                                momentum=momentum)
        return params

    def state(self):
        state = {"global": {k: v.detach().clone() for k, v in self.global_params.items()}}
        if self.server_buf:
            state["server_buf"] = {k: v.detach().clone() for k, v in self.server_buf.items()}
        return state

    def load_state(self, state):
        self.global_params = {k: v.to(self.device) for k, v in state["global"].items()}
        buf = state.get("server_buf")
        self.server_buf = {k: v.to(self.device) for k, v in buf.items()} if buf else None

    def weights(self):
        return {"client": cpu_tree(self.global_params)}

    def load_weights(self, weights):
        self.global_params = {k: v.to(self.device) for k, v in weights["client"].items()}


@dataclass(frozen=True)
class PartialSharingConfig(TrainConfig):
    """Keys of the algorithms that share one part of the client net (FedPer, LG-FedAvg; FedRep adds its own)."""

    rounds: int = key(5000, "communication rounds", "thesis §4.4, App. B.1.2: all methods but Local train 5000 rounds")
    local_steps: int = key(50, "k: client SGD steps per round", "thesis §4.4: k = 50")
    local_epochs: Optional[int] = key(None, "epochs of local SGD per round instead of local_steps (null: steps)")
    new_client_epochs: int = key(20, "epochs a client without private state trains its private part",
                                 "thesis §4.4, App. B.1.2: a random new head trained locally for 20 epochs")


class PartialSharing(PrivateState, _GlobalModel):
    shared_part = "body"          # "body" (FedRep, FedPer) or "head" (LG-FedAvg)
    average_by_size = True        # server mean weighted by client data size, or uniform

    @classmethod
    def floats_per_client_round(cls, arch: dict) -> int:
        from pfl_cli.fl.split import part_floats

        return 2 * part_floats(arch["client"], cls.shared_part, cls.name)

    def build(self) -> None:
        from pfl_cli.fl.split import split_names

        self.net = self.client_net()
        self.body, self.head = split_names(self.net, self.name)
        self.shared, self.private_names = ((self.body, self.head) if self.shared_part == "body"
                                           else (self.head, self.body))
        init = {k: v.detach().clone() for k, v in self.net.named_parameters()}
        self.init_private = {k: init[k] for k in self.private_names}
        self.global_params = init
        self.private = self.new_private_state(self.init_private)

    def local_update(self, start: dict, cohort, gen):
        """The cohort's local training from ``start`` (stacked): (params, loss); default: the whole net jointly."""
        theta, loss, _ = self.cohort_sgd(start, cohort, gen, **self.round_schedule())
        return theta, loss

    def run_round(self, t, cohort, gen):
        start = stack(self.global_params, len(cohort))
        start.update(self.private.gather(cohort))
        theta, loss = self.local_update(start, cohort, gen)
        sent = corrupt_uploads(self, t, cohort, {k: theta[k] for k in self.shared})  # only the shared part travels
        if self.upload_codec is not None:  # its delta as compressed on the wire (pfl_cli.fl.compression)
            sent = self.upload_codec.compress_models(self, cohort, {k: self.global_params[k] for k in self.shared},
                                                     sent)
        else:
            self.record_exchange({k: self.global_params[k] for k in self.shared}, sent, len(cohort))
        mean = average_uploads(self, cohort, sent, by_size=self.average_by_size,
                               secagg=self.cfg.secagg)  # under --secagg from the cohort's sums only
        self.global_params.update(mean)
        self.private.scatter(cohort, {k: theta[k] for k in self.private_names})
        return loss

    def own_models(self, rows):
        own = stack({k: self.global_params[k] for k in self.shared}, len(rows))
        own.update(self.private.gather(rows))
        return own

    def protocol(self, new: bool) -> dict:
        """A train client with state: its own private part on the shared part; a new one: ``new_client_protocol``."""
        return epochs_protocol(new, self.cfg.new_client_epochs, "its own private part on the shared part",
                               self.new_client_protocol.replace("new_client_epochs", "{e} epochs"),
                               "the initial private part on the shared part (new_client_epochs 0)")

    def new_clients(self, clients: np.ndarray, gen) -> dict:
        """A fresh private part trained ``new_client_epochs`` epochs on the frozen shared part."""
        start = {**self.global_params, **self.init_private}
        if self.cfg.new_client_epochs == 0:
            return stack(start, len(clients))
        return self.train_clients(start, clients, gen, epochs=self.cfg.new_client_epochs,
                                  trainable=self.private_names)
