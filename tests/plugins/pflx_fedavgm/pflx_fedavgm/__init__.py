"""FedAvgM: FedAvg with server momentum (Hsu, Qi, Brown 2019, Alg. 1), written on pflx's public API.

Each round the cohort starts from the global model w and runs ``local_steps`` SGD steps; the
server forms the size-weighted mean delta d and moves  v <- beta v + d,  w <- w + server_lr v.
"""

from __future__ import annotations

from dataclasses import dataclass

from pfl_cli.algorithms.base import Algorithm, stack, weighted_mean
from pfl_cli.fl.config import TrainConfig, key


@dataclass(frozen=True)
class FedAvgMConfig(TrainConfig):
    """The keys FedAvgM takes on top of the common ones, with its paper's defaults."""

    algorithm: str = key("fedavgm", "the algorithm these keys configure")
    local_steps: int = key(50, "client SGD steps per round")
    server_lr: float = key(1.0, "server step on the momentum buffer", "Hsu et al. 2019, Alg. 1")
    server_momentum: float = key(0.9, "beta: server momentum", "Hsu et al. 2019, Fig. 2 (beta = 0.9)")


class FedAvgM(Algorithm):
    name = "fedavgm"
    config = FedAvgMConfig
    paper = "FedAvgM: Hsu, Qi, Brown 2019 (a pflx plugin)"
    new_client_protocol = "the global model"
    personalized = False

    def build(self) -> None:
        self.net = self.client_net()
        self.w = {k: v.detach().clone() for k, v in self.net.named_parameters()}
        self.v = {k: t.new_zeros(t.shape) for k, t in self.w.items()}

    def run_round(self, t, cohort, gen):
        theta, loss, _ = self.cohort_sgd(stack(self.w, len(cohort)), cohort, gen, steps=self.cfg.local_steps)
        self.record_exchange(self.w, theta, len(cohort))
        mean = weighted_mean(self.store, cohort, theta)
        for k in self.w:
            self.v[k] = self.cfg.server_momentum * self.v[k] + (mean[k] - self.w[k])
            self.w[k] = self.w[k] + self.cfg.server_lr * self.v[k]
        return loss

    def personalize(self, clients, gen):
        return self.w, False  # one global model for every client

    def state(self):
        return {"w": {k: t.clone() for k, t in self.w.items()}, "v": {k: t.clone() for k, t in self.v.items()}}

    def load_state(self, state):
        self.w = {k: t.to(self.device) for k, t in state["w"].items()}
        self.v = {k: t.to(self.device) for k, t in state["v"].items()}

    def weights(self):
        return {"client": {k: t.detach().cpu() for k, t in self.w.items()}}

    def load_weights(self, weights):
        self.w = {k: t.to(self.device) for k, t in weights["client"].items()}

    @property
    def needs_labels_to_predict(self) -> bool:
        return False
