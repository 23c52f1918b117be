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

Heterogeneous local work, the two sources the paper names (§1, §6): data sizes (``local_epochs`` E:
client i takes ``E * ceil(n_i / b)`` steps) and computation that varies by client and round
(``local_epochs_range: [lo, hi]``: each round every cohort client draws its own E_i uniformly from the
integers lo..hi, as the paper's experiments draw E_i from [2, 5] each round, §6 and Table 1's
variable-epoch rows). The draw comes from the round's generator before its batches, so a round's
epochs depend only on the seed and the round (a resumed run draws them again, byte-identically); the
cohort still trains as one vectorized call, a client that has taken its ``E_i * ceil(n_i / b)`` steps
sitting out the rest (masked, as under ``local_epochs``). Flower's FedNova baseline
(baselines/fednova/fednova/client.py, ``fit``) draws ``np.random.randint(var_min_epochs, var_max_epochs)`` with
2 and 5 (conf/base.yaml), whose upper bound numpy excludes (E_i in {2, 3, 4}); pflx includes hi.

Departures, said here: FedAvg's ``server_lr`` and ``server_momentum`` apply to FedNova's move (the
paper's Eq. 8 is ``server_lr`` 1 and no momentum, the defaults; its Table 1 also runs FedNova with a
server momentum). FedProx's proximal local solver (the paper's third example) is fedprox's, not run here.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from pfl_cli.algorithms.fedavg import FedAvg, FedAvgFinetuneConfig
from pfl_cli.errors import ConfigError
from pfl_cli.fl.config import key
from pfl_cli.fl.params import broadcast
from pfl_cli.fl.robust import corrupt_uploads, robust_delta

WANG = "Wang et al. (NeurIPS 2020)"


@dataclass(frozen=True)
class FedNovaConfig(FedAvgFinetuneConfig):
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
    local_epochs_range: Optional[tuple[int, ...]] = key(
        None, "[lo, hi]: each cohort client draws its local epochs E_i uniformly from lo..hi every round, "
              "tau_i = E_i * ceil(n_i / b) (null: local_epochs for every client)",
        f"{WANG}, §6 and Table 1: E_i drawn uniformly from [2, 5] each round in the variable-epochs runs; the "
        "default is Table 1's fixed E = 2 (local_epochs)")

    def validate(self) -> None:
        super().validate()
        r = self.local_epochs_range
        if r is None:
            return
        if len(r) != 2 or not 1 <= r[0] <= r[1]:
            raise ConfigError(f"local_epochs_range must be two integers [lo, hi] with 1 <= lo <= hi for "
                              f"{self.algorithm}; got {list(r)}. Use e.g. [2, 5] (Wang et al. 2020, §6), or null "
                              "for local_epochs.")
        default = type(self).__dataclass_fields__["local_epochs"].default
        if self.local_epochs != default:
            raise ConfigError(f"local_epochs has no effect beside local_epochs_range (each client's epochs are drawn "
                              f"from {list(r)} every round); got local_epochs={self.local_epochs}. Drop local_epochs, "
                              "or local_epochs_range.")


