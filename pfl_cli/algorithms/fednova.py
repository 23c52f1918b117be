"""FedNova (Wang, Liu, Liang, Joshi, Poor, NeurIPS 2020): normalized averaging.

Clients run FedAvg's local work, but take different numbers of steps tau_i (``local_epochs``: client
i takes ``epochs * ceil(n_i / b)`` steps, so a client with more data takes more). FedAvg's mean of the
moves ``x - x_i = eta G_i a_i`` then weighs client i by ``||a_i||_1`` and converges to a stationary
point of ``sum_i p_i ||a_i||_1 F_i``, not of ``sum_i p_i F_i`` (the paper's Theorem 1: the objective
inconsistency). FedNova normalizes each move by ``||a_i||_1`` (the normalized gradient d_i, Eq. 6)
and the server steps ``x <- x - tau_eff sum_i p_i eta d_i`` with ``tau_eff = sum_i p_i ||a_i||_1``
(Eq. 7-8; :mod:`pfl_cli.fl.nova`). ``||a_i||_1`` is tau_i for plain SGD and, for SGD with
``momentum`` rho (buffer reset each round), ``[tau_i - rho (1 - rho^tau_i) / (1 - rho)] / (1 - rho)``
(the paper's momentum-SGD example of a_i). p_i are the data shares over the round's cohort, the weights of pflx's
FedAvg; clients with equal step counts make FedNova FedAvg exactly.

Exchanged: the global model down; the local model and the scalar ``||a_i||_1`` up (2 x |client net|
+ 1 floats a cohort client and round). A new client (and every client at prediction) gets the
global model, fine-tuned ``finetune_steps`` local steps as FedAvg's protocol (the paper evaluates
the global model). No DP variant (FedAvg's DP-FedAvg is not inherited: ``||a_i||_1`` depends on the
client's data size, a second release).

Departures, said here: FedAvg's ``server_lr`` and ``server_momentum`` apply to FedNova's move (the
paper's Eq. 8 is ``server_lr`` 1 and no momentum, the defaults; its Table 1 also runs FedNova with a
server momentum). The paper's experiments draw each client's epochs uniformly from
[2, 5] each round; pflx's step counts differ by data size under ``local_epochs`` (the other source of
heterogeneity the paper names), and the learning test uses that. FedProx's proximal local solver
(the paper's third example) is fedprox's, not run here.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from pfl_cli.algorithms.fedavg import FedAvg, FedAvgConfig
from pfl_cli.fl.config import key
from pfl_cli.fl.params import broadcast

WANG = "Wang et al. (NeurIPS 2020)"


@dataclass(frozen=True)
class FedNovaConfig(FedAvgConfig):
    """FedNova's keys: FedAvg's, with local epochs (so that step counts follow data sizes)."""

    algorithm: str = key("fednova", "the algorithm these keys configure")
    local_epochs: Optional[int] = key(2, "E: epochs of local SGD per round, tau_i = E * ceil(n_i / b) "
                                         "(null: local_steps steps, equal for every client)",
                                      f"{WANG}, Table 1: clients train E = 2 local epochs")
    lr: float = key(0.02, "eta: client SGD step size",
                    "pflx: its two local epochs are a few steps on small clients (2-4 on digits) where FedAvg's "
                    "default takes 50 at 2e-3, so ten times FedAvg's step; Wang et al. (NeurIPS 2020) tune the lr "
                    "per setting")
    momentum: float = key(0.9, "client SGD momentum rho (its ||a_i||_1 is the momentum one)",
                          f"{WANG}, Table 1: local momentum 0.9 (one of the three local solvers)")


class FedNova(FedAvg):
    name = "fednova"
    paper = "FedNova: Wang et al., NeurIPS 2020 (Eq. 6-8, normalized averaging)"
    new_client_protocol = "the global model, or it fine-tuned finetune_steps steps"
    config = FedNovaConfig
    dp_unit = None  # no DP variant: ||a_i||_1 follows the client's data size, a release DP-FedAvg does not cover
    models_upload = False  # `pflx attack`'s upload model is not checked against its normalized upload
    upload_under_dp = False
    serves_unlabeled = "fednova without --finetune-steps (one global model)"
    search_space = {"lr": "log:1e-3:1", "momentum": "choice:0,0.9"}
    search_space_source = (f"{WANG}, Table 1: the client lr tuned per setting, local solvers plain SGD and SGD with "
                           "momentum 0.9 (Table 1's rows)")
    tune_group = "train"

    def local_steps_of(self, cohort):
        """tau_i: the local steps each cohort client takes this round (``local_steps``, or its epochs' batches)."""
        import torch

        epochs = self.round_schedule().get("epochs")
        if epochs:
            return self.epoch_steps(cohort, epochs)[1].sum(1).to(torch.float64)
        return torch.full((len(cohort),), float(self.cfg.local_steps), dtype=torch.float64, device=self.device)

    def run_round(self, t, cohort, gen):
        import torch

        from pfl_cli.fl.nova import normalized_delta, solver_norm

        if len(cohort) == 0:
            return torch.zeros(0)
        theta, loss, _ = self.cohort_sgd(broadcast(self.global_params, len(cohort)), cohort, gen,
                                         **self.round_schedule())
        norm = solver_norm(self.local_steps_of(cohort), self.sgd_update_options()["momentum"])  # ||a_i||_1 of the solver
        self.record_exchange(self.global_params, {**theta, "a_norm": norm.to(torch.float32)}, len(cohort))
        size = self.store.fit.length[cohort].to(torch.float64)
        self.server_update(normalized_delta(self.global_params, theta, size / size.sum(), norm))  # Eq. 7-8
        return loss

    @staticmethod
    def floats_per_client_round(arch: dict) -> int:
        """The global model down; the local model and ||a_i||_1 up."""
        from pfl_cli.models import num_parameters

        return 2 * num_parameters(arch["client"]) + 1
