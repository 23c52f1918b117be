"""DP-FedAvg in the ISRL-DP setting: the local-DP baseline of HyperFL (HyperFL, AAAI 2025, App. D.1).

McMahan et al.'s DP-FedAvg "adapted to the ISRL-DP setting (Lowy and Razaviyayn 2023), where
users trust their own client but not the server": every cohort client runs its ``local_steps``
as DP-SGD steps (per-sample clipping, Gaussian noise on the client, ``pfl_cli.fl.dpsgd``) and
uploads the resulting model delta; the server averages the deltas uniformly (FedAvg's size
weights would need the private client sizes) and steps like FedAvg. Everything the server
sees is already private, so aggregation and the released model are post-processing.
A client's model is the global model (optionally fine-tuned, like FedAvg).
"""

from __future__ import annotations

from dataclasses import dataclass

from pfl_cli.algorithms.fedavg import FedAvg, FedAvgConfig
from pfl_cli.fl.config import key
from pfl_cli.fl.dpsgd import LocalDP
from pfl_cli.fl.params import stack
from pfl_cli.privacy.randomness import mechanism_generator


@dataclass(frozen=True)
class LDPFedAvgConfig(FedAvgConfig):
    """ISRL-DP FedAvg's keys: FedAvg's (its local steps are DP-SGD steps)."""

    algorithm: str = key("ldp-fedavg", "the algorithm these keys configure")
    # Issue 33: FedAvg's lr 2e-3 and momentum 0.9 left DP-SGD with the paper's clip C = 0.04 near chance on
    # digits (22 % after 100 rounds); lr 0.01 (the paper's eta on (E)MNIST) still 27 %; 0.1 learns on every task
    # of tests/algorithms/test_defaults_learn.py (docs/algorithms/defaults.md).
    lr: float = key(0.1, "client DP-SGD step size", "lr study of docs/algorithms/defaults.md (0.01 / 0.1 on digits)")
    momentum: float = key(0.5, "client SGD momentum (buffer reset every round)",
                          "HyperFL App. D.1 code: momentum 0.5 for the DP baselines")


class LDPFedAvg(LocalDP, FedAvg):
    name = "ldp-fedavg"
    individual_reads = ""  # under --secagg the mean of the privatized deltas from their secure sum
    search_space = {"lr": "log:1e-3:1"}
    search_space_source = ("the client lr (the DP-SGD noise is the user's budget, never searched)")
    tune_group = "train"
    paper = "DP-FedAvg in the ISRL-DP setting, HyperFL's baseline (HyperFL App. D.1 and its code)"
    new_client_protocol = "the global model, or it fine-tuned finetune_steps steps"
    config = LDPFedAvgConfig
    dp_unit = "example"  # declared: DP-SGD on every client (pfl_cli.fl.dpsgd)
    dp_contribution = "model delta"
    inert_keys = {"local_epochs": "its rounds take local_steps DP-SGD steps on Poisson-sampled batches, the steps its "
                                  "accountant counts (pfl_cli.fl.dpsgd); set --local-steps",
                  "client_clip": "DP-SGD clips each sample's gradient to --dp clip=C (Abadi et al. 2016, Alg. 1), "
                                 "not the client's"}

    def run_round(self, t, cohort, gen):
        import torch

        from pfl_cli.fl.dpsgd import dp_local_sgd, poisson_batches

        cfg, dp = self.cfg, self.dp
        index, mask = poisson_batches(self.store.fit, cohort, cfg.local_steps, dp.sampling_rate, gen)
        theta, loss = dp_local_sgd(self.net, stack(self.global_params, len(cohort)), self.store, index, mask,
                                   private=list(self.global_params), clip=dp.clip,
                                   noise_multiplier=dp.noise_multiplier, denominator=dp.denominator, lr=cfg.lr,
                                   momentum=cfg.momentum, weight_decay=2.0 * cfg.lambda_theta,
                                   noise_gen=mechanism_generator(cfg, f"dp-noise-{t}", self.device))
        if cfg.secagg:  # each client sends its privatized delta; the server learns their sum and count
            from pfl_cli.fl.secagg import secure_sum

            summed = secure_sum({k: theta[k] - g for k, g in self.global_params.items()}, spent=(theta,))
            self.server_update({k: v / max(summed.count(), 1) for k, v in summed.total().items()})
        else:
            self.server_update({k: (theta[k] - g).mean(0) for k, g in self.global_params.items()})
        return loss if len(loss) else torch.zeros(0)

    def round_upload_steps(self) -> int:
        """Its rounds take ``local_steps`` SGD steps of DP-SGD (``local_epochs`` is not read)."""
        return self.cfg.local_steps

    def upload(self, x, y, *, steps: int, noise_gen=None, start=None, clients=None, private=None):
        """The delta after ``steps`` (None: the round's) DP-SGD steps on the batch (x, y) (every record drawn), noised
        with ``noise_gen`` as the client would (``pflx attack``); without it, the noise-free delta."""
        from types import SimpleNamespace

        import torch

        from pfl_cli.fl.dpsgd import dp_local_sgd

        cfg, dp = self.cfg, self.dp
        steps = self.round_upload_steps() if steps is None else steps
        n, b = y.shape
        batch = SimpleNamespace(inputs=lambda i: x.flatten(0, 1)[i], y=y.flatten())
        index = torch.arange(n * b, device=y.device).view(n, 1, b).expand(n, steps, b)
        start = stack(self.global_params, n) if start is None else start
        theta, _ = dp_local_sgd(self.net, start, batch, index, torch.ones(index.shape, device=y.device),
                                private=list(start), clip=dp.clip,
                                noise_multiplier=dp.noise_multiplier if noise_gen is not None else 0.0,
                                denominator=dp.denominator, lr=cfg.lr, momentum=cfg.momentum,
                                weight_decay=2.0 * cfg.lambda_theta, noise_gen=noise_gen)
        return {f"delta/{k}": theta[k] - start[k] for k in start}, start