class FedNova(FedAvg):
    name = "fednova"
    individual_reads = ""  # runs under --secagg: Eq. 7-8 from three sums (pfl_cli.fl.nova.normalized_delta_secure)
    averages_updates = True  # Eq. 7-8 average the normalized updates: an update attack and an aggregator act
    paper = "FedNova: Wang et al., NeurIPS 2020 (Eq. 6-8, normalized averaging)"
    new_client_protocol = "the global model, or it fine-tuned finetune_steps steps"
    config = FedNovaConfig
    dp_unit = None  # no DP variant: ||a_i||_1 follows the client's data size, a release DP-FedAvg does not cover
    models_upload = False  # `pflx attack`'s upload model is not checked against its normalized upload
    upload_under_dp = False
    # Wang et al. 2020, §1 and §4: clients' local work may differ (tau_i), normalized averaging keeps the
    # objective consistent; a straggler's tau_i is the steps it finished by the deadline
    partial_work = True
    compressible_upload = True
    serves_unlabeled = "fednova without --finetune-steps (one global model)"
    search_space = {"lr": "log:1e-3:1", "momentum": "choice:0,0.9"}
    search_space_source = (f"{WANG}, Table 1: the client lr tuned per setting, local solvers plain SGD and SGD with "
                           "momentum 0.9 (Table 1's rows)")
    tune_group = "train"

    def local_steps_of(self, cohort, epochs=None):
        """tau_i: the local steps each cohort client takes (``local_steps``, or its epochs' batches); ``epochs``:
        the round's (an int, or the (c,) draw of ``local_epochs_range``), default ``local_epochs``."""
        import torch

        epochs = self.round_schedule().get("epochs") if epochs is None else epochs
        if epochs is not None:
            return self.epoch_steps(cohort, epochs)[1].sum(1).to(torch.float64)
        return torch.full((len(cohort),), float(self.cfg.local_steps), dtype=torch.float64, device=self.device)

    def round_work(self, cohort, gen) -> dict:
        """The round's local work: :meth:`round_schedule`, or under ``local_epochs_range`` each client's E_i
        drawn uniformly from lo..hi with the round's generator (before its batches draw their seed)."""
        import torch

        r = self.cfg.local_epochs_range
        if r is None:
            return self.round_schedule()
        return {"epochs": torch.randint(int(r[0]), int(r[1]) + 1, (len(cohort),), generator=gen).to(self.device)}

    def local_batches(self, clients, gen, *, steps=None, epochs=None):
        """:meth:`Algorithm.local_batches`, also with per-client ``epochs`` (a (c,) tensor: its own E_i each)."""
        import torch

        if torch.is_tensor(epochs):
            from pfl_cli.fl.batches import draw_batches

            return draw_batches(self.store.fit, clients, None, self.cfg.batch_size, gen, epochs=epochs)
        return super().local_batches(clients, gen, steps=steps, epochs=epochs)

    def run_round(self, t, cohort, gen):
        import torch

        from pfl_cli.fl.nova import normalized_delta, solver_norm

        if len(cohort) == 0:
            return torch.zeros(0)
        work = self.round_work(cohort, gen)
        theta, loss, _ = self.cohort_sgd(broadcast(self.global_params, len(cohort)), cohort, gen, **work)
        theta = corrupt_uploads(self, t, cohort, theta)  # the models as the server receives them (issue 48)
        steps = self.local_steps_of(cohort, work.get("epochs"))
        if self.round_budget is not None:  # a straggler's tau_i: the steps it finished by the deadline
            steps = torch.minimum(steps, self.round_budget.to(steps))
        norm = solver_norm(steps, self.sgd_update_options()["momentum"])  # ||a_i||_1 of the solver
        if self.upload_codec is not None:  # the deltas as compressed on the wire (pfl_cli.fl.compression)
            theta = self.upload_codec.compress_models(self, cohort, self.global_params, theta)
            self.traffic.receive("a_norm", norm)
        else:
            self.record_exchange(self.global_params, {**theta, "a_norm": norm.to(torch.float32)}, len(cohort))
        size = self.store.fit.length[cohort].to(torch.float64)
        if self.cfg.secagg:  # each client sends n_i (x_i - x) / ||a_i||_1, n_i and n_i ||a_i||_1: sums only
            from pfl_cli.fl.nova import normalized_delta_secure

            self.server_update(normalized_delta_secure(self.global_params, theta, size, norm))
            return loss
        if self.cfg.aggregator == "mean":
            self.server_update(normalized_delta(self.global_params, theta, size / size.sum(), norm))  # Eq. 7-8
        else:  # the aggregate of the normalized updates d_i = (x_i - x) / ||a_i||_1 (p_i-weighted), times tau_eff
            tau_eff = float((size / size.sum() * norm.to(torch.float64)).sum())
            per = (1.0 / norm.to(torch.float64)).to(torch.float32)
            d = {k: (theta[k] - g) * per.view(-1, *([1] * g.dim())) for k, g in self.global_params.items()}
            self.server_update({k: tau_eff * v for k, v in robust_delta(self, cohort, d, by_size=True).items()})
        return loss

    @staticmethod
    def floats_per_client_round(arch: dict) -> int:
        """The global model down; the local model and ||a_i||_1 up."""
        from pfl_cli.models import num_parameters

        return 2 * num_parameters(arch["client"]) + 1
