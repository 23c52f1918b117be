"""GPFL (Zhang, Hua, Wang, Song, Xue, Ma, Cao, Guan, ICCV 2023): global and personalized feature information.

Beside the client net's feature extractor f and its head h, two shared modules, the paper's GCE and CoV:

- GCE, global category embeddings: one vector e_c per class (an embedding table, C x d);
- CoV, the conditional valve: from a conditional input z it makes gamma(z) and beta(z)
  (each Linear(d, d) -> ReLU -> LayerNorm) and gates a feature as ReLU(f(x) * (gamma(z) + 1) + beta(z)).

Each client has a generic conditional input g = (1 / C) sum_c e_c and a personalized one
p_i = sum_c pi_{i,c} e_c (pi_i its class distribution), both from the GCE it receives. The
personalized feature f_P = CoV(f(x), p_i) feeds the client's own head (the prediction); the
generic feature f_G = CoV(f(x), g) is trained towards the GCE: the loss is

    CE(h(f_P), y) + CE_cos(f_G, y) + lambda * || f_G - e_y ||_2

with CE_cos the cross-entropy of the cosine similarities between f_G and every e_c (angle-level
guidance) and the last term's e_y taken from the GCE as received (magnitude-level guidance; the
norm is over the whole batch, as the authors' code takes it). GCE and CoV take weight decay
``gpfl_mu`` on top of the client optimizer's. The server averages f, GCE and CoV weighted by client
data size; each client keeps its head. Exchanged: 2 x (|f| + |GCE| + |CoV|) floats per cohort
client and round.

A new client: a fresh head (the shared initialization) trained ``new_client_epochs`` epochs on
the frozen rest, with its personalized conditional input from its own class distribution.

Defaults: lambda = 0.01 and mu = 0.1, the authors' setting for CNN and MLP nets (their
``system/run_me.sh``). Departure: the authors' code (and PFLlib's) computes a client's conditional
inputs from the GCE it trained in its previous round, before taking the new global GCE; pflx
computes them from the global GCE the client receives, as the paper defines them.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from pfl_cli.algorithms.base import PrivateState, epochs_protocol
from pfl_cli.algorithms.fedavg import FedAvgRoundConfig
from pfl_cli.algorithms.partial import _GlobalModel
from pfl_cli.fl.config import check_own_keys, key
from pfl_cli.fl.params import stack
from pfl_cli.fl.secagg import cohort_mean

CONTEXT_P, CONTEXT_G = "context_p", "context_g"  # the buffers of GPFLNet (gpfl_net), by their names


def conditional_inputs(gce_weight, counts):
    """(generic (d,), personalized (c, d)): the mean embedding, and each client's class-weighted one."""
    pi = counts / counts.sum(1, keepdim=True).clamp_min(1.0)
    return gce_weight.mean(0), pi @ gce_weight


