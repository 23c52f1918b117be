"""FedDyn (Acar, Zhao, Matas, Mattina, Whatmough, Saligrama, ICLR 2021, Alg. 1): dynamic regularization.

Every client k keeps the gradient ``grad L_k(theta_k)`` of its last local model (zero before its
first round) and the server a state h (zero). A cohort client minimizes
``L_k(theta) - <grad L_k(theta_k^{t-1}), theta> + alpha/2 ||theta - theta^{t-1}||^2`` from the
global model theta^{t-1} with local SGD (the paper's local solver), so each step's gradient is the
batch gradient, minus its stored one, plus ``alpha (theta - theta^{t-1})``; then
``grad L_k(theta_k^t) = grad L_k(theta_k^{t-1}) - alpha (theta_k^t - theta^{t-1})``. The server
sets ``h^t = h^{t-1} - alpha (1/m) sum_P (theta_k^t - theta^{t-1})`` (m the train clients with
labels) and ``theta^t = (1/|P|) sum_P theta_k^t - h^t / alpha``. The per-client state is
:class:`pfl_cli.fl.control_variates.DriftState` (one model-sized row per client, checkpointed);
the linear term is its ``correction``, the quadratic one FedProx's proximal term.

Exchanged: the global model down and the local model up (2 x |client net| floats a cohort client
and round, as FedAvg; the paper's point, §1). A new client (and every client at prediction) gets
the global model theta^t, fine-tuned ``finetune_steps`` plain local steps as FedAvg's protocol.

Departures, said here: the server average is uniform over the cohort, as Alg. 1 writes it;
``server_lr`` and ``server_momentum`` are refused (Alg. 1's server step is the one above).
"""

from __future__ import annotations

from dataclasses import dataclass

from pfl_cli.algorithms.fedavg import FedAvg, FedAvgFinetuneConfig
from pfl_cli.fl.config import check_own_keys, key
from pfl_cli.fl.control_variates import DriftState, uniform_mean
from pfl_cli.fl.robust import corrupt_uploads, robust_delta


@dataclass(frozen=True)
class FedDynConfig(FedAvgFinetuneConfig):
    """FedDyn's keys: FedAvg's round and the regularization weight alpha."""

    algorithm: str = key("feddyn", "the algorithm these keys configure")
    alpha: float = key(0.01, "alpha: weight of the dynamic regularizer (Alg. 1)",
                       "Acar et al. (ICLR 2021) §5: alpha searched in {0.1, 0.01, 0.001}; the middle value")

    def validate(self) -> None:
        super().validate()
        check_own_keys(self, {"alpha": "a finite number > 0"})


class FedDyn(DriftState, FedAvg):
    name = "feddyn"
    individual_reads = ""  # runs under --secagg: Alg. 1's server needs sum theta_k (and the cohort size) only
    paper = "FedDyn: Acar et al., ICLR 2021 (Alg. 1)"
    new_client_protocol = "the global model, or it fine-tuned finetune_steps steps"
    config = FedDynConfig
    dp_unit = None  # no DP variant (FedAvg's DP-FedAvg is not inherited)
    models_upload = False  # its local objective adds the dynamic regularizer, not FedAvg's upload
    averages_updates = True  # its server averages the cohort's models: an update attack and a robust aggregator act
    serves_unlabeled = "feddyn without --finetune-steps (one global model)"
    drift_paper = "Acar et al. 2021, Alg. 1: h moves by alpha/m"
    inert_keys = {k: "its server step is Alg. 1's (Acar et al. 2021: theta^t = mean theta_k - h^t / alpha; "
                  "no server step size or momentum)" for k in ("server_lr", "server_momentum")}
    search_space = {"lr": "log:1e-3:1", "alpha": "choice:0.1,0.01,0.001"}
    search_space_source = ("Acar et al., FedDyn (ICLR 2021), §5: alpha selected from {0.1, 0.01, 0.001}; "
                           "the client lr per dataset")
    tune_group = "train"

    def build(self) -> None:
        super().build()
        self.build_drift()

    def run_round(self, t, cohort, gen):
        alpha = float(self.cfg.alpha)
        grad_prev = self.drift.gather(cohort)
        theta, loss, _ = self.corrected_sgd(cohort, gen, {k: -v for k, v in grad_prev.items()}, prox_mu=alpha)
        sent = corrupt_uploads(self, t, cohort, theta)  # the models as the server receives them (issue 48)
        self.record_exchange(self.global_params, sent, len(cohort))
        moved = {k: theta[k] - g for k, g in self.global_params.items()}
        self.drift.scatter(cohort, {k: grad_prev[k] - alpha * moved[k] for k in moved})  # each client's own
        m = self.population()
        if self.cfg.secagg:  # each client sends theta_k and 1: sum moved = sum theta_k - |P| theta^{t-1}
            import torch

            from pfl_cli.fl.secagg import WEIGHT, secure_sum

            total = secure_sum({**sent, WEIGHT: torch.ones(len(cohort), device=self.device)},
                               spent=(theta, sent, moved)).total()
            count = total.pop(WEIGHT)
            self.server_drift = {k: h - alpha * (total[k] - count * self.global_params[k]) / m
                                 for k, h in self.server_drift.items()}
            mean = {k: v / count.clamp_min(1.0) for k, v in total.items()}
            self.global_params = {k: mean[k] - self.server_drift[k] / alpha for k in mean}
            return loss
        if self.cfg.aggregator == "mean":
            total = {k: (sent[k] - g).sum(0) for k, g in self.global_params.items()}
            mean = uniform_mean(sent)
        else:  # the aggregate of the cohort's moves stands for each of them: the sum is |P| times it
            step = robust_delta(self, cohort, {k: sent[k] - g for k, g in self.global_params.items()})
            total = {k: len(cohort) * v for k, v in step.items()}
            mean = {k: g + step[k] for k, g in self.global_params.items()}
        self.server_drift = {k: h - alpha * total[k] / m for k, h in self.server_drift.items()}
        self.global_params = {k: mean[k] - self.server_drift[k] / alpha for k in mean}
        return loss
