"""FedAS (Yang, Huang, Ye, CVPR 2024): federated parameter alignment and client synchronization.

Every client keeps its whole model (the client net's body f and head h); the body is shared. A cohort
client, in a round:

1. Parameter alignment: it computes its class prototypes with its own (previous) body, p_c, the mean
   of f_local(x) over its samples of class c, and trains the global body it receives
   ``fedas_align_epochs`` epochs (batches of ``fedas_align_batch``, plain SGD at ``fedas_align_lr``) so
   that its features of class c come close to p_c: the loss of a batch is
   sum_c mean_{x of class c} ||f(x) - p_c||^2 / d (the global parameters "learn from the previous
   model", made consistent with the client's own head). The aligned body replaces the client's body.
2. Local training of the whole model (aligned body and its own head) on cross-entropy, FedAvg's schedule.
3. Client synchronization: it uploads its body and F_i, the trace of its empirical Fisher information
   at the trained model: one pass over its data in batches of ``batch_size``, summing
   ||grad of the batch's mean negative log-likelihood||^2 over every parameter (the authors' estimate).
   The server averages the bodies with weights F_i / sum_j F_j, so clients whose parameters carry
   little information (under-trained stragglers) weigh little in the global body.

Exchanged per cohort client and round: the global body down, its body and F_i up: 2 |body| + 1 floats.
A train client is served its own model (the aligned body it trained and its head). A new client has
no previous model to align with: it gets the global body with the initial head trained
``new_client_epochs`` epochs on its data, the body frozen (pflx's protocol for a private head).

Defaults: alignment with plain SGD at lr 0.01, one epoch, batches of 16 (the authors' code,
``system/flcore/clients/clientas.py`` of the official repository, ``set_parameters``; PFLlib's FedAS is
the same code). The paper's full text was not at hand when this module was written: the method
follows the paper's abstract (alignment of the shared parameters to local knowledge from the previous
model; an aggregation that keeps under-trained knowledge out) and the authors' code. Differences from
that code: the code aggregates the whole model (the global head is never read by a client: pflx
exchanges the body only), and it computes F_i also on clients outside the cohort without using it
(pflx computes it for the cohort only); if every F_i of a cohort is 0 (no gradient at all), pflx
weighs the bodies by data size instead of dividing by zero. DP: none (``--dp`` is refused).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from pfl_cli.algorithms.base import PrivateState, epochs_protocol, require_features
from pfl_cli.algorithms.fedavg import FedAvgRoundConfig
from pfl_cli.algorithms.partial import _GlobalModel
from pfl_cli.fl.config import check_own_keys, key
from pfl_cli.fl.params import stack


def _features_fn(net, body: list[str]):
    """One client's representation f(x) from its body parameters (``vmap``-able)."""
    from torch.func import functional_call

    from pfl_cli.models.util import FeatureView

    view = FeatureView(net)
    return lambda p, x: functional_call(view, {f"net.{k}": v for k, v in p.items() if k in body}, (x,))


def alignment_loss(h, y, mask, prototypes):
    """FedAS's alignment loss of a batch: sum_c mean_{j: y_j = c} ||h_j - p_c||^2 / d, per client.

    ``h`` (c, b, d) features of the global body, ``y`` (c, b) labels (-1: none), ``mask`` (c, b) real
    samples, ``prototypes`` (c, C, d) the client's class means from its own body. Returns (c,).
    """
    import torch

    real = (mask > 0) & (y >= 0)
    hot = torch.nn.functional.one_hot(y.clamp_min(0), prototypes.shape[1]).to(h.dtype) * real.unsqueeze(-1)
    n = hot.sum(1)                                                                  # (c, C) in the batch
    target = torch.gather(prototypes, 1, y.clamp_min(0).unsqueeze(-1).expand(-1, -1, h.shape[-1]))
    err = ((h - target) ** 2).mean(-1)                                              # (c, b): ||.||^2 / d
    per_sample = 1.0 / torch.gather(n, 1, y.clamp_min(0)).clamp_min(1.0)            # 1 / n_{y_j}
    return (err * per_sample * real).sum(1)


