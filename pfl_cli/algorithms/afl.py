"""AFL: Agnostic Federated Learning (Mohri, Sivek, Suresh, ICML 2019, Eq. 2 and §5, Stochastic-AFL).

AFL trains the model for the worst mixture of the clients' distributions: ``min_w max_{lambda in Lambda}
L(w, lambda) = sum_k lambda_k F_k(w)`` (Eq. 2), Lambda the simplex over the N train clients. Stochastic-AFL
(§5) alternates a descent step in w and a projected ascent step in lambda, each on a sampled estimate of the
gradient: for a cohort S of the N clients, the gradient of L in lambda is estimated by
``g_k = (N / |S|) F_k(w)`` for k in S (0 elsewhere), and ``lambda <- Proj_Lambda(lambda + gamma_lambda g)``, the
Euclidean projection onto the simplex (:func:`project_simplex`, Duchi et al. 2008's sort-based algorithm).

pflx's round: the server sends w; each cohort client computes F_k(w) on its training data and runs local SGD
(FedAvg's round: ``local_steps`` steps or ``local_epochs`` epochs); the server moves w by the lambda-weighted
mean of the cohort's updates, ``w <- w + sum_{k in S} lambda_k (w_k - w) / sum_{k in S} lambda_k`` (the
descent direction of L(w, lambda) estimated on S, normalized by the cohort's weight; at uniform lambda it is
FedAvg's uniform mean), then takes the lambda step with the round's losses. A client unseen in training gets
the global model. Exchanged per cohort client and round: w down, its update and F_k up. No DP variant.

Departures, said here: Stochastic-AFL takes one stochastic gradient step in w per iteration; pflx's clients
take FedAvg's local steps (a federated round's client work); the w step is normalized by
the cohort's lambda mass rather than scaled by N / |S| (which multiplies a client's update by up to N / |S|
when lambda concentrates on it). lambda starts uniform (1 / N).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from pfl_cli.algorithms.base import Algorithm
from pfl_cli.algorithms.fedavg import FedAvgRoundConfig
from pfl_cli.fl.config import check_own_keys, key
from pfl_cli.fl.global_model import OneGlobalModel

MOHRI = "Mohri et al. (ICML 2019)"


@dataclass(frozen=True)
class AFLConfig(FedAvgRoundConfig):
    """AFL's keys: FedAvg's round and the step size of the projected ascent on lambda."""

    algorithm: str = key("afl", "the algorithm these keys configure")
    afl_lambda_lr: float = key(1e-3, "gamma_lambda: step of the projected gradient ascent on the mixture weights",
                               f"{MOHRI} §5 (Stochastic-AFL) sets gamma_lambda per task; pflx: 1e-3, which moves a "
                               "cohort client's weight by (N / |S|) F_k 1e-3 a round, about a tenth of the uniform "
                               "weight 1 / N at N = 24, |S| = 5 and losses near 2")

    def validate(self) -> None:
        super().validate()
        check_own_keys(self, {"afl_lambda_lr": "a finite number >= 0"})


class AFL(OneGlobalModel, Algorithm):
    name = "afl"
    individual_reads = "each client's loss (the ascent step on the mixture weights lambda reads them one by one)"
    paper = "AFL: Mohri et al., ICML 2019 (Eq. 2, Stochastic-AFL, §5)"
    new_client_protocol = "the global model"
    config = AFLConfig
    dp_unit = None  # no DP variant
    not_distributed = "its clients' losses F_k(w) are read over every cohort client's data in one process"
    personalized = False
    serves_unlabeled = "afl (one global model)"
    inert_keys = {k: "its server step is the lambda-weighted mean of the cohort's updates (Mohri et al. 2019, §5): "
                  "there is no server learning rate or momentum" for k in ("server_lr", "server_momentum")}
    search_space = {"lr": "log:1e-3:1", "afl_lambda_lr": "log:1e-5:0.1"}
    search_space_source = (f"{MOHRI} §5: the step sizes gamma_w and gamma_lambda are set per task; pflx searches "
                           "gamma_lambda on a log range around its 1e-3 and the client lr")
    tune_group = "train"

    def build(self) -> None:
        import torch

        from pfl_cli.fl.store import ROLE_TRAIN

        super().build()  # the global model (OneGlobalModel)
        train = np.asarray(self.store.clients(ROLE_TRAIN))
        self.pool = torch.as_tensor(train[np.asarray(self.store.labeled)[train]], device=self.device)
        self.lam = torch.zeros(self.store.num_clients, dtype=torch.float64, device=self.device)
        self.lam[self.pool] = 1.0 / max(len(self.pool), 1)

    @staticmethod
    def floats_per_client_round(arch: dict) -> int:
        """w down; its update and its loss up."""
        from pfl_cli.models import num_parameters

        return 2 * num_parameters(arch["client"]) + 1

    def run_round(self, t, cohort, gen):
        f, theta, loss = self.losses_and_local_models(cohort, gen)  # w down, F_k(w), local SGD
        for k, v in theta.items():
            self.traffic.receive(k, v)   # its update w_k - w
        self.traffic.receive("loss", f)  # F_k(w)
        self.global_params = weighted_step(self.global_params, theta, self.lam[cohort])
        self.lam = lambda_step(self.lam, self.pool, cohort, f, float(self.cfg.afl_lambda_lr))
        return loss

    # the mixture weights lambda travel with the global model (OneGlobalModel's state and weights)
    def state(self):
        return {**super().state(), "lambda": self.lam.clone()}

    def load_state(self, state):
        super().load_state(state)
        self.lam = state["lambda"].to(self.device)

    def weights(self):
        return {**super().weights(), "lambda": self.lam.detach().cpu().clone()}

    def load_weights(self, weights):
        super().load_weights(weights)
        if "lambda" in weights and weights["lambda"].shape == self.lam.shape:
            self.lam = weights["lambda"].to(self.device)


def weighted_step(w: dict, theta: dict, lam):
    """``w + sum_k lam_k (theta_k - w) / sum_k lam_k`` (w unchanged when the cohort's weights are all 0)."""
    import torch

    total = lam.sum()
    if float(total) <= 0:
        return {k: v.clone() for k, v in w.items()}
    share = (lam / total).to(torch.float32)
    return {k: w[k] + torch.einsum("c,c...->...", share, theta[k] - w[k].unsqueeze(0)) for k in w}


def lambda_step(lam, pool, cohort, f, lr: float):
    """Stochastic-AFL's ascent step: ``Proj(lam + lr g)`` over the pool's simplex, g_k = (N / |S|) F_k on S."""
    grad = lam.new_zeros(lam.shape)
    grad[cohort] = f.to(lam.dtype) * (len(pool) / max(len(cohort), 1))
    out = lam.new_zeros(lam.shape)
    out[pool] = project_simplex(lam[pool] + lr * grad[pool])
    return out


def project_simplex(v):
    """The Euclidean projection of ``v`` (n,) onto the probability simplex (Duchi et al. 2008, Fig. 1)."""
    import torch

    n = v.shape[0]
    u = torch.sort(v, descending=True).values
    css = torch.cumsum(u, 0) - 1.0
    idx = torch.arange(1, n + 1, device=v.device, dtype=v.dtype)
    rho = int(torch.nonzero(u - css / idx > 0).flatten()[-1])
    tau = css[rho] / (rho + 1)
    return (v - tau).clamp_min(0.0)
