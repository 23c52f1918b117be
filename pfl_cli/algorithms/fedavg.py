"""FedAvg (thesis Alg. 3/4) with a server learning rate, and optional fine-tuning for new clients.

Each round the cohort starts from the global model, runs k local SGD steps (or
``local_epochs`` passes) and the server moves the global model by ``server_lr`` times the
data-size-weighted mean of the clients' deltas (Alg. 3 line 9 is ``server_lr = 1``),
optionally with server momentum. A client's model is the global model, or the global model
after ``finetune_steps`` local steps on its own data.
"""

from __future__ import annotations

import numpy as np

from pfl_cli.algorithms.base import Algorithm, stack
from pfl_cli.rng import torch_generator


class FedAvg(Algorithm):
    name = "fedavg"
    dp_unit = "client"
    dp_contribution = "model delta"
    default_server_lr = 1.0

    def build(self) -> None:
        self.net = self.client_net()
        self.global_params = {k: v.detach().clone() for k, v in self.net.named_parameters()}
        self.server_buf = {k: v.new_zeros(v.shape) for k, v in self.global_params.items()}
        self.personalized = self.cfg.finetune_steps > 0

    def run_round(self, t, cohort, gen):
        import torch

        from pfl_cli.fl.batches import sample_batches
        from pfl_cli.fl.cohort import local_sgd

        cfg = self.cfg
        if len(cohort) == 0:  # an empty Poisson cohort (DP): no client trains, the noise is still added
            theta, loss = stack(self.global_params, 0), torch.zeros(0)
        else:
            if cfg.local_epochs:
                steps, active = self.epoch_steps(cohort, cfg.local_epochs)
            else:
                steps, active = cfg.local_steps, None
            index, mask = sample_batches(self.store.fit, cohort, steps, cfg.batch_size, gen)
            theta, loss = local_sgd(self.net, stack(self.global_params, len(cohort)), self.store, index, mask,
                                    active=active, **self.sgd_options())
        deltas = {k: theta[k] - g for k, g in self.global_params.items()}
        if self.dp is not None:
            # DP-FedAvg (McMahan et al. 2018, Alg. 1): clipped deltas, noisy sum / (q N).
            mean = self.dp.private_mean(deltas, torch_generator(cfg.seed, f"dp-noise-{t}", self.device))
        else:
            size = self.store.fit.length[cohort].to(torch.float32)
            weight = size / size.sum()  # Alg. 3 line 9: m_i / m
            mean = {k: torch.einsum("c,c...->...", weight, d) for k, d in deltas.items()}
        self.server_update(mean)
        return loss

    def server_update(self, mean: dict) -> None:
        """Move the global parameters by ``server_lr`` times the (momentum-averaged) mean delta."""
        cfg = self.cfg
        lr = cfg.server_lr if cfg.server_lr is not None else self.default_server_lr
        for k, g in self.global_params.items():
            self.server_buf[k] = cfg.server_momentum * self.server_buf[k] + mean[k]
            self.global_params[k] = g + lr * self.server_buf[k]

    upload_under_dp = True  # client-level DP-FedAvg: the client's delta, clipped and noised only in the sum

    def upload(self, x, y, *, steps: int, noise_gen=None, start=None):
        """Alg. 3 line 7: the client's delta after ``steps`` local steps from the global model (0: its gradient).

        Under client-level ``--dp`` the server receives each delta before the noise of the sum is
        added, clipped by a positive factor (which cosine matching does not see).
        """
        start = stack(self.global_params, x.shape[0]) if start is None else start
        return self.local_update(start, x, y, steps), start

    def personalize(self, clients: np.ndarray, gen):
        if self.cfg.finetune_steps > 0:
            return self.train_clients(self.global_params, clients, gen, steps=self.cfg.finetune_steps), True
        return self.global_params, False

    def state(self):
        return {"global": {k: v.detach().clone() for k, v in self.global_params.items()},
                "server_buf": {k: v.detach().clone() for k, v in self.server_buf.items()}}

    def load_state(self, state):
        self.global_params = {k: v.to(self.device) for k, v in state["global"].items()}
        self.server_buf = {k: v.to(self.device) for k, v in state["server_buf"].items()}

    def weights(self):
        return {"client": {k: v.detach().cpu() for k, v in self.global_params.items()}}

    def load_weights(self, weights):
        self.global_params = {k: v.to(self.device) for k, v in weights["client"].items()}