def fisher_trace(model, params: dict, store, batches):
    """Each client's empirical Fisher trace: sum over ``batches`` of ||grad_theta mean NLL(batch)||^2.

    ``params`` name -> (c, ...) every parameter of the client net; ``batches`` yields (index, mask,
    active) (one epoch of :class:`~pfl_cli.fl.batches.CohortBatches`). Returns (c,) float64.
    """
    import torch

    from torch.func import functional_call, vmap

    from pfl_cli.fl.cohort import _masked_mean_loss

    forward = vmap(lambda p, x: functional_call(model, p, (x,)))
    theta = {k: v.detach().requires_grad_(True) for k, v in params.items()}
    total = torch.zeros(next(iter(params.values())).shape[0], dtype=torch.float64,
                        device=next(iter(params.values())).device)
    for idx, m, go in batches:
        loss = _masked_mean_loss(forward(theta, store.inputs(idx)), store.y[idx], m)
        # clients' losses are independent: the gradient of their sum is every client's own gradient
        grads = torch.autograd.grad(loss.sum(), list(theta.values()))
        sq = sum(g.detach().flatten(1).to(torch.float64).pow(2).sum(1) for g in grads)
        total += sq if go is None else sq * go.to(sq.dtype)
    return total


def fisher_weights(fim, sizes):
    """The aggregation weights F_i / sum_j F_j (data-size weights if every F_i is 0)."""
    import torch

    fim = fim.to(torch.float64)
    if float(fim.sum()) > 0:
        return fim / fim.sum()
    sizes = sizes.to(torch.float64)
    return sizes / sizes.sum().clamp_min(1.0)


def fisher_mean_secure(fim, sizes, shared: dict) -> dict:
    """The mean of :func:`fisher_weights` from the cohort's secure sums only (``--secagg``, issue 48 item 1).

    Client i sends ``F_i theta_i``, ``F_i``, ``n_i theta_i`` and ``n_i`` (its own Fisher trace and fit size); the
    server learns their sums and takes ``sum F_i theta_i / sum F_i``, or the data-size mean if every F_i is 0
    (``sum F_i = 0``, F_i >= 0): the plain weighted mean to the float rounding of sum-then-divide.
    """
    import torch

    from pfl_cli.fl.secagg import secure_sum

    f, n = fim.to(torch.float64), sizes.to(torch.float64)
    col = lambda a, v: a.view(-1, *([1] * (v.dim() - 1)))  # noqa: E731
    rows = {**{f"F.{k}": col(f, v) * v.to(torch.float64) for k, v in shared.items()},
            **{f"n.{k}": col(n, v) * v.to(torch.float64) for k, v in shared.items()}, "F": f, "n": n}
    sums = secure_sum(rows, spent=({"fisher_trace": fim},)).total()
    by, total = ("F", sums["F"]) if float(sums["F"]) > 0 else ("n", sums["n"].clamp_min(1.0))
    return {k: (sums[f"{by}.{k}"] / total).to(v.dtype) for k, v in shared.items()}


@dataclass(frozen=True)
class FedASConfig(FedAvgRoundConfig):
    """FedAS's keys: FedAvg's round, the parameter alignment's optimizer, and the new-client protocol."""

    algorithm: str = key("fedas", "the algorithm these keys configure")
    fedas_align_lr: float = key(0.01, "step size of the parameter alignment (plain SGD on the global body)",
                                "FedAS (CVPR 2024) authors' code, clientas.py set_parameters: SGD lr = 0.01")
    fedas_align_epochs: int = key(1, "epochs of parameter alignment per round (0: the global body as received)",
                                  "FedAS (CVPR 2024) authors' code, clientas.py set_parameters: 1 epoch")
    fedas_align_batch: int = key(16, "batch size of the parameter alignment",
                                 "FedAS (CVPR 2024) authors' code, clientas.py set_parameters: batch_size = 16")
    new_client_epochs: int = key(20, "epochs a new client trains the initial head on the frozen global body",
                                 "PeFLL (ICLR 2024) App. A.2: a new client's head trained locally for 20 epochs")

    def validate(self) -> None:
        super().validate()
        check_own_keys(self, {"fedas_align_lr": "a finite number > 0", "fedas_align_epochs": "an integer >= 0",
                              "fedas_align_batch": "an integer >= 1", "new_client_epochs": "an integer >= 0"})


