"""FedExP: FedAvg with a server step size from the pseudo-gradients' norms (Jhunjhunwala, Wang & Joshi, ICLR 2023).

"FedExP: Speeding Up Federated Averaging via Extrapolation", Alg. 1: the clients run FedAvg's
local SGD from the global model; the server extrapolates along the cohort's mean delta by

    eta_g = max(1, sum_i p_i ||Delta_i||^2 / (2 (||sum_i p_i Delta_i||^2 + eps)))

(:func:`pfl_cli.fl.server_optim.extrapolation_step`), which is large when the clients' updates
disagree and 1 (FedAvg's step) when they agree. Alg. 1 weighs the M clients uniformly
(p_i = 1/M); pflx weighs them by data size, as its FedAvg (McMahan et al. 2017 Alg. 1) does
(equal sizes: Alg. 1 exactly). The iterates oscillate, and the paper evaluates the average of
the last two (§5, "averaging the last two iterates"): ``average_last_two`` (on by default) serves that
average; the rounds themselves go on from the last iterate, as Alg. 1.
A client unseen in training uses the served model, or fine-tunes it ``finetune_steps`` steps, as FedAvg's.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from pfl_cli.algorithms.fedavg import FedAvg
from pfl_cli.fl.config import key
from pfl_cli.fl.finetune import FinetuneAdapterKeys
from pfl_cli.fl.params import cpu_tree
from pfl_cli.fl.server_optim import extrapolation_step

FEDEXP = "Jhunjhunwala et al., ICLR 2023"


@dataclass(frozen=True)
class FedExPConfig(FinetuneAdapterKeys):
    """FedExP's keys: FedAvg's round and Alg. 1's eps."""

    algorithm: str = key("fedexp", "the algorithm these keys configure")
    rounds: int = key(500, "communication rounds", f"{FEDEXP}, §6: 500 rounds on EMNIST")
    clients_per_round: Optional[int] = key(20, "cohort size of every round (null: every train client)",
                                           f"{FEDEXP}, §6: M = 20 clients a round")
    local_steps: int = key(20, "tau: client SGD steps per round", f"{FEDEXP}, §6: tau = 20 local steps")
    local_epochs: Optional[int] = key(None, "epochs of local SGD per round instead of local_steps (null: steps)")
    lr: float = key(10 ** -1.5, "client SGD step size eta_l",
                    f"{FEDEXP}, §6: eta_l tuned for FedAvg and kept for FedExP; 10^-1.5, FedOpt's (Reddi et al., "
                    "ICLR 2021, App. D grid)")
    momentum: float = key(0.0, "client SGD momentum", f"{FEDEXP}, Alg. 1: local SGD (no momentum)")
    eps: float = key(1e-3, "eps of the step size's denominator (small: more extrapolation)",
                     f"{FEDEXP}, §6: eps = 10^-3 (tuned on {{10^-3, 10^-2, 10^-1}})")
    average_last_two: bool = key(True, "serve the average of the last two global models (false: the last)",
                                 f"{FEDEXP}, §5: the average of the last two iterates is evaluated")
    finetune_steps: int = key(0, "local steps from the served model before evaluation (0: the served model)",
                              "FedAvg's protocol: a new client uses the global model as-is")

    def validate(self) -> None:
        super().validate()
        from pfl_cli.fl.config import check_own_keys

        check_own_keys(self, {"eps": "a finite number > 0"})


SPREAD = "__fedexp_spread__"  # a client's n_i ||Delta_i||^2 under --secagg


