"""FedDBE (Zhang, Hua, Cao, Wang, Song, Xue, Ma, Guan, NeurIPS 2023): FedAvg with the Domain Bias Eliminator.

Two parts on top of FedAvg, the paper's PRBM and MR:

- PRBM, the personalized representation bias memory: a vector z_i^p of the representation's size on
  every client, added to the feature extractor's output before the classifier, h(f(x) + z_i^p). It is
  trained with the model and never leaves the client; the model itself (f and h) is FedAvg's.
- MR, mean regularization: the local loss adds kappa * mean(0.5 (zbar_i - zbar^g)^2), zbar_i the
  client's running mean of f(x) over its local steps (momentum ``dbe_momentum``, reset every round)
  and zbar^g the global consensus: the size-weighted mean of the clients' zbar_i, computed once, in an
  initialization period before the first round where every train client trains the initial model
  for one round without DBE (the authors' code, ``serverDBE.py``, does this once and uploads
  nothing more afterwards).

Exchanged: the whole model down and up every round (2 x |client net|), plus once, in the
initialization period, each train client's zbar_i up and zbar^g down (2 x d floats per train
client, recorded in the traffic ledger of the first round). A train client's model is the global
one with its own z_i^p. A new client: z^p from zero trained ``new_client_epochs`` epochs with the
global model frozen (pflx's protocol for a private part; MR does not depend on z^p).

Defaults: kappa = 50 and momentum 1 (zbar_i is the last batch's mean), the authors' run script
(``system/run_me.sh`` of the official code: ``-mo 1 -klw 50``); PFLlib's defaults are kappa = 0 and
momentum 0.1.
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

NET = "net."
PRBM = "prbm"


def dbe_steps(model: DBENet, params: dict, store, steps, global_mean, *, trainable: list[str], kappa: float,
              momentum: float, sgd: dict):
    """The cohort's local steps with MR (``global_mean`` (d,), or None: the initialization period, CE only).

    Returns ``(params, running_mean (c, d), loss (c,))``: zbar_i starts at zero (reset each round, as
    the authors' code) and moves by ``momentum`` towards each step's mean representation of the
    client's real samples, the gradient flowing through the current step's mean only.
    """
    import torch

    from torch.func import functional_call, vmap

    from pfl_cli.fl.batches import ActiveMean
    from pfl_cli.fl.cohort import _masked_mean_loss, sgd_update_

    forward = vmap(lambda p, x: functional_call(model, p, (x,), {"parts": True}))
    theta = {k: v.detach().clone() for k, v in params.items()}
    moving = {k: theta[k] for k in trainable}
    buf = {k: torch.zeros_like(v) for k, v in moving.items()} if sgd.get("momentum") else {}
    c = steps.num_clients
    device = next(iter(theta.values())).device
    running = torch.zeros(c, model.prbm.shape[0], device=device)
    mean_loss = ActiveMean(c, device)
    for idx, m, go in steps:
        for v in moving.values():
            v.requires_grad_(True)
        logits, h = forward(theta, store.inputs(idx))
        y = store.y[idx]
        loss = _masked_mean_loss(logits, y, m)
        w = m.unsqueeze(-1)
        batch_mean = (h * w).sum(1) / w.sum(1).clamp_min(1.0)
        new_running = (1.0 - momentum) * running + momentum * batch_mean
        if global_mean is not None:
            loss = loss + kappa * (0.5 * (new_running - global_mean) ** 2).mean(-1)
        grads = dict(zip(moving, torch.autograd.grad(loss.sum(), list(moving.values()))))
        for v in moving.values():
            v.requires_grad_(False)
        sgd_update_(moving, grads, buf, **sgd, active=go)
        new_running = new_running.detach()
        running = new_running if go is None else torch.where(go[:, None], new_running, running)
        mean_loss.add(loss.detach(), go)
    return {k: v.detach() for k, v in theta.items()}, running, mean_loss.mean()


@dataclass(frozen=True)
class FedDBEConfig(FedAvgRoundConfig):
    """FedDBE's keys: FedAvg's round and DBE's two constants."""

    algorithm: str = key("feddbe", "the algorithm these keys configure")
    dbe_kappa: float = key(50.0, "kappa: weight of the mean regularization (MR) in the local loss",
                           "FedDBE (NeurIPS 2023) authors' code, system/run_me.sh: -klw 50")
    dbe_momentum: float = key(1.0, "momentum of a client's running mean representation (1: the step's mean)",
                              "FedDBE (NeurIPS 2023) authors' code, system/run_me.sh: -mo 1")
    new_client_epochs: int = key(20, "epochs a new client trains its representation bias, the model frozen",
                                 "PeFLL (ICLR 2024) App. A.2: new clients of the baselines train 20 local epochs")

    def validate(self) -> None:
        super().validate()
        check_own_keys(self, {"dbe_kappa": "a finite number >= 0", "dbe_momentum": "a number in (0, 1]",
                              "new_client_epochs": "an integer >= 0"})


class FedDBE(PrivateState, _GlobalModel):
    name = "feddbe"
    individual_reads = ""  # under --secagg the mean of the models and the consensus zbar^g from sums
    paper = "FedDBE: Zhang et al., NeurIPS 2023"
    new_client_protocol = "its representation bias trained new_client_epochs on the frozen global model"
    config = FedDBEConfig
    dp_unit = None
    not_distributed = "its initialization period and DBE local steps run in one process"
    search_space = {"lr": "log:1e-3:1", "dbe_kappa": "log:0.1:100"}
    search_space_source = ("Zhang et al., FedDBE (NeurIPS 2023): the client lr per dataset and the MR "
                           "weight kappa (the authors' run script: 50)")
    tune_group = "train"

    @classmethod
    def floats_per_client_round(cls, arch: dict) -> int:
        from pfl_cli.models import num_parameters

        return 2 * num_parameters(arch["client"])  # every round; the one-time consensus is 2d per train client

    def build(self) -> None:
        from pfl_cli.algorithms.feddbe_net import DBENet

        self.net = DBENet(self.client_net())
        init = {k: v.detach().clone() for k, v in self.net.named_parameters()}
        self.shared = [k for k in init if k.startswith(NET)]
        self.global_params = {k: init[k] for k in self.shared}
        self.init_private = {PRBM: init[PRBM]}
        self.global_mean = None  # zbar^g, set by the initialization period
        self.private = self.new_private_state(self.init_private)

    def _steps(self, start, clients, gen, *, trainable, mean, **schedule):
        steps, taken = self.draw_batches(clients, gen, **schedule)
        cfg = self.cfg
        theta, running, loss = dbe_steps(self.net, start, self.store, steps, mean, trainable=trainable,
                                         kappa=float(cfg.dbe_kappa), momentum=float(cfg.dbe_momentum),
                                         sgd=self.sgd_update_options())
        return theta, running, loss, taken

    def _initialize(self, gen) -> None:
        """The initialization period: every train client with labels trains the initial model once without
        DBE; the server's consensus zbar^g is the size-weighted mean of their running means."""
        import torch

        from pfl_cli.fl.store import ROLE_TRAIN

        store = self.store
        clients = store.clients(ROLE_TRAIN)
        clients = clients[store.labeled[clients]]
        sums, total, rows = None, 0.0, []
        start = {**self.global_params, **self.init_private}
        for lo in range(0, len(clients), 64):
            sel = torch.as_tensor(clients[lo:lo + 64], device=self.device)
            _, running, _, _ = self._steps(stack(start, len(sel)), sel, gen, trainable=self.shared, mean=None,
                                           **self.round_schedule())
            self.traffic.receive("feature_mean", running)
            size = store.fit.length[sel].to(running.dtype)
            if self.cfg.secagg:  # each client's n_i zbar_i and n_i, summed securely over all train clients below
                rows.append((running * size[:, None], size))
                continue
            part = (running * size[:, None]).sum(0)
            sums = part if sums is None else sums + part
            total += float(size.sum())
        if self.cfg.secagg:
            from pfl_cli.fl.secagg import WEIGHT, secure_sum

            summed = secure_sum({"zbar": torch.cat([r for r, _ in rows]), WEIGHT: torch.cat([n for _, n in rows])})
            sums, total = summed.total()["zbar"], float(summed.total()[WEIGHT])
        self.global_mean = sums / max(total, 1.0)
        self.traffic.send("global_mean", self.global_mean, copies=len(clients))

    def run_round(self, t, cohort, gen):
        if self.global_mean is None:
            self._initialize(gen)
        start = {**stack(self.global_params, len(cohort)), **self.private.gather(cohort)}
        theta, _, loss, _ = self._steps(start, cohort, gen, trainable=list(start), mean=self.global_mean,
                                        **self.round_schedule())
        model = {k: theta[k] for k in self.shared}
        self.record_exchange(self.global_params, model, len(cohort))
        self.global_params = self.server_average(cohort_mean(self.store, cohort, model, secagg=self.cfg.secagg))
        self.private.scatter(cohort, {PRBM: theta[PRBM]})
        return loss

    def own_models(self, rows):
        return {**stack(self.global_params, len(rows)), **self.private.gather(rows)}

    def new_clients(self, clients: np.ndarray, gen) -> dict:
        """z^p from zero trained ``new_client_epochs`` epochs (cross-entropy; the model frozen)."""
        start = {**self.global_params, **self.init_private}
        if not self.cfg.new_client_epochs or not len(clients):
            return stack(start, len(clients))

        def build(sel):
            theta, _, _, taken = self._steps(stack(start, len(sel)), sel, gen, trainable=[PRBM], mean=None,
                                             epochs=self.cfg.new_client_epochs)
            self.client_sgd_steps += taken
            return theta

        return self.chunked(np.asarray(clients, dtype=np.int64), build)

    def protocol(self, new: bool) -> dict:
        return epochs_protocol(new, self.cfg.new_client_epochs,
                               "the global model with its own representation bias",
                               "its representation bias trained {e} epochs on the frozen global model",
                               "the global model (zero representation bias)")

    def _consensus(self) -> dict:
        """zbar^g and whether it is set (fixed shapes: a checkpoint is checked against a fresh run's state)."""
        import torch

        d = self.net.prbm.numel()
        mean = torch.zeros(d) if self.global_mean is None else self.global_mean.detach().cpu().clone()
        return {"global_mean": mean, "ready": torch.tensor(self.global_mean is not None)}

    def _load_consensus(self, consensus: dict) -> None:
        ready = bool(consensus["ready"])
        self.global_mean = consensus["global_mean"].to(self.device) if ready else None

    def state(self):
        return {**super().state(), "consensus": self._consensus()}

    def load_state(self, state):
        super().load_state(state)
        self._load_consensus(state["consensus"])

    def weights(self):
        return {**super().weights(), "consensus": self._consensus()}

    def load_weights(self, weights):
        super().load_weights(weights)
        self._load_consensus(weights["consensus"])
