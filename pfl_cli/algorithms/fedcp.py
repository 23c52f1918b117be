"""FedCP (Zhang, Hua, Wang, Song, Xue, Ma, Guan, KDD 2023): separating feature information by a conditional policy.

Every client's model is the client net's feature extractor f and its own (personalized) head h^p, plus
two shared parts: the conditional policy network (CPN) and a frozen global head h^g. For a sample x
with features h = f(x), the CPN reads the conditional input h * v_i (v_i, a client-specific vector:
the l2-normalized sum of the rows of the personalized head's weight, taken at the start of the round)
and makes the policy {r, s}, two masks over the d features with r + s = 1: the CPN (Linear(d, 2d),
LayerNorm, ReLU) gives two scores per feature and a Gumbel-Softmax with temperature tau turns them
into r (personalized share) and s (global share). The output is

    h^p(h * r) + h^g(h * s)

with h^g frozen during local training. The local loss adds to the cross-entropy lambda times MMD^2
between the features of f and those of the global feature extractor the client received (frozen),
on the same batch (:func:`pfl_cli.fl.mmd.mmd2`, a sum of RBF kernels). f, the CPN and h^p are trained
together by the client optimizer.

The server averages f and the CPN weighted by client data size, and makes the next global head the
size-weighted mean of the clients' 0.5 h^p + 0.5 h^g (h^g the global head the client received): the
authors' code (``clientcp.py`` ``generate_upload_head``, ``servercp.py`` ``global_head``), so the
global head moves halfway to the mean personalized head each round. Exchanged per cohort client and round:
f, the CPN and the global head down, f, the CPN and the personalized head up:
2 x (|client net| + |CPN|) floats.

Departures from PFLlib (``clientcp.py``, ``servercp.py``, which are also the authors' code):
- The global head: pflx averages 0.5 h^p + 0.5 h^g as the authors' code does (above; until issue 39
  pflx averaged h^p alone, which on the conformance task scored the figures in
  docs/performance/conformance.md, "FedCP's global head"). The paper's text could not be consulted
  from the session that made the change; the authors' code is the reference it follows. Under partial
  participation PFLlib hands the new global head (and CPN) to the cohort only, so a client selected
  later trains against the head of its own last round; pflx's cohort receives the current global head.
- PFLlib draws v_i uniformly at random before a client's first round (its ``context`` starts as
  ``torch.rand``) and from the personalized head afterwards; pflx takes v_i from the personalized
  head from the first round on.
- PFLlib draws Gumbel noise at test time as well; pflx predicts with the noise-free policy
  softmax(scores / tau), so a client's predictions are deterministic. Training draws the noise from
  the round's generator (resume is byte-identical).

A new client: the global extractor, CPN and global head, and a personalized head that starts as the
global head and is trained ``new_client_epochs`` epochs on its own data with everything else frozen
(cross-entropy: the MMD term does not depend on the head); with 0 it is served the global head as
its personalized head.

Defaults: lambda = 5 (the authors' run script, ``system/run_me.sh`` of the official code: ``-lam 5``;
PFLlib's default is 1) and tau = 1 with soft (not hard) Gumbel-Softmax (the authors' code).
DP: none (``--dp`` is refused).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial

import numpy as np

from pfl_cli.algorithms.base import PrivateState, epochs_protocol
from pfl_cli.algorithms.fedavg import FedAvgRoundConfig
from pfl_cli.algorithms.partial import _GlobalModel
from pfl_cli.fl.config import check_own_keys, key
from pfl_cli.fl.params import stack, weighted_mean
from pfl_cli.fl.secagg import cohort_mean

CPN, HEAD_G = "cpn.", "head_g."


def __getattr__(name: str):  # the policy lives beside the net, with torch
    if name in ("CONTEXT", "conditional_policy"):
        from pfl_cli.algorithms import fedcp_net

        return getattr(fedcp_net, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def gumbel_noise(dim: int, mask, gen):
    """Standard Gumbel draws (c, b, 2, dim) for a step's batch (``mask`` (c, b)), from CPU ``gen``."""
    import torch

    e = torch.empty((*mask.shape, 2, dim)).exponential_(generator=gen).clamp_min_(1e-20)
    return (-e.log()).to(mask.device)


def client_vector(head_weight):
    """v_i: the l2-normalized sum of the personalized head's rows, (..., C, d) -> (..., d)."""
    import torch.nn.functional as F

    return F.normalize(head_weight.sum(-2), dim=-1)