class FedExP(FedAvg):
    name = "fedexp"
    compressible_upload = True  # its upload is FedAvg's delta; eta_g reads the deltas as decoded (Alg. 1)
    individual_reads = ""  # runs under --secagg: FedAvg's aggregate_secure (pfl_cli.fl.secagg)
    # Their clients run FedAvg's round, but `pflx attack`'s upload model has not been checked against them, and they
    # take no --dp: not attacked until a test says the modelled upload is theirs.
    models_upload = False
    upload_under_dp = False
    search_space = {"lr": "log:1e-3:1", "eps": "choice:0.001,0.01,0.1"}
    search_space_source = (f"{FEDEXP}, §6 / App. C: the client lr tuned on a log grid, eps from "
                           "{10^-3, 10^-2, 10^-1}")
    tune_group = "train"
    paper = f"FedExP: {FEDEXP}, Alg. 1"
    new_client_protocol = "the global model (the last two averaged), or it fine-tuned finetune_steps steps"
    config = FedExPConfig
    serves_unlabeled = "fedexp without --finetune-steps (one global model)"

    def build(self) -> None:
        super().build()
        del self.server_buf  # no server momentum: the step size is the only server state of a round
        self.previous = {k: v.clone() for k, v in self.global_params.items()}
        self.server_eta = []  # eta_g of every round, for the record (metrics and tests)

    def aggregate(self, t: int, cohort, theta: dict) -> None:
        """Alg. 1 lines 8-10: the cohort's deltas, eta_g from their norms, the extrapolated global model."""
        import torch

        if self.cfg.secagg:  # FedAvg's secure round, with this class's contributions and server step
            return super().aggregate(t, cohort, theta)
        if self.upload_codec is not None:  # the deltas as compressed on the wire (pfl_cli.fl.compression)
            theta = self.upload_codec.compress_models(self, cohort, self.global_params, theta)
        else:
            self.record_exchange(self.global_params, theta, len(cohort))
        size = self.store.fit.length[cohort].to(torch.float32)
        weight = size / size.sum().clamp_min(1.0)
        deltas = {k: theta[k] - g for k, g in self.global_params.items()}
        self.previous = self.global_params
        self.global_params, eta = extrapolation_step(self.global_params, deltas, weight, eps=self.cfg.eps)
        self.server_eta.append(eta)

    def secure_contributions(self, t: int, cohort, theta: dict) -> dict:
        """Under ``--secagg`` each client also sends ``n_i ||Delta_i||^2``, the term of eta_g's numerator that the
        plain server computes from the individual deltas (Alg. 1 line 9), so that sums give eta_g: the same step
        (equal to float rounding, tests/fl/test_secagg.py)."""
        import torch

        rows = super().secure_contributions(t, cohort, theta)
        n = self.store.fit.length[cohort].to(torch.float64)
        sq = sum((theta[k] - g).flatten(1).double().pow(2).sum(1) for k, g in self.global_params.items())
        return {**rows, SPREAD: n * sq}

    def aggregate_secure(self, t: int, total) -> None:
        """Alg. 1 lines 8-10 from the cohort's sums: the weighted mean delta and sum_i p_i ||Delta_i||^2."""
        from pfl_cli.fl.secagg import WEIGHT

        sums = total.total()
        weight = sums.pop(WEIGHT).clamp_min(1.0)
        spread = sums.pop(SPREAD) / weight.double()
        mean = {k: v / weight - self.global_params[k] for k, v in sums.items()}
        norm = sum(d.double().pow(2).sum() for d in mean.values())
        eta = max(1.0, float(spread / (2.0 * (norm + self.cfg.eps))))
        self.previous = self.global_params
        self.global_params = {k: g + eta * mean[k] for k, g in self.global_params.items()}
        self.server_eta.append(eta)

    def served(self) -> dict:
        """The model clients get: the last two iterates' average (§5), or the last iterate."""
        if not self.cfg.average_last_two:
            return self.global_params
        return {k: 0.5 * (g + self.previous[k]) for k, g in self.global_params.items()}

    def global_model(self):
        """The model every client is served (:meth:`served`), which ``global_accuracy`` scores."""
        found = super().global_model()
        return None if found is None else (found[0], self.served())

    def personalize(self, clients, gen):
        served = self.served()
        if self.finetune_steps > 0:  # all weights, or LoRA adapters (Algorithm.finetune)
            return self.finetune(served, clients, gen, self.finetune_steps), True
        return served, False

    def state(self):
        return {"global": {k: v.detach().clone() for k, v in self.global_params.items()},
                "previous": {k: v.detach().clone() for k, v in self.previous.items()}}

    def load_state(self, state):
        self.global_params = {k: v.to(self.device) for k, v in state["global"].items()}
        self.previous = {k: v.to(self.device) for k, v in state["previous"].items()}

    def weights(self):
        return {"client": cpu_tree(self.served())}

    def load_weights(self, weights):
        self.global_params = {k: v.to(self.device) for k, v in weights["client"].items()}
        self.previous = self.global_params
