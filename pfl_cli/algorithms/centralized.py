"""Centralized reference: one model trained on the pooled train splits of every train client.

The upper bound a federated-learning table prints beside its methods (issue 40): no federation, no
client drift, the same model, optimizer and amount of training as a federated run of the same config,
scored the same way (``metrics.json``, ``clients.csv``, ``pflx predict``, ``pflx compare``).

The same number of sample passes, per round: the round loop draws the round's cohort exactly as a
federated run of the same seed does (``clients_per_round`` train clients with labels), and the one model
takes as many SGD steps of ``batch_size`` samples as that cohort takes in all: ``|cohort| x local_steps``,
or under ``local_epochs`` E ``sum_i E x ceil(n_i / b)`` over the cohort's clients. Its batches are drawn
from the pool (the fit samples of every labeled train client, reshuffled each pass), not from the cohort's
clients: every round processes the federated round's number of samples. The optimizer is FedAvg's client
SGD (``lr``, ``momentum``, ``client_clip``, ``lambda_theta``) run as one optimizer over the whole run: its
momentum buffer is carried from round to round (checkpointed), as centralized training keeps it (a
federated client's buffer starts fresh each round).

Every client, seen in training or not, gets the one model, or it fine-tuned ``finetune_steps`` local steps
on its own data (FedAvg's protocol). Nothing is exchanged (0 floats a client and round). ``server_lr``
and ``server_momentum`` are refused (there is no server step). A partition without train clients
(every client holdout) is refused by ``pflx train`` as for every algorithm (``--partition``, one line, exit 2);
one whose train clients have no labels, by the round loop (``check_trainable``): nothing to pool.

Under ``--dp``: record-level DP-SGD on the pool (Abadi et al. 2016, Alg. 1; the add/remove-one-record
neighbours of ``docs/privacy/release-contract.md``), a trusted curator holding the pooled records: every step
draws a Poisson batch (each pooled record joins with the public probability ``dp_sampling_rate``), clips each
record's gradient to the public L2 norm ``--dp clip=C``, adds N(0, (z C)^2) from OS entropy (unless
``noise=seeded``) to the sum and divides by the public ``batch_size`` (:func:`pfl_cli.fl.dpsgd.dp_local_sgd`; the
momentum buffer, carried across rounds, and the weight decay are post-processing). A round takes
``clients_per_round x local_steps`` steps, from the config alone (the federated round of ``local_steps`` it
matches; without ``--dp`` it is the realized cohort's): the accountant counts ``rounds`` times that many
Poisson-sampled Gaussian steps (:class:`pfl_cli.fl.dpsgd.PooledDPSGD`), calibrated before any data is read.
Refused under ``--dp``: ``local_epochs`` (its step count follows the private client sizes), ``clients_per_round``
null (the count of clients is read from the data), ``client_clip`` away from its default (the per-record clip
C replaces it) and ``dropout`` (the steps and batches do not depend on which clients answer).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from pfl_cli.algorithms.fedavg import FedAvg, FedAvgFinetuneConfig
from pfl_cli.fl.config import key
from pfl_cli.fl.params import broadcast


@dataclass(frozen=True)
class CentralizedConfig(FedAvgFinetuneConfig):
    """FedAvg's keys (the round sets the amount of training); no server step."""

    algorithm: str = key("centralized", "the algorithm these keys configure")