def gpfl_steps(model: GPFLNet, params: dict, buffers: dict, store, steps, *, trainable: list[str], lam: float,
               mu: float, sgd: dict, personal_only: bool = False):
    """The cohort's GPFL local steps (``vmap``); returns (params, each client's mean loss).

    ``params`` / ``buffers`` name -> (c, ...); the GCE as received (``gce.weight`` of ``params`` at
    the start) is the magnitude-level target. ``personal_only``: cross-entropy of the personalized
    prediction alone (a new client's head).
    """
    import torch
    import torch.nn.functional as F

    from torch.func import functional_call, vmap

    from pfl_cli.fl.batches import ActiveMean
    from pfl_cli.fl.cohort import _masked_mean_loss, sgd_update_

    forward = vmap(lambda p, x: functional_call(model, p, (x,), {"parts": True}))
    theta = {k: v.detach().clone() for k, v in params.items()}
    target = params["gce.weight"].detach().clone()  # (c, C, d): GCE_frozen of the authors' code
    shared_mods = ("cov_gamma.", "cov_beta.", "gce.")
    groups = [[k for k in trainable if not k.startswith(shared_mods)], [k for k in trainable if k.startswith(shared_mods)]]
    options = [sgd, {**sgd, "weight_decay": sgd.get("weight_decay", 0.0) + mu}]
    bufs = [{k: torch.zeros_like(theta[k]) for k in g} if sgd.get("momentum") else {} for g in groups]
    mean_loss = ActiveMean(steps.num_clients, target.device)
    for idx, m, go in steps:
        moving = {k: theta[k].requires_grad_(True) for k in trainable}
        logits, feat_g = forward({**theta, **buffers}, store.inputs(idx))
        y = store.y[idx]
        loss = _masked_mean_loss(logits, y, m)
        if not personal_only:
            gce = theta["gce.weight"]                                              # (c, C, d)
            cos = torch.einsum("cbd,ckd->cbk", F.normalize(feat_g, dim=-1), F.normalize(gce, dim=-1))
            loss = loss + _masked_mean_loss(cos, y, m)
            real = (m * (y >= 0)).unsqueeze(-1)
            e_y = torch.gather(target, 1, y.clamp_min(0).unsqueeze(-1).expand(-1, -1, target.shape[-1]))
            loss = loss + lam * torch.sqrt((((feat_g - e_y) * real) ** 2).sum((1, 2)) + 1e-12)
        grads = dict(zip(moving, torch.autograd.grad(loss.sum(), list(moving.values()))))
        for k in trainable:
            theta[k] = theta[k].detach()
        for names, opt, buf in zip(groups, options, bufs):
            if names:
                sgd_update_({k: theta[k] for k in names}, {k: grads[k] for k in names}, buf, **opt, active=go)
        mean_loss.add(loss.detach(), go)
    return theta, mean_loss.mean()


@dataclass(frozen=True)
class GPFLConfig(FedAvgRoundConfig):
    """GPFL's keys: FedAvg's round and its two constants."""

    algorithm: str = key("gpfl", "the algorithm these keys configure")
    gpfl_lambda: float = key(0.01, "lambda: weight of the magnitude-level guidance ||f_G - e_y||",
                             "GPFL (ICCV 2023) authors' code, system/run_me.sh: -lam 0.01 for CNN and MLP nets")
    gpfl_mu: float = key(0.1, "mu: weight decay of the GCE and CoV parameters",
                         "GPFL (ICCV 2023) authors' code, system/run_me.sh: -mu 0.1 for CNN and MLP nets")
    new_client_epochs: int = key(20, "epochs a new client trains its head on the frozen rest",
                                 "PeFLL (ICLR 2024) App. A.2: a new client's head trained locally for 20 epochs")

    def validate(self) -> None:
        super().validate()
        check_own_keys(self, {"gpfl_lambda": "a finite number >= 0", "gpfl_mu": "a finite number >= 0"})


