"""FedEM: Federated Expectation-Maximization (Marfoq, Neglia, Bellet, Kameni, Vidal, NeurIPS 2021, Alg. 1-2).

Every client's data is modelled as a mixture of M shared components: ``p_i(y | x) = sum_m pi_im p_m(y | x)``
(§2, Assumption 2), the components theta_1..theta_M shared by all clients, the weights pi_i a client's own.
A round (Alg. 1 with Alg. 2's client update): the server sends the M components; each cohort client takes an
E-step, the posterior ``q_s(m) ∝ pi_im p_m(y_s | x_s)`` of each of its samples, sets ``pi_i`` to their mean,
then trains the components on its data by local SGD (``local_steps`` steps or ``local_epochs`` epochs) and
sends them back; the server averages each component over the cohort, weighted by data size.

pflx's M-step trains the M components of a client together on the mixture's negative log-likelihood
``-log sum_m pi_im p_m(y | x)`` with the new pi_i held fixed (:class:`pfl_cli.fl.mixture.MixtureNet`, one
vectorized call over the cohort). Its gradient in theta_m is ``sum_s q_s(m) grad l(theta_m; s)`` with the
posterior at the current components: Alg. 2's weighted loss, whose weights pflx refreshes at every step
where Alg. 2 keeps the round-start E-step's (the departure, said here). The E-step scores every cohort client
under the M components in batched forwards (:func:`pfl_cli.fl.clusters.mixture_weights`).

A client's model is the mixture with its own pi_i (kept per client, in the checkpoint and ``model.pt``). A
client unseen in training fits its weights on its own data with the components frozen: ``new_client_em_steps``
E-steps from the uniform weights (the paper's protocol for unseen clients, §3.3), no optimizer step.
Exchanged per cohort client and round: the M components down and up (2 M |theta|). No DP variant.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from pfl_cli.algorithms.base import Algorithm, seeded
from pfl_cli.algorithms.fedavg import FedAvgRoundConfig
from pfl_cli.fl.config import check_own_keys, key
from pfl_cli.fl.params import cpu_tree
from pfl_cli.fl.secagg import cohort_mean

MARFOQ = "Marfoq et al. (NeurIPS 2021)"


@dataclass(frozen=True)
class FedEMConfig(FedAvgRoundConfig):
    """FedEM's keys: FedAvg's round, the number of components and the EM steps of a new client."""

    algorithm: str = key("fedem", "the algorithm these keys configure")
    num_components: int = key(3, "M: shared component models of every client's mixture",
                              f"{MARFOQ} §5: M = 3 components in every experiment")
    new_client_em_steps: int = key(10, "E-steps fitting a new client's mixture weights (components frozen)",
                                   f"{MARFOQ} §3.3 (unseen clients: the weights fitted on local data, the "
                                   "components fixed; the number of EM iterations is pflx's 10)")

    def validate(self) -> None:
        super().validate()
        check_own_keys(self, {"num_components": "an integer >= 1", "new_client_em_steps": "an integer >= 0"})


class FedEM(Algorithm):
    name = "fedem"
    individual_reads = ""  # under --secagg the mean of the component models from the cohort's sums
    paper = "FedEM: Marfoq et al., NeurIPS 2021 (Alg. 1-2, mixture of M shared components)"
    new_client_protocol = "its mixture weights fitted by new_client_em_steps E-steps with the components frozen"
    config = FedEMConfig
    dp_unit = None  # no DP variant
    not_distributed = "its E-step reads every cohort client's data under the M components in one process"
    inert_keys = {k: "its server averages each component over the cohort (Marfoq et al. 2021, Alg. 1): there is no "
                  "server step" for k in ("server_lr", "server_momentum")}
    search_space = {"lr": "log:1e-3:1", "num_components": "int:1:5"}
    search_space_source = (f"{MARFOQ} §5, App. I: M = 3 throughout, other M in the ablation (M from 1 to 5); pflx "
                           "searches M in [1, 5] with the client lr")
    tune_group = "train"

    @staticmethod
    def resolve_arch(cfg, store) -> dict:
        return {**Algorithm.resolve_arch(cfg, store), "fedem": {"components": int(cfg.num_components)}}

    @staticmethod
    def floats_per_client_round(arch: dict) -> int:
        from pfl_cli.models import num_parameters

        return 2 * int(arch["fedem"]["components"]) * num_parameters(arch["client"])

    def build(self) -> None:
        import torch

        from pfl_cli.fl.client_state import ClientState
        from pfl_cli.fl.mixture import MixtureNet
        from pfl_cli.models import build

        k = int(self.arch["fedem"]["components"])
        self.k = k
        self.net = seeded(self.cfg.seed, "init-client",
                          lambda: MixtureNet(lambda: build(self.arch["client"]), k)).to(self.device)
        self.base = self.net.components[0]
        self.components = {n: v.detach().clone() for n, v in self.net.named_parameters() if n != "pi"}
        self.private = ClientState({"pi": torch.full((k,), 1.0 / k, device=self.device)}, self.store.num_clients,
                                   self.store.partition_sha)

    def stacked(self) -> dict:
        """The components as one stack per client-net tensor: {name: (M, ...)}."""
        import torch

        names = [n for n, _ in self.base.named_parameters()]
        return {n: torch.stack([self.components[f"components.{m}.{n}"] for m in range(self.k)]) for n in names}

    def e_step(self, clients, pi):
        from pfl_cli.fl.clusters import mixture_weights
        from pfl_cli.fl.cohort import resolve_cohort_exec

        how = resolve_cohort_exec(self.cfg.cohort_exec, self.base, self.device)
        return mixture_weights(self.base, self.store, self.store.fit, clients, self.stacked(), pi, how)

    def run_round(self, t, cohort, gen):
        from pfl_cli.fl.params import broadcast

        c = len(cohort)
        for k, v in self.components.items():
            self.traffic.send(k, v, copies=c)
        pi = self.e_step(cohort, self.private.gather(cohort)["pi"])          # E-step: pi_i = mean_s q_s
        start = {**broadcast(self.components, c), "pi": pi}
        theta, loss, _ = self.cohort_sgd(start, cohort, gen, trainable=set(self.components),
                                         **self.round_schedule())
        theta = {k: v for k, v in theta.items() if k != "pi"}
        for k, v in theta.items():
            self.traffic.receive(k, v)
        self.private.scatter(cohort, {"pi": pi})
        self.components = cohort_mean(self.store, cohort, theta, secagg=self.cfg.secagg)
        return loss

    # ------------------------------------------------------------------ models for clients
    def has_state(self, clients: np.ndarray) -> np.ndarray:
        return self.private.known(np.asarray(clients, dtype=np.int64), self.store.partition_sha)

    def personalize(self, clients: np.ndarray, gen):
        import torch

        from pfl_cli.fl.params import stack

        clients = np.asarray(clients, dtype=np.int64)
        rows = torch.as_tensor(clients, device=self.device)
        known = torch.as_tensor(self.has_state(clients), device=self.device)
        pi = torch.full((len(clients), self.k), 1.0 / self.k, device=self.device)
        if bool(known.any()):
            pi[known] = self.private.values["pi"][rows[known]]
        if bool((~known).any()):
            fit = pi[~known]
            for _ in range(int(self.cfg.new_client_em_steps)):
                fit = self.e_step(rows[~known], fit)
            pi[~known] = fit
        return {**stack(self.components, len(clients)), "pi": pi}, True

    def protocol(self, new: bool) -> dict:
        if not new:
            return {"protocol": "the mixture with its own weights", "rounds": 0}
        return {"protocol": f"the mixture with weights fitted by {self.cfg.new_client_em_steps} E-steps, components "
                            "frozen", "rounds": 0}

    def state(self):
        return {"components": {k: v.detach().clone() for k, v in self.components.items()},
                "private": self.private.state()}

    def load_state(self, state):
        self.components = {k: v.to(self.device) for k, v in state["components"].items()}
        self.private.load_state(state["private"], self.device)

    def weights(self):
        return cpu_tree(self.state(), clone=True)

    def load_weights(self, weights):
        self.load_state(weights)
