"""FedAvg (thesis Alg. 3/4) with a server learning rate, and optional fine-tuning for new clients.

Each round the cohort starts from the global model, runs k local SGD steps (or
``local_epochs`` passes) and the server moves the global model by ``server_lr`` times the
data-size-weighted mean of the clients' deltas (Alg. 3 line 9 is ``server_lr = 1``),
optionally with server momentum. A client's model is the global model, or the global model
after ``finetune_steps`` local steps on its own data: all its weights, or (``finetune_adapters=lora``,
:mod:`pfl_cli.fl.finetune`) fresh LoRA adapters and the classifier over it frozen, merged into it.

``sam_rho > 0`` makes every local step of a round sharpness-aware (SAM, Foret et al., ICLR 2021,
Eq. 2-3: the gradient taken at ``w + rho g / ||g||`` on the same batch; :mod:`pfl_cli.fl.sam`): FedAvg
with it is FedSAM (Qu et al., ICML 2022, Alg. 1), and FedProx with it SAM steps on FedProx's local
objective (the proximal term joins the base optimizer's step like weight decay, at ``w``). Fine-tuning
(``finetune_steps``) stays plain SGD, as FedSAM's new-client protocol. ``sam_rho = 0`` (the default)
is today's plain SGD, the same code path.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import numpy as np

from pfl_cli.algorithms.base import Algorithm
from pfl_cli.attack.protocol import Attackable
from pfl_cli.fl.config import TrainConfig, key
from pfl_cli.fl.finetune import FinetuneAdapterKeys
from pfl_cli.fl.params import broadcast, cpu_tree, stack


@dataclass(frozen=True)
class FedAvgRoundConfig(TrainConfig):
    """The keys of FedAvg's round, shared by the algorithms built on it; defaults: PeFLL's baseline protocol."""

    algorithm: str = key("fedavg", "the algorithm these keys configure")
    rounds: int = key(5000, "communication rounds", "thesis §4.4, App. B.1.2: all methods but Local train 5000 rounds")
    clients_per_round: Optional[int] = key(5, "cohort size of every round (null: every train client)",
                                           "thesis §4.4: FEMNIST 5 clients per round")
    local_steps: int = key(50, "k: client SGD steps per round", "thesis §4.4: k = 50")
    local_epochs: Optional[int] = key(None, "epochs of local SGD per round instead of local_steps (null: steps)")
    server_lr: float = key(1.0, "server step on the mean delta", "thesis Alg. 3 line 9: the mean model (step 1)")
    server_momentum: float = key(0.0, "server momentum on the mean delta", "thesis Alg. 3: none")


@dataclass(frozen=True)
class FedAvgConfig(FedAvgRoundConfig):
    """FedAvg's keys."""

    finetune_steps: int = key(0, "local steps from the global model before evaluation (0: the global model)",
                              "thesis §4.4, App. B.1.2: a new client uses the global model as-is")


@dataclass(frozen=True)
class FedAvgFinetuneConfig(FedAvgConfig, FinetuneAdapterKeys):
    """FedAvg's keys and what its fine-tuning trains (``finetune_adapters``: :mod:`pfl_cli.fl.finetune`): the config
    of the methods built on FedAvg that serve its global model fine-tuned (not the LoRA algorithms, whose fine-tuning
    trains their own adapters)."""


def sam_rho_key(default: float = 0.0, source: str = "pflx: plain local SGD (FedAvg's own local solver, McMahan et "
                                                          "al. 2017); FedSAM's radius is fedsam's default",
                help: str = "rho: radius of the SAM perturbation of every local step (0: plain SGD steps; Foret et "
                            "al. 2021, Eq. 2)"):
    """The ``sam_rho`` key of the configs whose local steps may be SAM's (fedavg, fedprox, fedsam)."""
    return key(default, help, source)


def check_sam_rho(cfg) -> None:
    """``sam_rho``: a finite number >= 0 (0: plain SGD), one line naming the fix otherwise."""
    import math

    from pfl_cli.errors import ConfigError

    v = cfg.sam_rho
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v < 0:
        raise ConfigError(f"sam_rho must be a finite number >= 0 for {cfg.algorithm} (the SAM radius of every local "
                          f"step); got {v!r}. Use 0 for plain local SGD, or a radius such as SAM's 0.05 (Foret et "
                          "al. 2021).")