class Centralized(FedAvg):
    name = "centralized"
    individual_reads = "every client's training samples (one model trained on the pooled data)"  # under --secagg
    paper = "centralized reference: one model on the pooled train splits (the upper bound of FL tables)"
    new_client_protocol = "the one model, or it fine-tuned finetune_steps steps"
    config = CentralizedConfig
    dp_unit = "example"  # declared: central DP-SGD on the pooled records (pfl_cli.fl.dpsgd.PooledDPSGD)
    dp_contribution = "per-record gradient"
    models_upload = False
    upload_under_dp = False
    serves_unlabeled = "centralized without --finetune-steps (one model)"
    not_distributed = "it trains one model on the pooled data of every train client in one process"
    search_space = {"lr": "log:1e-3:1"}
    search_space_source = ("tuned as the federated runs it bounds: McMahan et al. 2017, §3, the lr tuned per task "
                           "(a grid of two to three decades)")
    tune_group = "train"
    inert_keys = {k: "it trains one model on the pooled data, with no server step (the centralized reference)"
                  for k in ("server_lr", "server_momentum")}

    @staticmethod
    def dp_steps_per_round(cfg) -> int:
        """DP-SGD steps a round under ``--dp``: ``clients_per_round x local_steps`` (public: the config's)."""
        return int(cfg.clients_per_round) * int(cfg.local_steps)

    @staticmethod
    def check_dp_config(cfg) -> None:
        from pfl_cli.errors import ConfigError

        if cfg.dp_sampling_rate is None:
            raise ConfigError("centralized --dp needs --set dp_sampling_rate=Q, the public Poisson rate at which each "
                              "pooled record joins a DP-SGD batch (expected batch Q x the pool; keep --batch-size near "
                              "it), e.g. --set dp_sampling_rate=0.01.")
        if getattr(cfg, "local_epochs", None):
            raise ConfigError(f"local_epochs under --dp: centralized's steps a round would follow the private client "
                              f"sizes; got {cfg.local_epochs!r}. Drop it and set --local-steps (a round takes "
                              "clients_per_round x local_steps DP-SGD steps).")
        if cfg.clients_per_round is None:
            raise ConfigError("clients_per_round null under --dp: centralized's steps a round would follow the number "
                              "of clients in the data; set --clients-per-round N (a round takes N x local_steps "
                              "DP-SGD steps).")
        if getattr(cfg, "dropout", 0.0):  # found by the no-ignored-key product under --dp
            from pfl_cli.fl.config import inert_refusal

            raise inert_refusal("dropout", cfg.algorithm, "under --dp a round is clients_per_round x local_steps "
                                "DP-SGD steps on Poisson batches of the pooled records, whichever of the cohort's "
                                "clients leave", cfg.dropout)
        default = CentralizedConfig.__dataclass_fields__["client_clip"].default
        if cfg.client_clip != default:
            raise ConfigError(f"client_clip under --dp: DP-SGD clips each record's gradient to --dp clip=C instead "
                              f"(Abadi et al. 2016, Alg. 1); got {cfg.client_clip!r}. Drop it.")

    @classmethod
    def plan_dp(cls, cfg, store):
        """:func:`pfl_cli.fl.dpsgd.calibrate_pooled_dp` (public inputs only; ``store`` is not read)."""
        from pfl_cli.fl.dpsgd import calibrate_pooled_dp

        return calibrate_pooled_dp(cfg, steps_per_round=cls.dp_steps_per_round(cfg))

    def build(self) -> None:
        import torch

        from pfl_cli.fl.store import ROLE_TRAIN, Padded

        super().build()
        del self.server_buf  # no server step
        fit = self.store.fit
        train = np.asarray(self.store.clients(ROLE_TRAIN))
        train = train[np.asarray(self.store.labeled)[train]]
        if len(train):
            rows, length = fit.rows(torch.as_tensor(train, device=self.device))
            pooled = torch.cat([r[:n] for r, n in zip(rows, length.tolist())])
        else:  # prediction on a partition without train clients: nothing to pool, nothing trained here
            pooled = torch.zeros(0, dtype=torch.long, device=self.device)
        self.pool = Padded(pooled.unsqueeze(0) if len(pooled) else torch.zeros((1, 1), dtype=torch.long,
                                                                               device=self.device),
                           torch.as_tensor([len(pooled)], device=self.device))
        self.momentum_buf = {k: v.new_zeros((1, *v.shape)) for k, v in self.global_params.items()}

    def round_steps(self, cohort) -> int:
        """The SGD steps the round's cohort takes in all in a federated run of this config."""
        epochs = self.round_schedule().get("epochs")
        if epochs:
            return int(self.epoch_steps(cohort, epochs)[1].sum())
        return len(cohort) * int(self.cfg.local_steps)

    def run_round(self, t, cohort, gen):
        import torch

        from pfl_cli.fl.batches import CohortBatches
        from pfl_cli.fl.cohort import local_sgd

        one = torch.zeros(1, dtype=torch.long, device=self.device)
        if self.dp is not None:
            return self._dp_round(t, one, gen)
        steps = self.round_steps(cohort)
        batches = CohortBatches(self.pool, one, steps, self.cfg.batch_size, gen)
        theta, loss = local_sgd(self.net, broadcast(self.global_params, 1), self.store, batches,
                                momentum_state=self.momentum_buf, **self.sgd_options())
        self.global_params = {k: v[0] for k, v in theta.items()}
        return loss

    def _dp_round(self, t, one, gen):
        """One round of DP-SGD on the pool: ``dp_steps_per_round`` Poisson batches (rate q), per-record clipping,
        Gaussian noise on the sum (:func:`pfl_cli.fl.dpsgd.dp_local_sgd`)."""
        from pfl_cli.fl.dpsgd import dp_local_sgd, poisson_batches
        from pfl_cli.privacy.randomness import mechanism_generator

        cfg, dp = self.cfg, self.dp
        index, mask = poisson_batches(self.pool, one, self.dp_steps_per_round(cfg), dp.sampling_rate, gen)
        theta, loss = dp_local_sgd(self.net, broadcast(self.global_params, 1), self.store, index, mask,
                                   private=list(self.global_params), clip=dp.clip,
                                   noise_multiplier=dp.noise_multiplier, denominator=dp.denominator, lr=cfg.lr,
                                   momentum=cfg.momentum, weight_decay=2.0 * cfg.lambda_theta,
                                   noise_gen=mechanism_generator(cfg, f"dp-noise-{t}", self.device),
                                   momentum_state=self.momentum_buf)
        self.global_params = {k: v[0] for k, v in theta.items()}
        return loss

    def state(self):
        return {"global": {k: v.detach().clone() for k, v in self.global_params.items()},
                "momentum": {k: v.detach().clone() for k, v in self.momentum_buf.items()}}

    def load_state(self, state):
        self.global_params = {k: v.to(self.device) for k, v in state["global"].items()}
        self.momentum_buf = {k: v.to(self.device) for k, v in state["momentum"].items()}

    @staticmethod
    def floats_per_client_round(arch: dict) -> int:
        """Nothing is exchanged: the data are pooled."""
        return 0

