"""Per-FedAvg (Fallah, Mokhtari, Ozdaglar, NeurIPS 2020, Algorithm 1): FedAvg of a MAML objective.

Each local step of a cohort client takes independent batches D, D' (and D'' for HF):

    temp = w - alpha grad f(w; D)                                      (one inner step)
    FO:  w <- w - beta grad f(temp; D')                                (first-order MAML, Eq. 8)
    HF:  w <- w - beta (I - alpha hess f(w; D'')) grad f(temp; D')     (Hessian-free, Eq. 9-10)

with the Hessian-vector product taken exactly by double back-propagation. The server
averages the clients' w by data size. alpha is ``lr``, beta is ``beta`` (default: lr);
steps are plain SGD as in the paper (no momentum, no clipping). Every client, seen or new,
personalizes by fine-tuning the global model: ``finetune_steps`` steps of size alpha on its
own data (0 = one step, the paper's evaluation). No private state.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import numpy as np

from pfl_cli.algorithms.fedavg import FedAvg, FedAvgConfig
from pfl_cli.fl.config import key
from pfl_cli.fl.params import stack


def perfedavg_steps(model, w: dict, store, steps, *, alpha: float, beta: float, variant: str):
    """The cohort's Per-FedAvg local steps, batched with ``vmap``.

    ``steps``: :class:`~pfl_cli.fl.batches.LocalSteps` of k batches per step, index and mask
    (c, k, b): k = 2 (D, D'; FO) or 3 (and D''; HF).
    Returns the clients' w and the mean loss of f(temp; D') over their active steps.
    """
    import torch
    from torch.func import functional_call, vmap

    from pfl_cli.fl.batches import ActiveMean
    from pfl_cli.fl.cohort import batch_loss_and_grads, expand_as_params

    forward = vmap(lambda p, x: functional_call(model, p, (x,)))
    names = list(w)
    w = {k: t.detach().clone() for k, t in w.items()}
    c, device = steps.num_clients, next(iter(w.values())).device
    mean_loss = ActiveMean(c, device)
    for index, mask, go in steps:
        go = torch.ones(c, dtype=torch.bool, device=device) if go is None else go
        wl = {k: t.clone().requires_grad_(True) for k, t in w.items()}
        _, g1 = batch_loss_and_grads(forward, wl, names, store, index[:, 0], mask[:, 0])
        temp = {k: (w[k] - alpha * g1[k]).requires_grad_(True) for k in names}
        loss, g2 = batch_loss_and_grads(forward, temp, names, store, index[:, 1], mask[:, 1])
        update = g2
        if variant == "hf":
            w3 = {k: t.clone().requires_grad_(True) for k, t in w.items()}
            _, g3 = batch_loss_and_grads(forward, w3, names, store, index[:, 2], mask[:, 2], create_graph=True)
            # clients' losses are independent: the gradient of sum_i <g3_i, g2_i> is each client's H_i g2_i
            hv = torch.autograd.grad(sum((g3[k] * g2[k]).sum() for k in names), [w3[k] for k in names])
            update = {k: g2[k] - alpha * h for k, h in zip(names, hv)}
        with torch.no_grad():
            for k in names:
                w[k] = w[k] - beta * update[k] * expand_as_params(go, update[k])
            mean_loss.add(loss, go)
    return w, mean_loss.mean()


@dataclass(frozen=True)
class PerFedAvgConfig(FedAvgConfig):
    """Per-FedAvg's keys; its alpha is lr."""

    algorithm: str = key("perfedavg", "the algorithm these keys configure")
    variant: str = key("fo", "fo (first-order MAML) | hf (Hessian-free)", "thesis §4.4, App. B.1.2: first-order (FO)",
                       choices=("fo", "hf"))
    beta: Optional[float] = key(None, "outer step beta (null: lr)", "Per-FedAvg (Fallah et al. 2020) Alg. 1")


class PerFedAvg(FedAvg):
    name = "perfedavg"
    averages_updates = True  # its round ends in server_mean: an update attack and a robust aggregator act there
    individual_reads = ""  # under --secagg the mean of the meta-updated models from sums (server_mean)
    search_space = {"lr": "log:1e-3:1", "beta": "log:1e-3:1"}
    search_space_source = ("Fallah et al., Per-FedAvg (NeurIPS 2020), §5: alpha (the lr) and beta tuned per dataset")
    tune_group = "train"
    paper = "Per-FedAvg: Fallah, Mokhtari, Ozdaglar, NeurIPS 2020"
    new_client_protocol = "the global model fine-tuned finetune_steps steps (at least one)"
    config = PerFedAvgConfig
    models_upload = False  # its steps are MAML steps on two batches, not FedAvg's upload
    dp_unit = None  # its own round: no DP variant (FedAvg's DP-FedAvg is not inherited)
    inert_keys = {k: "its steps, local and fine-tuning, are plain SGD (Fallah et al. 2020, Alg. 1: no momentum, no "
                     "clipping, no weight decay)" for k in ("momentum", "client_clip", "lambda_theta")}

    def build(self) -> None:
        super().build()
        self.personalized = True

    def beta(self) -> float:
        return self.cfg.lr if self.cfg.beta is None else float(self.cfg.beta)

    def server_mean(self, cohort, theta: dict) -> dict:
        """FedAvg's mean of the meta-updated models, or under ``--secagg`` the same mean from the cohort's sums
        (:func:`~pfl_cli.fl.secagg.cohort_mean`)."""
        if not self.cfg.secagg:
            return super().server_mean(cohort, theta)
        from pfl_cli.fl.secagg import cohort_mean

        return cohort_mean(self.store, cohort, theta, secagg=True)

    def run_round(self, t, cohort, gen):
        from pfl_cli.fl.distributed import split_cohort

        cfg = self.cfg
        per_step = 3 if cfg.variant == "hf" else 2  # batches D, D' (and D'' for HF) per local step
        batches, _ = self.draw_batches(cohort, gen, per_step=per_step, **self.round_schedule())
        w, loss = split_cohort(perfedavg_steps, self.store, batches,
                               {"w": stack(self.global_params, len(cohort)), "steps": batches},
                               model=self.net, store=self.store, alpha=cfg.lr, beta=self.beta(), variant=cfg.variant)
        w = self.byzantine_uploads(t, cohort, w)
        self.record_exchange(self.global_params, w, len(cohort))
        self.server_step(self.server_mean(cohort, w))
        return loss

    def sgd_options(self) -> dict:
        """Fine-tuning: plain steps of size alpha (= lr), as the paper's one-step personalization."""
        return {"lr": self.cfg.lr, "momentum": 0.0, "weight_decay": 0.0, "clip": 0.0}

    def personalize(self, clients: np.ndarray, gen):
        return self.train_clients(self.global_params, clients, gen, steps=self.cfg.finetune_steps or 1), True
