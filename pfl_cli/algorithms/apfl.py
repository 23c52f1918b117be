"""APFL: adaptive personalized federated learning (Deng, Kamani, Mahdavi, 2020, Algorithm 1).

Every client keeps a local model v_i and a mixing weight alpha_i; its personalized model is
the parameter mixture v̄_i = alpha_i v_i + (1 - alpha_i) w with the global model w. On each
local step a cohort client, on one batch, updates (Alg. 1 lines 6-8, Eq. 7)

    w     <- w - eta grad f_i(w)
    v_i   <- v_i - eta grad_v f_i(v̄_i)        = v_i - eta alpha_i grad f_i(v̄_i)
    alpha <- alpha - eta_alpha <v_i - w, grad f_i(v̄_i)>,  projected onto [0, 1]

all three from the same starting point, as plain SGD (the paper's update: no momentum, no
clipping); the server averages the w's as FedAvg. The alpha step is d f_i(v̄_i) / d alpha, taken by
autograd through the mixture: the paper's <v_i - w, grad f_i(v̄_i)>, exactly (PFLlib, after the
authors' code, approximates grad f_i(v̄_i) by alpha grad f_i(v) + (1 - alpha) grad f_i(w) and adds
0.02 alpha). It descends the mixture's *training* loss, so where the local model fits a client's few
samples better than w it drives alpha to 1, local training: on the ring, adaptive alpha ends at 1
and scores below a fixed 0.5 (docs/performance/conformance.md, "APFL's adaptive alpha on the ring"). v_i and alpha_i never leave the client.
With alpha fixed at 1 (``alpha=1``, ``alpha_lr=0``) v̄_i = v_i is local training. A new
client starts v from the global model and alpha from ``alpha``, and trains both for
``new_client_epochs`` epochs with w frozen.

``adapters=lora`` (:mod:`pfl_cli.fl.adapters`): w and v_i are LoRA adapters and a classifier on model_arch's net frozen,
and the personalized model mixes them: v̄_i = alpha_i v_i + (1 - alpha_i) w over the adapters' A and B matrices and
the classifier (a mixture of the parameters, as Alg. 1 mixes whole models).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import numpy as np

from pfl_cli.algorithms.base import Algorithm, PrivateState
from pfl_cli.algorithms.fedavg import FedAvg, FedAvgRoundConfig
from pfl_cli.fl.adapters import AdapterKeys, AdapterTraining, adapted_arch
from pfl_cli.fl.config import key
from pfl_cli.fl.params import stack


ALPHA = "alpha"  # the mixing weight's key in the private state


def mixture(v: dict, w: dict, alpha) -> dict:
    """alpha v + (1 - alpha) w, per client (alpha (c,), v and w stacked)."""
    from pfl_cli.fl.cohort import expand_as_params

    return {k: expand_as_params(alpha, v[k]) * v[k] + (1 - expand_as_params(alpha, v[k])) * w[k] for k in w}


def apfl_steps(model, w: dict, v: dict, alpha, store, steps, *, lr: float, alpha_lr: float, update_w: bool = True):
    """The cohort's APFL local steps (Alg. 1), batched over clients with ``vmap``.

    ``steps``: the cohort's :class:`~pfl_cli.fl.batches.LocalSteps` (one batch per step).

    Returns (w, v, alpha, mean loss of f_i(v̄_i) over each client's active steps).
    """
    import torch
    from torch.func import functional_call, vmap

    from pfl_cli.fl.batches import ActiveMean
    from pfl_cli.fl.cohort import batch_loss, batch_loss_and_grads, expand_as_params

    forward = vmap(lambda p, x: functional_call(model, p, (x,)))
    names = list(w)
    w = {k: t.detach().clone() for k, t in w.items()}
    v = {k: t.detach().clone() for k, t in v.items()}
    alpha = alpha.detach().clone()
    c = steps.num_clients
    mean_loss = ActiveMean(c, alpha.device)
    for idx, m, go in steps:
        go = torch.ones(c, dtype=torch.bool, device=alpha.device) if go is None else go
        gw = None
        if update_w:
            wl = {k: t.requires_grad_(True) for k, t in w.items()}
            _, gw = batch_loss_and_grads(forward, wl, names, store, idx, m)
            w = {k: t.detach() for k, t in wl.items()}
        vl = {k: t.clone().requires_grad_(True) for k, t in v.items()}
        al = alpha.clone().requires_grad_(True)
        mixed = mixture(vl, w, al)
        loss = batch_loss(forward, mixed, store, idx, m)
        grads = torch.autograd.grad(loss.sum(), [vl[k] for k in names] + [al])
        with torch.no_grad():
            for k, g in zip(names, grads[:-1]):
                sel = expand_as_params(go, g)
                v[k] = v[k] - lr * g * sel
                if gw is not None:
                    w[k] = w[k] - lr * gw[k] * sel
            alpha = torch.where(go, (alpha - alpha_lr * grads[-1]).clamp(0.0, 1.0), alpha)
            mean_loss.add(loss, go)
    return w, v, alpha, mean_loss.mean()


@dataclass(frozen=True)
class APFLConfig(FedAvgRoundConfig, AdapterKeys):
    """APFL's keys."""

    algorithm: str = key("apfl", "the algorithm these keys configure")
    alpha: float = key(0.5, "initial mixing weight alpha in [0, 1]", "APFL (Deng et al. 2020) Alg. 1: alpha_0")
    alpha_lr: Optional[float] = key(None, "step size of alpha (null: lr; 0 keeps alpha fixed)",
                                    "APFL (Deng et al. 2020) Alg. 1 line 8")
    new_client_epochs: int = key(20, "epochs a new client trains its local model and alpha",
                                 "thesis §4.4, App. B.1.2: new clients fine-tune 20 epochs")

    def validate(self) -> None:
        super().validate()
        if self.adapters == "lora" and self.lora_dropout:
            from pfl_cli.errors import ConfigError

            raise ConfigError(f"lora_dropout has no effect on apfl (its steps run the mixture v̄ of Alg. 1 without "
                              f"adapter dropout); got {self.lora_dropout!r}. Drop lora_dropout.")


class APFL(AdapterTraining, PrivateState, FedAvg):
    name = "apfl"
    averages_updates = True  # its round ends in server_mean: an update attack and a robust aggregator act there
    individual_reads = ""  # runs under --secagg: w averaged from sums (pfl_cli.fl.secagg.cohort_mean)
    search_space = {"lr": "log:1e-3:1", "alpha": "choice:0.25,0.5,0.75"}
    search_space_source = ("Deng et al., APFL (2020), §6: mixing weights alpha in {0.25, 0.5, 0.75}")
    tune_group = "train"
    paper = "APFL: Deng, Kamani, Mahdavi, 2020"
    new_client_protocol = "its local model and alpha trained new_client_epochs"
    config = APFLConfig
    models_upload = False  # its w steps are plain SGD beside v and alpha, not FedAvg's upload
    dp_unit = None  # its own round: no DP variant (FedAvg's DP-FedAvg is not inherited)
    inert_keys = {k: "its steps are plain SGD (Deng et al. 2020, Alg. 1: no momentum, no clipping, no weight decay)"
                  for k in ("momentum", "client_clip", "lambda_theta")}

    @staticmethod
    def resolve_arch(cfg, store) -> dict:
        return adapted_arch(cfg, store, Algorithm.resolve_arch(cfg, store))

    def build(self) -> None:
        import torch

        super().build()
        self.personalized = True
        template = {**self.global_params, ALPHA: torch.tensor(float(self.cfg.alpha), device=self.device)}
        self.private = self.new_private_state(template)

    def alpha_lr(self) -> float:
        return self.cfg.lr if self.cfg.alpha_lr is None else float(self.cfg.alpha_lr)

    def _steps(self, w, v, alpha, clients, gen, *, epochs=None, steps=None, update_w=True):
        from pfl_cli.fl.distributed import split_cohort

        batches, taken = self.draw_batches(clients, gen, steps=steps, epochs=epochs)
        out = split_cohort(apfl_steps, self.store, batches, {"w": w, "v": v, "alpha": alpha, "steps": batches},
                           model=self.net, store=self.store, lr=self.cfg.lr, alpha_lr=self.alpha_lr(),
                           update_w=update_w)
        return (*out, taken)

    def run_round(self, t, cohort, gen):
        row = self.private.gather(cohort)
        alpha = row.pop(ALPHA)
        w, v, alpha, loss, _ = self._steps(stack(self.global_params, len(cohort)), row, alpha, cohort, gen,
                                           **self.round_schedule())
        w = self.byzantine_uploads(t, cohort, w)
        self.record_exchange(self.global_params, w, len(cohort))  # w only: v and alpha stay on the client
        if self.cfg.secagg:  # Alg. 1's average of w from sums: n_i w_i and n_i through secure aggregation
            from pfl_cli.fl.secagg import cohort_mean

            self.server_step(cohort_mean(self.store, cohort, w, secagg=True))
        else:
            self.server_step(self.server_mean(cohort, w))
        self.private.scatter(cohort, {**v, ALPHA: alpha})
        return loss

    def own_models(self, rows):
        row = self.private.gather(rows)
        alpha = row.pop(ALPHA)
        return mixture(row, stack(self.global_params, len(alpha)), alpha)

    def new_clients(self, clients: np.ndarray, gen) -> dict:
        """v from the global model, alpha from ``alpha``; both trained with w frozen."""
        import torch

        def build(sel):
            w = stack(self.global_params, len(sel))
            alpha = torch.full((len(sel),), float(self.cfg.alpha), device=self.device)
            v = {k: t.clone() for k, t in w.items()}
            if self.cfg.new_client_epochs:
                _, v, alpha, _, taken = self._steps(w, v, alpha, sel, gen, epochs=self.cfg.new_client_epochs,
                                                    update_w=False)
                self.client_sgd_steps += taken
            return mixture(v, w, alpha)

        return self.chunked(clients, build)
