"""SCAFFOLD (Karimireddy, Kale, Mohri, Reddi, Stich, Suresh, ICML 2020, Alg. 1, option II).

Server: the global model x and a control variate c; every client i keeps its own control variate
c_i (zero before its first round). A cohort client starts from y_i = x and takes K local steps
``y_i <- y_i - eta_l (g_i(y_i) - c_i + c)`` (line 10); then (option II, line 12)
``c_i+ = c_i - c + (x - y_i) / (K eta_l)`` and it sends ``Delta y_i = y_i - x`` and
``Delta c_i = c_i+ - c_i`` (line 13). The server moves ``x <- x + eta_g (1/|S|) sum Delta y_i``
and ``c <- c + (1/N) sum Delta c_i`` (lines 16-17), N the train clients with labels. With
``local_epochs``, K is each client's own step count. The per-client state is
:class:`pfl_cli.fl.control_variates.DriftState` (one model-sized row per client, checkpointed).

Exchanged: x and c down, Delta y_i and Delta c_i up (4 x |client net| floats a cohort client and
round; the paper's §3 counts twice FedAvg's communication). A new client (and every client at
prediction) gets the global model x, fine-tuned ``finetune_steps`` plain local steps as FedAvg's
protocol (the control variates correct training drift; the paper evaluates x).

The local steps are plain SGD, as line 10 writes them: pflx's client ``momentum`` is refused. With
momentum, option II's ``(x - y_i) / (K eta_l)`` is the mean momentum buffer, about 1 / (1 - beta)
times the mean corrected gradient, and the correction ``c - c_i`` built from it is amplified again
by the buffer the next round: at the default 0.9 the digits run of docs/algorithms/scaffold-feddyn.md
diverged (loss 2e25 by round 30), plain SGD reaches 90 % and more there. Its default ``lr`` is therefore
FedAvg's effective step (2e-3 / (1 - 0.9)): at FedAvg's 2e-3 without momentum it trails FedAvg's bare
defaults by 12 points on rotated digits (tests/algorithms/test_defaults_learn.py). Weight decay and clipping
apply to the step as FedAvg's (option II's c_i+ is then the mean clipped, decayed gradient).

Departures, said here: the server averages are uniform over the cohort as Alg. 1 writes them
(pflx's FedAvg weighs by data size); ``server_momentum`` (0, the paper's none) is FedAvg's.
"""

from __future__ import annotations

from dataclasses import dataclass

from pfl_cli.algorithms.fedavg import FedAvg, FedAvgFinetuneConfig
from pfl_cli.fl.config import key
from pfl_cli.fl.control_variates import DriftState, uniform_mean
from pfl_cli.fl.robust import corrupt_uploads, robust_delta


@dataclass(frozen=True)
class ScaffoldConfig(FedAvgFinetuneConfig):
    """SCAFFOLD's keys: FedAvg's, with ``server_lr`` as the global step size eta_g."""

    algorithm: str = key("scaffold", "the algorithm these keys configure")
    lr: float = key(0.02, "eta_l: client SGD step size (plain SGD, Alg. 1 line 10)",
                    "pflx: FedAvg's step at its defaults, lr 2e-3 with momentum 0.9 (2e-3 / (1 - 0.9)), as plain SGD; "
                    "Karimireddy et al. (ICML 2020) §7 tune the local step size per setting")
    server_lr: float = key(1.0, "eta_g: global step size on the mean Delta y (Alg. 1 line 16)",
                           "Karimireddy et al. (ICML 2020) §7: global step size eta_g = 1 in the experiments")


class Scaffold(DriftState, FedAvg):
    name = "scaffold"
    individual_reads = ""  # runs under --secagg: lines 16-17 need sum Delta y_i and sum Delta c_i only
    averages_updates = True  # line 16 averages Delta y_i: an update attack and a robust aggregator act there
    paper = "SCAFFOLD: Karimireddy et al., ICML 2020 (Alg. 1, option II)"
    new_client_protocol = "the global model, or it fine-tuned finetune_steps steps"
    config = ScaffoldConfig
    dp_unit = None  # no DP variant (FedAvg's DP-FedAvg is not inherited: the control variates are a second release)
    models_upload = False  # its steps are corrected by c - c_i, not FedAvg's upload
    serves_unlabeled = "scaffold without --finetune-steps (one global model)"
    drift_paper = "Karimireddy et al. 2020, Alg. 1 line 17"
    search_space = {"lr": "log:1e-3:1", "server_lr": "choice:0.5,1,2"}
    search_space_source = ("Karimireddy et al., SCAFFOLD (ICML 2020), §7: the local step size tuned per setting "
                           "and the global step size eta_g (1 in the experiments; here 0.5, 1, 2 around it)")
    tune_group = "train"
    inert_keys = {"momentum": "its local steps are plain SGD (Karimireddy et al. 2020, Alg. 1 line 10; option II's "
                              "control variate assumes them)"}

    def build(self) -> None:
        super().build()
        self.build_drift()

    def sgd_update_options(self) -> dict:
        return {**super().sgd_update_options(), "momentum": 0.0}  # Alg. 1 line 10: plain SGD steps

    def run_round(self, t, cohort, gen):
        c_server = self.server_drift
        c_i = self.drift.gather(cohort)
        correction = {k: c_server[k].unsqueeze(0) - c_i[k] for k in c_i}      # line 10: - c_i + c
        y, loss, steps = self.corrected_sgd(cohort, gen, correction)
        scale = 1.0 / (steps * float(self.cfg.lr))                             # 1 / (K eta_l)
        delta_y = {k: y[k] - g for k, g in self.global_params.items()}
        c_new = {k: c_i[k] - c_server[k] - delta_y[k] * scale.view(-1, *([1] * (y[k].dim() - 1)))
                 for k in c_i}                                                  # line 12, option II
        delta_c = {k: c_new[k] - c_i[k] for k in c_i}
        sent = delta_y if self.byzantine is None else {  # Delta y_i as the server receives it (issue 48)
            k: v - self.global_params[k] for k, v in corrupt_uploads(self, t, cohort, y).items()}
        self.record_exchange({**self.global_params, **{f"c.{k}": v for k, v in c_server.items()}},
                             {**sent, **{f"c.{k}": v for k, v in delta_c.items()}}, len(cohort))
        self.drift.scatter(cohort, c_new)
        n = self.population()
        if self.cfg.secagg:  # each client sends Delta y_i, Delta c_i and 1; the server reads their sums only
            import torch

            from pfl_cli.fl.secagg import WEIGHT, secure_sum

            ones = torch.ones(len(cohort), device=self.device)
            total = secure_sum({**{f"y.{k}": v for k, v in sent.items()},
                                **{f"c.{k}": v for k, v in delta_c.items()}, WEIGHT: ones},
                               spent=(y, delta_y, sent, delta_c)).total()
            count = total.pop(WEIGHT).clamp_min(1.0)
            self.server_update({k: total[f"y.{k}"] / count for k in delta_y})          # line 16
            self.server_drift = {k: v + total[f"c.{k}"] / n for k, v in c_server.items()}  # line 17
            return loss
        self.server_update(uniform_mean(sent) if self.cfg.aggregator == "mean"  # line 16: eta_g, mean Delta y
                           else robust_delta(self, cohort, sent))
        self.server_drift = {k: v + delta_c[k].sum(0) / n for k, v in c_server.items()}  # line 17
        return loss

    @staticmethod
    def floats_per_client_round(arch: dict) -> int:
        """x and c down, Delta y_i and Delta c_i up: four client nets."""
        from pfl_cli.models import num_parameters

        return 4 * num_parameters(arch["client"])