def fedcp_steps(model: FedCPNet, params: dict, base: dict, context, store, steps, *, trainable: list[str],
                lam: float, sgd: dict):
    """The cohort's FedCP local steps (``vmap``); returns (params, each client's mean loss).

    ``params`` name -> (c, ...): the whole FedCPNet; ``base`` the global feature extractor (``net.*``
    of the extractor, (c, ...), frozen) whose features the MMD term compares with; ``context`` (c, d)
    v_i; ``steps`` :class:`~pfl_cli.fl.batches.LocalSteps` with a Gumbel draw per step.
    ``lam`` = 0 drops the MMD term (and the global extractor's forward).
    """
    from pfl_cli.algorithms.fedcp_net import CONTEXT
    from pfl_cli.models.util import FeatureView
    import torch

    from torch.func import functional_call, vmap

    from pfl_cli.fl.batches import ActiveMean
    from pfl_cli.fl.cohort import _masked_mean_loss, sgd_update_
    from pfl_cli.fl.mmd import mmd2

    forward = vmap(lambda p, x, z: functional_call(model, p, (x, z), {"parts": True}))
    features = vmap(lambda p, x: functional_call(FeatureView(model.net), p, (x,)))  # the MMD term's global extractor
    theta = {k: v.detach().clone() for k, v in params.items()}
    buffers = {CONTEXT: context}
    buf = {k: torch.zeros_like(theta[k]) for k in trainable} if sgd.get("momentum") else {}
    mean_loss = ActiveMean(steps.num_clients, context.device)
    for idx, m, go, noise in steps:
        moving = {k: theta[k].requires_grad_(True) for k in trainable}
        x = store.inputs(idx)
        logits, h = forward({**theta, **buffers}, x, noise)
        loss = _masked_mean_loss(logits, store.y[idx], m)
        if lam:
            with torch.no_grad():
                h_g = features(base, x)
            loss = loss + lam * mmd2(h, h_g, m)
        grads = dict(zip(moving, torch.autograd.grad(loss.sum(), list(moving.values()))))
        for k in trainable:
            theta[k] = theta[k].detach()
        sgd_update_({k: theta[k] for k in trainable}, grads, buf, **sgd, active=go)
        mean_loss.add(loss.detach(), go)
    return theta, mean_loss.mean()


@dataclass(frozen=True)
class FedCPConfig(FedAvgRoundConfig):
    """FedCP's keys: FedAvg's round, the MMD weight, the policy's temperature and the new-client protocol."""

    algorithm: str = key("fedcp", "the algorithm these keys configure")
    fedcp_lambda: float = key(5.0, "lambda: weight of MMD^2 between the local and the global extractor's features",
                              "FedCP (KDD 2023) authors' code, system/run_me.sh: -lam 5")
    fedcp_tau: float = key(1.0, "tau: temperature of the policy's Gumbel-Softmax",
                           "FedCP (KDD 2023) authors' code, clientcp.py: tau = 1, soft (hard=False)")
    new_client_epochs: int = key(20, "epochs a new client trains its personalized head (from the global head), "
                                     "the rest frozen",
                                 "PeFLL (ICLR 2024) App. A.2: a new client's head trained locally for 20 epochs")

    def validate(self) -> None:
        super().validate()
        check_own_keys(self, {"fedcp_lambda": "a finite number >= 0", "fedcp_tau": "a finite number > 0",
                              "new_client_epochs": "an integer >= 0"})


