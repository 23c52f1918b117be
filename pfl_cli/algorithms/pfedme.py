"""pFedMe: personalized FL with Moreau envelopes (Dinh, Tran, Nguyen, NeurIPS 2020, Algorithm 1).

Each local step of a cohort client draws a batch D and

1. solves the personalized problem  theta~ = argmin_theta f(theta; D) + lambda/2 ||theta - w||^2
   approximately by K gradient steps of size ``personal_lr`` (Eq. 7; warm-started from the
   previous step's theta~, from w at the start of the round);
2. moves its local model  w <- w - eta lambda (w - theta~)  (Alg. 1 line 8; eta = ``lr``).

The server mixes  w <- (1 - beta) w + beta * mean_i w_i  (line 11; the uniform mean over the cohort S).
Steps are plain gradient steps (no momentum, no clipping). Each client's last theta~ is its
personalized model, kept as private state. A new client (PeFLL thesis §4.4, App. B.1.2) starts from the global
model and runs the same local procedure for ``new_client_epochs`` epochs; its model is theta~.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import numpy as np

from pfl_cli.algorithms.base import PrivateState
from pfl_cli.algorithms.fedavg import FedAvg, FedAvgRoundConfig
from pfl_cli.fl.config import key
from pfl_cli.fl.params import stack
from pfl_cli.fl.secagg import cohort_mean


DEFAULT_LAMBDA = 15.0  # PeFLL thesis App. B.1.2: lambda = 15, K = 3, beta = 1


def pfedme_lambda(cfg) -> float:
    return DEFAULT_LAMBDA if cfg.lam is None else float(cfg.lam)


def inner_solution(forward, theta: dict, w: dict, store, idx, m, *, lam: float, personal_lr: float, K: int):
    """K gradient steps on f(theta; D) + lambda/2 ||theta - w||^2 for every client at once (Eq. 7)."""
    from pfl_cli.fl.cohort import batch_loss_and_grads

    names = list(w)
    loss = None
    for _ in range(K):
        leaves = {k: t.detach().clone().requires_grad_(True) for k, t in theta.items()}
        loss, g = batch_loss_and_grads(forward, leaves, names, store, idx, m)
        theta = {k: leaves[k].detach() - personal_lr * (g[k] + lam * (leaves[k].detach() - w[k])) for k in names}
    return theta, loss


def pfedme_steps(model, w: dict, store, steps, *, lam: float, eta: float, personal_lr: float, K: int):
    """The cohort's pFedMe local steps over ``steps`` (:class:`~pfl_cli.fl.batches.LocalSteps`).

    Returns (w, theta~, mean loss of f(theta~; D) over active steps).
    """
    import torch
    from torch.func import functional_call, vmap

    from pfl_cli.fl.batches import ActiveMean
    from pfl_cli.fl.cohort import expand_as_params

    forward = vmap(lambda p, x: functional_call(model, p, (x,)))
    w = {k: t.detach().clone() for k, t in w.items()}
    theta = {k: t.clone() for k, t in w.items()}
    c, device = steps.num_clients, next(iter(w.values())).device
    mean_loss = ActiveMean(c, device)
    for index, mask, go in steps:
        go = torch.ones(c, dtype=torch.bool, device=device) if go is None else go
        new_theta, loss = inner_solution(forward, theta, w, store, index, mask, lam=lam,
                                         personal_lr=personal_lr, K=K)
        for k in w:
            sel = expand_as_params(go, w[k])
            theta[k] = torch.where(sel, new_theta[k], theta[k])
            w[k] = w[k] - eta * lam * (w[k] - theta[k]) * sel
        mean_loss.add(loss, go)
    return w, theta, mean_loss.mean()


@dataclass(frozen=True)
class PFedMeConfig(FedAvgRoundConfig):
    """pFedMe's keys."""

    algorithm: str = key("pfedme", "the algorithm these keys configure")
    lam: float = key(15.0, "lambda: Moreau-envelope weight", "thesis §4.4, App. B.1.2: lambda = 15")
    K: int = key(3, "gradient steps on the inner (personalized) problem", "thesis §4.4, App. B.1.2: K = 3")
    beta: float = key(1.0, "server mixing beta (Alg. 1 line 11)", "thesis §4.4, App. B.1.2: beta = 1")
    personal_lr: Optional[float] = key(None, "step size of the K inner steps (null: lr)")
    new_client_epochs: int = key(20, "epochs a new client fine-tunes with the pFedMe loss",
                                 "thesis §4.4, App. B.1.2: finetune 20 epochs with the pFedMe loss")


