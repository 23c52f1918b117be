"""FFA-LoRA (Sun, Li, Li, Ding, "Improving LoRA in Privacy-preserving Federated Learning", ICLR 2024, §4):
Federated Freeze-A LoRA.

Every adapter's A stays at its random initialization, the same on every client (drawn from the run's seed), and
only B (zero-initialized) and the classifier train (§4: the randomly initialized A is fixed, only the
zero-initialized B is fine-tuned). The server averages B and the classifier by client data size, which is then
the exact average of the clients' low-rank updates, since B A averages linearly when A is shared (§4).
A never travels: each client rebuilds it from the seed. A client's model is the global adapter, or it
fine-tuned ``finetune_steps`` steps on its own data with A still frozen (new clients the same).

Under client-level ``--dp`` the round is DP-FedAvg's (McMahan et al. 2018, Alg. 1; :mod:`pfl_cli.fl.dp`) on B and
the classifier: each client's delta clipped jointly to L2 ``clip``, Gaussian noise on the sum, divided by the fixed
denominator. A is a function of the public seed, so nothing else needs releasing. This is the setting FFA-LoRA is
built for (§4: with A trained, the noise added to A and to B is multiplied in the product B A, the semi-quadratic
term that amplifies DP noise; with A frozen the noise on B passes to the update B A linearly). The paper adds its
noise per example (DP-SGD, §5, Table 1); pflx's mechanism is the client-level one of ``--dp``.
"""

from __future__ import annotations

from dataclasses import dataclass

from pfl_cli.algorithms.fedavg import FedAvg, FedAvgConfig
from pfl_cli.algorithms.lora_common import LoRAClient, LoRAKeys, parts_floats
from pfl_cli.fl.config import key
from pfl_cli.fl.params import weighted_mean
from pfl_cli.privacy.randomness import mechanism_generator


@dataclass(frozen=True)
class FFALoRAConfig(FedAvgConfig, LoRAKeys):
    """FFA-LoRA's keys: FedAvg's round and the LoRA keys."""

    algorithm: str = key("ffa-lora", "the algorithm these keys configure")


class FFALoRA(LoRAClient, FedAvg):
    name = "ffa-lora"
    individual_reads = ""  # under --secagg the mean (or DP-FedAvg's release) of B and the classifier from sums
    search_space = {"lr": "log:1e-3:1"}
    search_space_source = ("Sun et al. 2024 (FFA-LoRA) §5: the learning rate is the tuned setting (FFA-LoRA removes "
                           "the need to tune alpha, §4): FedAvg's client lr over its log range")
    tune_group = "train"
    paper = "FFA-LoRA: Sun et al., ICLR 2024 §4 (A frozen, B trained and averaged)"
    new_client_protocol = "the global adapter, or it fine-tuned finetune_steps local steps with A frozen"
    config = FFALoRAConfig
    serves_unlabeled = "ffa-lora without --finetune-steps (one global adapter)"
    dp_unit = "client"  # DP-FedAvg on B and the classifier (aggregate below); A is public (the seed)
    dp_contribution = "B and classifier delta"

    @classmethod
    def floats_per_client_round(cls, arch: dict) -> int:
        return 2 * parts_floats(arch, "B", "head")

    @property
    def trained(self) -> list[str]:
        parts = self.parts
        return parts["B"] + parts["head"]

    def local_objective(self) -> dict:
        return {"trainable": self.trained}

    def aggregate(self, t: int, cohort, theta: dict) -> None:
        """B and the classifier: size-weighted mean (under ``--dp`` DP-FedAvg's noisy mean of the clipped deltas,
        even for an empty Poisson cohort), then FedAvg's server step; A stays where it started."""
        moving = self.trained
        self.record_exchange({k: self.global_params[k] for k in moving}, {k: theta[k] for k in moving}, len(cohort))
        if self.cfg.secagg:  # the server learns the cohort's sums only (pfl_cli.fl.secagg)
            step = self.secure_step(t, cohort, {k: theta[k] for k in moving})
        elif self.dp is not None:
            deltas = {k: theta[k] - self.global_params[k] for k in moving}
            step = self.dp.private_mean(deltas, mechanism_generator(self.cfg, f"dp-noise-{t}", self.device))
        else:
            mean = weighted_mean(self.store, cohort, {k: theta[k] for k in moving})
            step = {k: mean[k] - self.global_params[k] for k in moving}
        cfg = self.cfg
        for k in moving:
            self.server_buf[k] = cfg.server_momentum * self.server_buf[k] + step[k]
            self.global_params[k] = self.global_params[k] + cfg.server_lr * self.server_buf[k]

    def secure_step(self, t: int, cohort, sent: dict) -> dict:
        """The step of B and the classifier from the cohort's secure sums: FedAvg's rows on the keys that move
        (as :meth:`FedAvg.secure_contributions`: ``n_i theta_i`` and ``n_i``, or under ``--dp`` the client's own
        clipped delta) and the server's half (sum / sum of sizes, or the DP release of the sum), minus the
        global value; the plain path's weighted mean (or DP-FedAvg's noisy mean) to float rounding."""
        import torch

        from pfl_cli.fl.secagg import WEIGHT, secure_sum

        if self.dp is None:
            n = self.store.fit.length[cohort].to(torch.float32)
            rows = {**{k: v * n.view(-1, *([1] * (v.dim() - 1))) for k, v in sent.items()}, WEIGHT: n}
        else:
            rows = self.dp.client_rows({k: v - self.global_params[k] for k, v in sent.items()},
                                       mechanism_generator(self.cfg, f"dp-client-noise-{t}", self.device))
        total = secure_sum(rows, modulus=getattr(self.dp, "modulus", None), spent=(sent,))
        if self.dp is not None:
            return self.dp.release_sum(total, mechanism_generator(self.cfg, f"dp-noise-{t}", self.device))
        sums = total.total()
        weight = sums.pop(WEIGHT).clamp_min(1.0)
        return {k: sums[k] / weight - self.global_params[k] for k in sent}

    def personalize(self, clients, gen):
        if self.finetune_steps > 0:
            return self.train_clients(self.global_params, clients, gen, steps=self.finetune_steps,
                                      trainable=self.trained), True
        return self.global_params, False