class FedCP(PrivateState, _GlobalModel):
    name = "fedcp"
    individual_reads = ""  # under --secagg the mean of the uploads from the cohort's sums
    paper = "FedCP: Zhang et al., KDD 2023"
    new_client_protocol = "the global head as its personalized head, trained new_client_epochs on the frozen rest"
    config = FedCPConfig
    dp_unit = None
    not_distributed = "its policy-gated local steps run in one process (no sharding of the cohort across ranks)"
    search_space = {"lr": "log:1e-3:1", "fedcp_lambda": "choice:0,1,5,10"}
    search_space_source = ("Zhang et al., FedCP (KDD 2023): the client lr per dataset and the MMD weight lambda "
                           "(the authors' run script: 5; PFLlib's default: 1)")
    tune_group = "train"

    @classmethod
    def floats_per_client_round(cls, arch: dict) -> int:
        from pfl_cli.algorithms.fedcp_net import FedCPNet

        from pfl_cli.models import build, num_parameters

        net = FedCPNet(build(arch["client"]))
        cpn = sum(p.numel() for p in net.cpn.parameters())
        # f + CPN + the global head down; f + CPN + the personalized head up (the heads have one shape)
        return 2 * (num_parameters(arch["client"]) + cpn)

    def build(self) -> None:
        from pfl_cli.algorithms.fedcp_net import FedCPNet

        from pfl_cli.algorithms.base import seeded
        from pfl_cli.fl.split import split_names

        net = self.client_net()
        # the CPN draws its initialization from a named stream of --seed, as the client net does
        self.net = seeded(self.cfg.seed, "init-fedcp-cpn", lambda: FedCPNet(net, float(self.cfg.fedcp_tau)))
        body, head = split_names(self.net.net, self.name)
        init = {k: v.detach().clone() for k, v in self.net.named_parameters()}
        self.extractor = [f"net.{k}" for k in body]
        self.head = [f"net.{k}" for k in head]
        self.cpn = [k for k in init if k.startswith(CPN)]
        self.shared = [k for k in init if k not in set(self.head)]
        self.global_params = {k: init[k] for k in self.shared}  # f, CPN and h^g (h^g starts as the net's head)
        self.private = self.new_private_state({k: init[k] for k in self.head})
        # h^g's parameter of each personalized-head parameter (the same layer: head_g.weight <-> net.fcL.weight)
        self.pairs = {f"{HEAD_G}{k.rsplit('.', 1)[1]}": k for k in self.head}
        self.weight_key = self.pairs[f"{HEAD_G}weight"]

    def _context(self, theta: dict):
        return client_vector(theta[self.weight_key])

    def _steps(self, start: dict, clients, gen, *, trainable, lam: float, **schedule):
        steps, taken = self.draw_batches(clients, gen, **schedule)
        steps = steps.with_draws((partial(gumbel_noise, self.net.dim), gen))
        base = {k: start[k] for k in self.extractor}
        theta, loss = fedcp_steps(self.net, start, base, self._context(start), self.store, steps,
                                  trainable=trainable, lam=lam, sgd=self.sgd_update_options())
        return theta, loss, taken

    def run_round(self, t, cohort, gen):
        start = {**stack(self.global_params, len(cohort)), **self.private.gather(cohort)}
        trainable = self.extractor + self.cpn + self.head
        theta, loss, _ = self._steps(start, cohort, gen, trainable=trainable, lam=float(self.cfg.fedcp_lambda),
                                     **self.round_schedule())
        up = {k: theta[k] for k in trainable}
        self.record_exchange(self.global_params, up, len(cohort))
        if self.cfg.secagg:  # from the cohort's sums of copies (each client keeps its own head for its next round)
            mean = cohort_mean(self.store, cohort, {k: v.clone() for k, v in up.items()}, secagg=True)
        else:
            mean = weighted_mean(self.store, cohort, up)
        # the next global head: the size-weighted mean of the uploads 0.5 h^p_i + 0.5 h^g (the authors' code,
        # clientcp.py generate_upload_head; servercp.py global_head), h^g the global head the cohort received
        head = {g: 0.5 * mean[p] + 0.5 * self.global_params[g] for g, p in self.pairs.items()}
        self.global_params = self.server_average({**{k: mean[k] for k in self.extractor + self.cpn}, **head})
        self.private.scatter(cohort, {k: theta[k] for k in self.head})
        return loss

    def _served(self, theta: dict) -> dict:
        from pfl_cli.algorithms.fedcp_net import CONTEXT
        return {**theta, CONTEXT: self._context(theta)}

    def own_models(self, rows):
        return self._served({**stack(self.global_params, len(rows)), **self.private.gather(rows)})

    def new_clients(self, clients: np.ndarray, gen) -> dict:
        """The global head as the personalized head, trained ``new_client_epochs`` epochs, the rest frozen."""
        from pfl_cli.algorithms.fedcp_net import CONTEXT
        start = {**self.global_params, **{p: self.global_params[g] for g, p in self.pairs.items()}}
        if not len(clients):
            return {**stack(start, 0), CONTEXT: self.net.context.unsqueeze(0)[:0]}
        if not self.cfg.new_client_epochs:
            return self._served(stack(start, len(clients)))

        def build(sel):
            theta, _, taken = self._steps(stack(start, len(sel)), sel, gen, trainable=self.head, lam=0.0,
                                          epochs=self.cfg.new_client_epochs)
            self.client_sgd_steps += taken
            return self._served(theta)

        return self.chunked(np.asarray(clients, dtype=np.int64), build)

    def protocol(self, new: bool) -> dict:
        return epochs_protocol(new, self.cfg.new_client_epochs,
                               "its own personalized head with the global extractor, CPN and global head",
                               "the global head as its personalized head, trained {e} epochs on the frozen rest",
                               "the global head as its personalized head")