class PFedMe(PrivateState, FedAvg):
    name = "pfedme"
    individual_reads = ""  # under --secagg Alg. 1 line 11's mean of the local models from the cohort's sums
    search_space = {"lr": "log:1e-3:1", "lam": "choice:0.1,1,15,30", "personal_lr": "log:1e-3:1e-1"}
    search_space_source = ("T. Dinh et al., pFedMe (NeurIPS 2020), §5.2: lambda, the personal lr and the global lr "
                           "are tuned (lambda 15 on MNIST; values from 0.1 to 30 are searched here)")
    tune_group = "train"
    paper = "pFedMe: Dinh, Tran, Nguyen, NeurIPS 2020"
    new_client_protocol = "the global model, then new_client_epochs of pFedMe's local procedure"
    config = PFedMeConfig
    models_upload = False  # its w follows the Moreau envelope's inner solution, not FedAvg's upload
    dp_unit = None  # its own round: no DP variant (FedAvg's DP-FedAvg is not inherited)
    inert_keys = {**{k: "its server step is beta (Dinh et al. 2020, Alg. 1 line 11: w <- (1 - beta) w + beta * the "
                        "cohort mean); set --set beta=B" for k in ("server_lr", "server_momentum")},
                  **{k: "its steps are plain gradient steps (Dinh et al. 2020, Alg. 1: no momentum, no clipping, "
                        "no weight decay; lam is its regularizer)" for k in ("momentum", "client_clip", "lambda_theta")}}

    def build(self) -> None:
        super().build()
        self.personalized = True
        self.private = self.new_private_state(self.global_params)

    def _local(self, w, clients, gen, **schedule):
        cfg = self.cfg
        from pfl_cli.fl.distributed import split_cohort

        batches, taken = self.draw_batches(clients, gen, **schedule)
        out = split_cohort(pfedme_steps, self.store, batches, {"w": w, "steps": batches},
                           model=self.net, store=self.store, lam=pfedme_lambda(cfg), eta=cfg.lr,
                           personal_lr=cfg.lr if cfg.personal_lr is None else cfg.personal_lr, K=cfg.K)
        return (*out, taken)

    def run_round(self, t, cohort, gen):
        w, theta, loss, _ = self._local(stack(self.global_params, len(cohort)), cohort, gen, **self.round_schedule())
        self.record_exchange(self.global_params, w, len(cohort))  # w only: theta~ stays on the client
        beta = 1.0 if self.cfg.beta is None else float(self.cfg.beta)
        mean = cohort_mean(self.store, cohort, w, by_size=False,  # Alg. 1 line 11: (1/S) sum over the cohort
                           secagg=self.cfg.secagg)
        for k, g in self.global_params.items():
            self.global_params[k] = (1 - beta) * g + beta * mean[k]
        self.private.scatter(cohort, theta)
        return loss

    def own_models(self, rows):
        return self.private.gather(rows)

    def new_clients(self, clients: np.ndarray, gen) -> dict:
        """The global model, then pFedMe's local procedure for ``new_client_epochs`` epochs: its theta~."""
        def build(sel):
            w = stack(self.global_params, len(sel))
            if not self.cfg.new_client_epochs:
                return w
            _, theta, _, taken = self._local(w, sel, gen, epochs=self.cfg.new_client_epochs)
            self.client_sgd_steps += taken
            return theta

        return self.chunked(clients, build)