class GPFL(PrivateState, _GlobalModel):
    name = "gpfl"
    individual_reads = ""  # under --secagg the mean of the shared parts from the cohort's sums
    paper = "GPFL: Zhang et al., ICCV 2023"
    new_client_protocol = "a fresh head trained new_client_epochs on the frozen extractor, CoV and GCE"
    config = GPFLConfig
    dp_unit = None
    not_distributed = "its GPFL local steps run in one process (no sharding of the cohort across ranks)"
    search_space = {"lr": "log:1e-3:1", "gpfl_lambda": "log:1e-4:1", "gpfl_mu": "choice:0,0.1,1"}
    search_space_source = ("Zhang et al., GPFL (ICCV 2023), the authors' run script: lambda from 1e-4 to "
                           "0.01 and mu in {0, 0.1, 1} across nets")
    tune_group = "train"

    @classmethod
    def floats_per_client_round(cls, arch: dict) -> int:
        from pfl_cli.algorithms.gpfl_net import GPFLNet

        from pfl_cli.fl.split import split_names
        from pfl_cli.models import build

        net = GPFLNet(build(arch["client"]), int(arch["client"]["num_classes"]))
        _, head = split_names(net.net, cls.name)
        private = {f"net.{k}" for k in head}
        return 2 * sum(p.numel() for k, p in net.named_parameters() if k not in private)

    def build(self) -> None:
        from pfl_cli.algorithms.gpfl_net import GPFLNet

        from pfl_cli.fl.split import split_names

        from pfl_cli.algorithms.base import seeded

        net = self.client_net()
        # CoV and GCE draw their initialization from a named stream of --seed, as the client net does
        self.net = seeded(self.cfg.seed, "init-gpfl-cov-gce", lambda: GPFLNet(net, self.store.num_classes))
        _, head = split_names(self.net.net, self.name)
        init = {k: v.detach().clone() for k, v in self.net.named_parameters()}
        self.head = [f"net.{k}" for k in head]
        self.shared = [k for k in init if k not in set(self.head)]
        self.global_params = {k: init[k] for k in self.shared}
        self.init_head = {k: init[k] for k in self.head}
        self.private = self.new_private_state(self.init_head)

    def _contexts(self, clients) -> dict:
        """Each client's conditional inputs from the global GCE: name -> (c, d)."""
        from pfl_cli.fl.heads import class_counts

        generic, personal = conditional_inputs(self.global_params["gce.weight"], class_counts(self.store, clients))
        return {CONTEXT_P: personal, CONTEXT_G: generic.unsqueeze(0).expand(len(clients), -1).clone()}

    def _steps(self, start: dict, clients, gen, *, trainable, personal_only=False, **schedule):
        steps, taken = self.draw_batches(clients, gen, **schedule)
        cfg = self.cfg
        theta, loss = gpfl_steps(self.net, start, self._contexts(clients), self.store, steps, trainable=trainable,
                                 lam=float(cfg.gpfl_lambda), mu=float(cfg.gpfl_mu), sgd=self.sgd_update_options(),
                                 personal_only=personal_only)
        return theta, loss, taken

    def run_round(self, t, cohort, gen):
        start = {**stack(self.global_params, len(cohort)), **self.private.gather(cohort)}
        theta, loss, _ = self._steps(start, cohort, gen, trainable=list(start), **self.round_schedule())
        shared = {k: theta[k] for k in self.shared}
        self.record_exchange(self.global_params, shared, len(cohort))
        self.global_params = self.server_average(cohort_mean(self.store, cohort, shared, secagg=self.cfg.secagg))
        self.private.scatter(cohort, {k: theta[k] for k in self.head})
        return loss

    def own_models(self, rows):
        return {**stack(self.global_params, len(rows)), **self.private.gather(rows), **self._contexts(rows)}

    def new_clients(self, clients: np.ndarray, gen) -> dict:
        """The initial head trained ``new_client_epochs`` epochs, everything else frozen."""
        start = {**self.global_params, **self.init_head}

        def build(sel):
            if not self.cfg.new_client_epochs:
                return {**stack(start, len(sel)), **self._contexts(sel)}
            theta, _, taken = self._steps(stack(start, len(sel)), sel, gen, trainable=self.head, personal_only=True,
                                          epochs=self.cfg.new_client_epochs)
            self.client_sgd_steps += taken
            return {**theta, **self._contexts(sel)}

        if not len(clients):
            return {**stack(start, 0), CONTEXT_P: self.net.context_p.unsqueeze(0)[:0],
                    CONTEXT_G: self.net.context_g.unsqueeze(0)[:0]}
        return self.chunked(np.asarray(clients, dtype=np.int64), build)

    def protocol(self, new: bool) -> dict:
        return epochs_protocol(new, self.cfg.new_client_epochs,
                               "its own head on the global extractor, CoV and GCE",
                               "a fresh head trained {e} epochs on the frozen rest",
                               "the initial head")
