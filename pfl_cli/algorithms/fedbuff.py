"""FedBuff: buffered asynchronous aggregation (Nguyen, Malik, Zhan, Yousefpour, Rabbat, Malek, Huba, AISTATS 2022,
Alg. 1).

``concurrency`` clients train at once, each from the model version it downloaded, for ``local_steps`` local SGD
steps (Alg. 1's ClientUpdate), and send their delta ``Delta_i = x_start - x_i`` (here stored as ``x_i - x_start``).
The server adds each arriving delta, weighted by its staleness ``s(tau) = 1 / sqrt(1 + tau)`` (§3: tau the server
steps since the client downloaded its model), into a buffer; when the buffer holds K updates it takes one server
step ``x <- x + eta_g (1/K) sum_i s(tau_i) Delta_i`` (Alg. 1 lines 10-13) and empties the buffer; a client that
answers is replaced at once by a new one (constant concurrency).

In pflx a round is one server step: one buffer of K = ``clients_per_round`` updates, so ``--rounds``, evaluation,
checkpoints and ``--resume`` count server steps. Client durations come from the federation conditions' per-client
speeds (``compute_speed``, ``network_speed``) and the simulated clock advances to each arrival
(:mod:`pfl_cli.fl.asynchronous`): ``metrics.csv``'s ``sim_seconds`` is the time-to-accuracy axis. A new client gets
the global model, or it fine-tuned ``finetune_steps`` local steps (as FedAvg's protocol).

The server step is Alg. 1's ServerUpdate with SGD as the server optimizer: ``server_lr`` is eta_g and
``server_momentum`` beta, the heavy ball ``m <- beta m + Dbar``, ``x <- x + eta_g m`` on the buffer's
staleness-weighted mean delta ``Dbar`` (FedBuff is "agnostic to the choice of optimizer", abstract; its §6 baseline
FedAvgM is this step on a synchronous round). The momentum buffer is in the checkpoint. A client's local solver is
pflx's client SGD (``lr``, ``momentum``, ``client_clip``), as FedAvg's.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from pfl_cli.algorithms.base import Algorithm
from pfl_cli.fl.asynchronous import GlobalModelOnTheClock
from pfl_cli.fl.config import check_own_keys, key
from pfl_cli.fl.finetune import FinetuneAdapterKeys

NGUYEN = "Nguyen et al. (AISTATS 2022)"


@dataclass(frozen=True)
class FedBuffConfig(FinetuneAdapterKeys):
    """FedBuff's keys: the buffer size K, the concurrency, the server step and the clients' local steps."""

    algorithm: str = key("fedbuff", "the algorithm these keys configure")
    rounds: int = key(1000, "server steps (each one buffer of clients_per_round client updates)")
    clients_per_round: int = key(10, "K: client updates in the buffer of one server step (a pflx round)",
                                 f"{NGUYEN} §6: K = 10 in every experiment")
    concurrency: int = key(30, "clients training at once (a new one starts whenever one answers); at most the train "
                               "clients with labels",
                           f"{NGUYEN} §6 runs concurrency several times K (e.g. 100 and 1000 with K = 10); pflx: 3 K, "
                           "sized for partitions of tens of clients")
    local_steps: int = key(50, "local SGD steps of a client's job", "pflx: FedAvg's default (thesis §4.4: k = 50)")
    server_lr: float = key(1.0, "eta_g: the server step on the buffer's staleness-weighted mean delta",
                           f"{NGUYEN} Alg. 1 line 12 (eta_g is tuned in §6; 1 moves to the buffer's weighted mean)")
    server_momentum: float = key(0.0, "beta: heavy-ball momentum of the server step (m <- beta m + Dbar, "
                                      "x <- x + eta_g m); 0: the plain step",
                                 f"{NGUYEN} Alg. 1: the server step is a server optimizer's (SGD: beta = 0 is "
                                 "Alg. 1's x + eta_g Dbar); FedAvgM's heavy ball for beta > 0")
    finetune_steps: int = key(0, "local steps from the global model before evaluation (0: the global model)",
                              "pflx: FedAvg's new-client protocol (the global model as-is)")

    def validate(self) -> None:
        super().validate()
        check_own_keys(self, {"concurrency": "an integer >= 1"})
        if self.clients_per_round is None:
            from pfl_cli.errors import ConfigError

            raise ConfigError("clients_per_round is K, the updates in fedbuff's buffer (one server step); null is "
                              "not a buffer size. Set an integer >= 1 (the paper's K = 10).")


class FedBuff(GlobalModelOnTheClock, Algorithm):
    name = "fedbuff"
    compressible_upload = True  # each job's delta from the model it downloaded (AsyncServer._train)
    individual_reads = ("each client's update as it arrives (asynchronous: there is no cohort whose sum "  # --secagg
                        "secure aggregation could reveal alone)")
    paper = "FedBuff: Nguyen et al., AISTATS 2022 (Alg. 1, staleness s(tau) = 1/sqrt(1+tau) §3)"
    new_client_protocol = "the global model, or it fine-tuned finetune_steps steps"
    config = FedBuffConfig
    dp_unit = None  # no DP variant
    not_distributed = "its asynchronous server simulates every in-flight client's job in one process"
    asynchronous = True
    mixes_each_arrival = False  # the buffer's K arrivals make one server step
    serves_unlabeled = "fedbuff without --finetune-steps (one global model)"
    search_space = {"lr": "log:1e-3:1", "server_lr": "log:0.1:10", "server_momentum": "choice:0,0.5,0.9"}
    search_space_source = (f"{NGUYEN} §6: the client and the server learning rates are tuned per task (K fixed at "
                           "10); pflx searches both over their decades, and the server momentum among 0, 0.5, 0.9")
    tune_group = "train"

    @staticmethod
    def uploads(start: dict, theta: dict) -> dict:
        """Alg. 1's client message: the delta of each job's model from the model it downloaded."""
        return {k: theta[k] - start[k] for k in start}

    def build(self) -> None:
        super().build()
        self.server_buf = {}  # the server momentum m, zeros until the first step (momentum_step)

    def buffer_step(self, deltas: list, staleness: np.ndarray) -> None:
        """Alg. 1 lines 10-13: the server step on ``Dbar = (1/K) sum_i s(tau_i) Delta_i`` over the buffer's K deltas."""
        self.global_params, self.server_buf = buffered_step(
            self.global_params, deltas, staleness, server_lr=float(self.cfg.server_lr),
            server_momentum=float(self.cfg.server_momentum), buf=self.server_buf)

    def state(self):
        return {**super().state(), "server_buf": {k: v.detach().clone() for k, v in self.server_buf.items()}}

    def load_state(self, state):
        super().load_state(state)
        self.server_buf = {k: v.to(self.device) for k, v in state["server_buf"].items()}