@dataclass(frozen=True)
class FedAvgSAMConfig(FedAvgFinetuneConfig):
    """fedavg's own keys: FedAvg's and the SAM radius of its local steps (FedAvgConfig is the base of the
    algorithms built on FedAvg, which do not take ``sam_rho``)."""

    sam_rho: float = sam_rho_key()

    def validate(self) -> None:
        super().validate()
        check_sam_rho(self)


class FedAvg(Attackable, Algorithm):
    name = "fedavg"
    search_space = {"lr": "log:1e-3:1"}
    search_space_source = ("McMahan et al. 2017, §3: the client lr is tuned per task (a grid of two to three "
                           "decades); Scott 2026 thesis App. C.1.2: the local lr tuned on validation clients")
    tune_group = "train"
    paper = "FedAvg: McMahan et al., AISTATS 2017 (thesis Alg. 3/4)"
    new_client_protocol = "the global model, or it fine-tuned finetune_steps steps"
    config = FedAvgSAMConfig
    dp_unit = "client"
    dp_contribution = "model delta"
    default_server_lr = 1.0
    serves_unlabeled = "fedavg without --finetune-steps (one global model)"
    # The run axis (pfl_cli.fl.stack): a round's local training is one plain cohort SGD call, so runs that differ
    # only in these keys train stacked in one process; declared per class, never inherited.
    compressible_upload = True  # its upload is the model delta (Alg. 3 line 7)
    stackable = True
    stack_keys = ("seed", "lr", "momentum", "lambda_theta", "client_clip", "server_lr", "server_momentum", "sam_rho")
    averages_updates = True  # aggregate(): where an update attack and a robust aggregator act (issue 48)

    @property
    def finetune_steps(self) -> int:
        """``finetune_steps`` of the config; 0 for the algorithms built on FedAvg whose config has none (Ditto)."""
        return getattr(self.cfg, "finetune_steps", 0)

    @property
    def needs_labels_to_predict(self) -> bool:
        return self.finetune_steps > 0

    def build(self) -> None:
        if self.sam_rho:
            from pfl_cli.errors import InputError
            from pfl_cli.fl.distributed import world

            if world()[1] > 1:
                raise InputError(f"--nproc / torchrun: {self.name} with sam_rho {self.sam_rho} runs in one process "
                                 "only (its SAM steps are not split across ranks); drop --nproc, or set sam_rho=0.")
        self.net = self.client_net()
        self.global_params = {k: v.detach().clone() for k, v in self.net.named_parameters()}
        self.server_buf = {k: v.new_zeros(v.shape) for k, v in self.global_params.items()}
        self.personalized = self.finetune_steps > 0
        self.check_finetune()

    def run_round(self, t, cohort, gen):
        import torch

        if len(cohort) == 0:  # an empty Poisson cohort (DP): no client trains, the noise is still added
            theta, loss = stack(self.global_params, 0), torch.zeros(0)
        else:
            # local SGD copies its start into the stack it trains: no second cohort-sized copy here
            theta, loss, _ = self.cohort_sgd(broadcast(self.global_params, len(cohort)), cohort, gen,
                                             **self.round_schedule(), **self.local_objective())
        self.aggregate(t, cohort, theta)
        return loss

    def aggregate(self, t: int, cohort, theta: dict) -> None:
        """The server's half of round ``t``: the cohort's models ``theta`` (c, ...) -> the new global model.

        Alg. 3 line 9 (the data-size-weighted mean), or under ``--dp`` DP-FedAvg (McMahan et al.
        2018, Alg. 1): clipped deltas, noisy sum / (q N), even for an empty Poisson cohort.
        A Flower deployment's ServerApp calls it with the models its nodes sent.
        """
        theta = self.byzantine_uploads(t, cohort, theta)  # Byzantine clients' uploads (issue 48), if any
        if self.cfg.secagg:  # the server learns the cohort's sums only (pfl_cli.fl.secagg)
            from pfl_cli.fl.secagg import secure_sum

            self.record_exchange(self.global_params, theta, len(cohort))
            rows = self.secure_contributions(t, cohort, theta)
            self.aggregate_secure(t, secure_sum(rows, modulus=getattr(self.dp, "modulus", None), spent=(theta,)))
            return
        if self.upload_codec is not None:  # the deltas as compressed on the wire (pfl_cli.fl.compression)
            theta = self.upload_codec.compress_models(self, cohort, self.global_params, theta)
        else:
            self.record_exchange(self.global_params, theta, len(cohort))
        if self.dp is not None:
            from pfl_cli.privacy.randomness import mechanism_generator  # numpy.random: not for a run up to date

            deltas = {k: theta[k] - g for k, g in self.global_params.items()}
            self.server_update(self.dp.private_mean(deltas, mechanism_generator(self.cfg, f"dp-noise-{t}",
                                                                            self.device)))
        else:
            self.server_step(self.server_mean(cohort, theta))

    def byzantine_uploads(self, t: int, cohort, theta: dict) -> dict:
        """The cohort's models ``theta`` as the server receives them in round ``t``: with Byzantine clients
        (:mod:`pfl_cli.fl.byzantine`) the malicious ones' deltas from the global model replaced; else ``theta``."""
        from pfl_cli.fl.robust import corrupt_uploads

        return corrupt_uploads(self, t, cohort, theta)

    def server_mean(self, cohort, theta: dict) -> dict:
        """The server's average of the cohort's models ``theta`` (the global model's keys or some of them):
        FedAvg's data-size-weighted mean (Alg. 3 line 9), or the robust aggregator ``aggregator`` names
        (:mod:`pfl_cli.fl.robust`), centred on the server's last step (its buffer, where it keeps one)."""
        from pfl_cli.fl.robust import average_uploads

        return average_uploads(self, cohort, theta)

    # Secure aggregation (pfl_cli.fl.secagg): what the server would read one client at a time ("" = nothing, the
    # server step needs the cohort's sums only). Declared per class (the table in docs/privacy/secure-aggregation.md).
    individual_reads = ""

    def secure_contributions(self, t: int, cohort, theta: dict) -> dict:
        """The client half of a round under ``--secagg``: each cohort client's row, computed from its own model
        and data only, for :func:`~pfl_cli.fl.secagg.secure_sum`.

        Without DP, client i sends ``n_i theta_i`` and ``n_i`` (its fit size), so that the sums give Alg. 3 line 9's
        weighted mean; under ``--dp`` its delta clipped by itself (central DP-FedAvg: the server adds the noise to
        the sum) or, with the distributed mechanism, clipped, encoded and noised by itself
        (:mod:`pfl_cli.privacy.distributed`).
        """
        import torch

        from pfl_cli.fl.secagg import WEIGHT
        from pfl_cli.privacy.randomness import mechanism_generator

        if self.dp is None:
            n = self.store.fit.length[cohort].to(torch.float32)
            rows = {k: v * n.view(-1, *([1] * (v.dim() - 1))) for k, v in theta.items()}
            return {**rows, WEIGHT: n}
        deltas = {k: theta[k] - g for k, g in self.global_params.items()}
        return self.dp.client_rows(deltas, mechanism_generator(self.cfg, f"dp-client-noise-{t}", self.device))

    def aggregate_secure(self, t: int, total) -> None:
        """The server half of round ``t`` under ``--secagg``: ``total`` (a :class:`~pfl_cli.fl.secagg.SecureSum`)
        is all it reads. Alg. 3 line 9 as sum(n_i theta_i) / sum(n_i); under ``--dp`` the released sum
        (central: noise added here; distributed: decoded) divided by the mechanism's fixed denominator."""
        from pfl_cli.fl.secagg import WEIGHT
        from pfl_cli.privacy.randomness import mechanism_generator

        if self.dp is None:
            sums = total.total()
            weight = sums.pop(WEIGHT).clamp_min(1.0)
            self.server_step({k: v / weight for k, v in sums.items()})
        else:
            self.server_update(self.dp.release_sum(total, mechanism_generator(self.cfg, f"dp-noise-{t}",
                                                                             self.device)))

    @property
    def sam_rho(self) -> float:
        """``sam_rho`` of the config; 0 (plain SGD) for the algorithms built on FedAvg whose config has none."""
        return float(getattr(self.cfg, "sam_rho", 0.0))

    def local_objective(self) -> dict:
        """Extra terms of the clients' local objective (FedProx adds its proximal term), and SAM's radius."""
        return {"sam_rho": self.sam_rho} if self.sam_rho else {}

    def cohort_sgd(self, start: dict, clients, gen, *, sam_rho: float = 0.0, **options):
        """:meth:`Algorithm.cohort_sgd`, or with ``sam_rho > 0`` every step a SAM step
        (:func:`pfl_cli.fl.sam.local_steps`: the gradient at ``w + rho g / ||g||``, Foret et al. 2021 Eq. 2-3)
        through the same client optimizer, FedProx's proximal term added to the step as the plain path adds it
        (after clipping, at ``w``)."""
        if not sam_rho:
            return super().cohort_sgd(start, clients, gen, **options)
        from pfl_cli.fl.cohort import resolve_cohort_exec
        from pfl_cli.fl.sam import cross_entropy_grad_fn, local_steps

        steps, epochs = options.pop("steps", None), options.pop("epochs", None)
        mu, anchor = options.pop("prox_mu", 0.0), options.pop("prox_anchor", None)
        if options:  # a parameter subset or other SGD settings: not a round of FedAvg's or FedProx's
            raise TypeError(f"cohort_sgd with sam_rho takes steps, epochs, prox_mu and prox_anchor; got "
                            f"{sorted(options)}")
        batches = self.local_batches(clients, gen, steps=steps, epochs=epochs)
        if self.round_budget is not None:  # a straggler's partial work (federation conditions)
            from pfl_cli.fl.conditions.rounds import cap_steps

            cap_steps(batches, self.round_budget)
        how = resolve_cohort_exec(self.cfg.cohort_exec, self.net, self.device)
        sgd = self.sgd_update_options()
        if mu:
            sgd.update(prox_mu=mu, prox_anchor=broadcast(anchor, len(clients)))
        theta, loss = local_steps(cross_entropy_grad_fn(self.net, self.store, how), start, batches,
                                  rho=float(sam_rho), sgd=sgd)
        return theta, loss, batches.active_steps()

    def server_step(self, mean: dict) -> None:
        """Move the global model towards the cohort's mean model ``mean`` (Alg. 3 line 9)."""
        self.server_update({k: mean[k] - g for k, g in self.global_params.items()})

    def server_update(self, mean_delta: dict) -> None:
        """Move the global parameters by ``server_lr`` times the (momentum-averaged) mean delta."""
        cfg = self.cfg
        lr = cfg.server_lr if cfg.server_lr is not None else self.default_server_lr
        for k, g in self.global_params.items():
            self.server_buf[k] = cfg.server_momentum * self.server_buf[k] + mean_delta[k]
            self.global_params[k] = g + lr * self.server_buf[k]

    def protocol(self, new: bool) -> dict:
        return {"protocol": self.finetune_protocol(self.finetune_steps), "rounds": 0}

    models_upload = True     # also Ditto's and kNN-Per's: their global model takes FedAvg's round
    upload_under_dp = True  # client-level DP-FedAvg: the client's delta, clipped and noised only in the sum

    def upload(self, x, y, *, steps: int, noise_gen=None, start=None, clients=None, private=None):
        """Alg. 3 line 7: the client's delta after ``steps`` local steps from the global model (0: its gradient).

        Under client-level ``--dp`` the server receives each delta before the noise of the sum is
        added, clipped by a positive factor (which cosine matching does not see).
        """
        if self.sam_rho and (self.round_upload_steps() if steps is None else steps):
            from pfl_cli.errors import InputError

            raise InputError(f"--model: a {self.name} run with sam_rho {self.sam_rho} uploads SAM steps, which pflx "
                             "attack does not model (it unrolls plain SGD); attack its gradient with --local-steps 0, "
                             "or a run with sam_rho=0.")
        start = stack(self.global_params, x.shape[0]) if start is None else start
        return self.local_update(start, x, y, steps), start

    def personalize(self, clients: np.ndarray, gen):
        if self.finetune_steps > 0:  # all weights, or LoRA adapters (Algorithm.finetune)
            return self.finetune(self.global_params, clients, gen, self.finetune_steps), True
        return self.global_params, False

    def state(self):
        return {"global": {k: v.detach().clone() for k, v in self.global_params.items()},
                "server_buf": {k: v.detach().clone() for k, v in self.server_buf.items()}}

    def load_state(self, state):
        self.global_params = {k: v.to(self.device) for k, v in state["global"].items()}
        self.server_buf = {k: v.to(self.device) for k, v in state["server_buf"].items()}

    def weights(self):
        return {"client": cpu_tree(self.global_params)}

    def load_weights(self, weights):
        self.global_params = {k: v.to(self.device) for k, v in weights["client"].items()}
