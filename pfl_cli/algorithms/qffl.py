"""q-FFL trained by q-FedAvg (Li, Sanjabi, Beirami, Smith, ICLR 2020, Eq. 2 and Alg. 2).

q-FFL minimizes ``f_q(w) = sum_k p_k / (q + 1) F_k(w)^(q+1)`` (Eq. 2): q > 0 weighs clients with a high
loss more, q = 0 is FedAvg's objective. A round of q-FedAvg (Alg. 2): the server sends w^t; each cohort
client k computes its loss ``F_k(w^t)`` on its training data, runs local SGD from w^t to w_k (``local_steps``
steps or ``local_epochs`` epochs, as FedAvg), and sends

    Delta_k = F_k(w^t)^q L (w^t - w_k),
    h_k     = q F_k(w^t)^(q-1) ||L (w^t - w_k)||^2 + L F_k(w^t)^q,

with the Lipschitz estimate L = 1 / lr (§4 and the authors' code, ``fair_flearn``); the server steps
``w^{t+1} = w^t - sum_k Delta_k / sum_k h_k``. At q = 0 that is ``w^{t+1} = (1/c) sum_k w_k``, the uniform
mean of the cohort's models. F_k^q is computed as ``(F_k + 1e-10)^q``, as the authors' code does, so that a
client with zero loss at q < 1 gives finite numbers.

F_k(w^t) is the mean cross-entropy over all of the client's fit samples, every cohort client in one
batched forward (:func:`pfl_cli.fl.clusters.losses_under`). A client unseen in training gets the global
model. Exchanged per cohort client and round: w^t down; Delta_k and h_k up. No DP variant.

Departure, said here: clients are sampled uniformly (Alg. 2 samples them with probability p_k = n_k / n);
the step then weighs the cohort uniformly, so at q = 0 pflx's q-FedAvg is FedAvg with the uniform mean.
"""

from __future__ import annotations

from dataclasses import dataclass

from pfl_cli.algorithms.base import Algorithm
from pfl_cli.algorithms.fedavg import FedAvgRoundConfig
from pfl_cli.fl.config import check_own_keys, key
from pfl_cli.fl.global_model import OneGlobalModel

LI = "Li et al. (ICLR 2020)"
LOSS_FLOOR = 1e-10  # fair_flearn adds it to F_k before the power


@dataclass(frozen=True)
class QFFLConfig(FedAvgRoundConfig):
    """q-FFL's keys: FedAvg's round (q-FedAvg's local SGD) and the fairness parameter q."""

    algorithm: str = key("qffl", "the algorithm these keys configure")
    lr: float = key(0.02, "client SGD step size (and L = 1/lr, the Lipschitz estimate of Alg. 2)",
                    "pflx: FedAvg's default step per gradient, lr / (1 - momentum) = 2e-3 / 0.1, taken by plain SGD "
                    f"(the paper tunes lr per data set, {LI} §4)")
    momentum: float = key(0.0, "client SGD momentum",
                          f"{LI} Alg. 2: local SGD, whose one-step displacement L = 1/lr estimates (momentum would "
                          "inflate ||Delta w_k||^2 in h_k tenfold at 0.9)")
    q: float = key(0.2, "q: fairness of the objective sum_k p_k F_k^(q+1) / (q+1) (0: FedAvg's objective)",
                   f"{LI} §4 sets q per data set; 0.2 is Flower's QFedAvg strategy default (q_param=0.2)")

    def validate(self) -> None:
        super().validate()
        check_own_keys(self, {"q": "a finite number >= 0"})


class QFFL(OneGlobalModel, Algorithm):
    name = "qffl"
    individual_reads = ""  # under --secagg Alg. 2's step from the sums of Delta_k and h_k
    paper = "q-FFL / q-FedAvg: Li et al., ICLR 2020 (Eq. 2, Alg. 2)"
    new_client_protocol = "the global model"
    config = QFFLConfig
    dp_unit = None  # no DP variant
    not_distributed = "its clients' losses F_k(w^t) are read over every cohort client's data in one process"
    personalized = False
    serves_unlabeled = "qffl (one global model)"
    inert_keys = {k: "its server step is q-FedAvg's w - sum Delta_k / sum h_k (Li et al. 2020, Alg. 2), whose step "
                  "size comes from L = 1/lr" for k in ("server_lr", "server_momentum")}
    search_space = {"lr": "log:1e-3:1", "q": "choice:0,0.001,0.01,0.1,0.2,1,2,5"}
    search_space_source = (f"{LI} §4: q chosen per data set among a few values from 0.001 to 15; pflx searches "
                           "q on that grid (with 0, FedAvg's objective) and the client lr, which also sets L = 1/lr")
    tune_group = "train"

    @staticmethod
    def floats_per_client_round(arch: dict) -> int:
        """w^t down; Delta_k and h_k up."""
        from pfl_cli.models import num_parameters

        return 2 * num_parameters(arch["client"]) + 1

    def run_round(self, t, cohort, gen):
        f, theta, loss = self.losses_and_local_models(cohort, gen)  # w down, F_k(w), local SGD
        delta, h = qfedavg_messages(self.global_params, theta, f, q=float(self.cfg.q), lipschitz=1.0 / self.cfg.lr)
        for k, v in delta.items():
            self.traffic.receive(k, v)       # Delta_k
        self.traffic.receive("h", h)          # h_k
        if self.cfg.secagg:  # the server learns sum_k Delta_k and sum_k h_k only (pfl_cli.fl.secagg)
            from pfl_cli.fl.secagg import secure_sum

            sums = secure_sum({**delta, H_SUM: h}, spent=(theta,)).total()
            self.global_params = qfedavg_step_from_sums(self.global_params, sums, sums.pop(H_SUM))
        else:
            self.global_params = qfedavg_step(self.global_params, delta, h)
        return loss


def qfedavg_messages(w: dict, theta: dict, f, *, q: float, lipschitz: float):
    """Alg. 2's client messages: ``Delta`` {name: (c, ...)} and ``h`` (c,) from the global model ``w``, the
    cohort's trained models ``theta`` (c, ...) and their losses ``f`` (c,) at ``w``."""
    import torch

    fq = (f.to(torch.float64) + LOSS_FLOOR) ** q                                   # F_k^q
    grad = {k: lipschitz * (w[k].unsqueeze(0) - theta[k]) for k in w}               # Delta w_k = L (w - w_k)
    sq = sum(g.to(torch.float64).flatten(1).pow(2).sum(1) for g in grad.values())   # ||Delta w_k||^2
    h = q * (f.to(torch.float64) + LOSS_FLOOR) ** (q - 1) * sq + lipschitz * fq if q else lipschitz * fq
    delta = {k: g * fq.to(g.dtype).view(-1, *([1] * (g.dim() - 1))) for k, g in grad.items()}
    return delta, h.to(torch.float32)


def qfedavg_step(w: dict, delta: dict, h) -> dict:
    """``w - sum_k Delta_k / sum_k h_k`` (Alg. 2's server step)."""
    total = h.sum()
    return {k: w[k] - delta[k].sum(0) / total for k in w}


H_SUM = "__h__"  # the secure-sum row that carries h_k beside Delta_k


def qfedavg_step_from_sums(w: dict, delta_sum: dict, h_sum) -> dict:
    """Alg. 2's server step from the cohort's sums only (``--secagg``): ``w - (sum_k Delta_k) / (sum_k h_k)``,
    :func:`qfedavg_step` with the sums taken by secure aggregation (the same sums, the same division)."""
    return {k: w[k] - delta_sum[k] / h_sum for k in w}