class FedAS(PrivateState, _GlobalModel):
    name = "fedas"
    individual_reads = ""  # under --secagg the Fisher-weighted mean from sums (fisher_mean_secure)
    paper = "FedAS: Yang, Huang, Ye, CVPR 2024"
    new_client_protocol = "the global body with the initial head trained new_client_epochs (body frozen)"
    config = FedASConfig
    dp_unit = None
    not_distributed = "its alignment, local steps and Fisher traces run in one process"
    search_space = {"lr": "log:1e-3:1", "fedas_align_lr": "log:1e-3:1e-1"}
    search_space_source = ("Yang, Huang & Ye, FedAS (CVPR 2024): the client lr per dataset; the alignment's "
                           "step (the authors' code: 0.01)")
    tune_group = "train"

    @classmethod
    def floats_per_client_round(cls, arch: dict) -> int:
        from pfl_cli.fl.split import part_floats

        return 2 * part_floats(arch["client"], "body", cls.name) + 1  # the body down and up, F_i up

    def build(self) -> None:
        from pfl_cli.fl.split import split_names

        self.net = self.client_net()
        require_features(self, "FedAS's parameter alignment")
        self.body, self.head = split_names(self.net, self.name)
        init = {k: v.detach().clone() for k, v in self.net.named_parameters()}
        self.global_params = init                    # the body is shared; the head stays at its initialization
        self.init_head = {k: init[k] for k in self.head}
        self.private = self.new_private_state(init)  # every client's whole model (its previous one to align with)
        self.features = _features_fn(self.net, self.body)

    def global_model(self):
        """None: the server keeps the shared body only (its head stays at the initialization), never a model any
        client is scored with; each client's own whole model is the one FedAS serves."""
        return None

    def align(self, body: dict, local_body: dict, clients, gen) -> dict:
        """Parameter alignment of the stacked global ``body`` to each client's prototypes from ``local_body``."""
        import torch

        from torch.func import vmap

        from pfl_cli.fl.batches import CohortBatches
        from pfl_cli.fl.cohort import sgd_update_
        from pfl_cli.fl.prototypes import class_feature_sums

        cfg = self.cfg
        if not cfg.fedas_align_epochs:
            return body
        protos = class_feature_sums(self.features, local_body, self.store, clients).prototypes().to(
            next(iter(body.values())).dtype)
        forward = vmap(self.features)
        theta = {k: v.detach().clone() for k, v in body.items()}
        batches = CohortBatches(self.store.fit, clients, None, cfg.fedas_align_batch, gen,
                                epochs=cfg.fedas_align_epochs)
        for idx, m, go in batches:
            for v in theta.values():
                v.requires_grad_(True)
            loss = alignment_loss(forward(theta, self.store.inputs(idx)), self.store.y[idx], m, protos)
            grads = dict(zip(theta, torch.autograd.grad(loss.sum(), list(theta.values()))))
            for v in theta.values():
                v.requires_grad_(False)
            sgd_update_(theta, grads, {}, lr=float(cfg.fedas_align_lr), active=go)
        return {k: v.detach() for k, v in theta.items()}

    def run_round(self, t, cohort, gen):
        import torch

        from pfl_cli.fl.batches import CohortBatches

        local = self.private.gather(cohort)
        body = self.align(stack({k: self.global_params[k] for k in self.body}, len(cohort)),
                          {k: local[k] for k in self.body}, cohort, gen)
        theta, loss, _ = self.cohort_sgd({**body, **{k: local[k] for k in self.head}}, cohort, gen,
                                         **self.round_schedule())
        fim = fisher_trace(self.net, theta, self.store,
                           CohortBatches(self.store.fit, cohort, None, self.cfg.batch_size, gen, epochs=1))
        shared = {k: theta[k] for k in self.body}
        self.record_exchange({k: self.global_params[k] for k in self.body}, shared, len(cohort))
        self.traffic.receive("fisher_trace", fim)
        if self.cfg.secagg:  # sums only (pfl_cli.fl.secagg): each client weighs its own body by F_i (and n_i)
            self.global_params = self.server_average(fisher_mean_secure(fim, self.store.fit.length[cohort], shared))
        else:
            w = fisher_weights(fim, self.store.fit.length[cohort]).to(theta[self.body[0]].dtype)
            self.global_params = self.server_average({k: torch.einsum("c,c...->...", w, v) for k, v in shared.items()})
        self.private.scatter(cohort, theta)
        return loss

    def own_models(self, rows):
        return self.private.gather(rows)

    def new_clients(self, clients: np.ndarray, gen) -> dict:
        """The global body with the initial head trained ``new_client_epochs`` epochs, the body frozen."""
        start = {**{k: self.global_params[k] for k in self.body}, **self.init_head}
        if not self.cfg.new_client_epochs or not len(clients):
            return stack(start, len(clients))
        return self.train_clients(start, np.asarray(clients, dtype=np.int64), gen, epochs=self.cfg.new_client_epochs,
                                  trainable=set(self.head))

    def protocol(self, new: bool) -> dict:
        return epochs_protocol(new, self.cfg.new_client_epochs,
                               "its own model (the aligned body it trained and its head)",
                               "the global body with the initial head trained {e} epochs",
                               "the global body with the initial head")