def buffered_step(global_params: dict, deltas: list, staleness: np.ndarray, *, server_lr: float,
                  server_momentum: float = 0.0, buf: dict | None = None):
    """FedBuff's server step on a full buffer: ``Dbar = 1/K sum_i s(tau_i) Delta_i`` with ``s(tau) = 1 / sqrt(1 + tau)``
    (Nguyen et al. 2022, Alg. 1 lines 10-13 and §3), then the server optimizer's step on it: SGD with heavy-ball
    momentum, ``m <- beta m + Dbar``, ``x <- x + eta_g m`` (:func:`pfl_cli.fl.server.momentum_step`, FedAvgM's).
    Returns the new model and the new momentum buffer (``buf`` None or empty: zeros)."""
    import torch

    from pfl_cli.fl.asynchronous import staleness_weight
    from pfl_cli.fl.server import momentum_step

    weights = staleness_weight(staleness, "polynomial", a=0.5)
    k = len(deltas)
    target = {}
    for name, x in global_params.items():
        w = torch.as_tensor(weights, dtype=x.dtype, device=x.device).view(-1, *([1] * x.dim()))
        target[name] = x + (torch.stack([d[name] for d in deltas]) * w).sum(0) / k   # x + Dbar
    return momentum_step(global_params, buf or {}, target, lr=server_lr, momentum=server_momentum)
