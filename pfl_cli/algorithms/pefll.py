"""PeFLL (Scott, Zakerinia, Lampert, ICLR 2024; thesis Alg. 7 and 8).

A server-side hypernetwork h(v; eta_h) maps a client descriptor v = mean_b phi(x_b, y_b; eta_v)
(the embedding network averaged over a batch of the client's data, thesis §4.3) to the client's
model theta = h(v). Training (Alg. 8, in the backward form of the authors' code):

1. each cohort client computes v on one batch and keeps the graph (steps 5-7);
2. the server generates theta_i = h(v_i) (step 8);
3. the clients run k local SGD steps on f_i and return delta_i = theta_new - theta (steps 10-11);
4. the server back-propagates -delta_i through h, giving the eta_h gradient and dv_i (step 12);
5. each client back-propagates dv_i through its cached descriptor graph into eta_v (step 14);
6. the server averages, adds the regularizer gradients 2 lambda_h eta_h and 2 lambda_v eta_v
   (lines 17-18), clips and takes an optimizer step (Adam by default, as the authors' code).

Only first-order VJPs are needed (footnote 2). Prediction for any client (Alg. 7) is one
descriptor and one hypernetwork forward pass: no optimizer step anywhere.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import numpy as np

from pfl_cli.algorithms.base import (BACKBONE_KEYS, GENERATED_NETS, GENERATED_WEIGHTS, Algorithm, ServerOptimizerState,
                                     descriptor_dim, model_arch_spec, seeded)
from pfl_cli.attack.protocol import Attackable
from pfl_cli.fl.config import EMBEDDINGS, EVAL_DESCRIPTORS, HYPER_SIZES, SERVER_OPTIMIZERS, TrainConfig, key
from pfl_cli.fl.params import cpu_state_dict


# Server step size and gradient clip per optimizer when not set: the authors' code runs Adam
# 2e-4 with clip 50; Alg. 8 lines 17-18 add the averaged client updates with step size 1, unclipped.
SERVER_DEFAULTS = {"adam": {"lr": 2e-4, "clip": 50.0}, "sgd": {"lr": 1.0, "clip": 0.0}}


@dataclass(frozen=True)
class PeFLLConfig(TrainConfig):
    """PeFLL's keys (Alg. 8), defaults from the thesis (§4.4, App. B.1.2) and the authors' code."""

    algorithm: str = key("pefll", "the algorithm these keys configure")
    rounds: int = key(5000, "communication rounds", "thesis §4.4: T = 5000 rounds")
    clients_per_round: Optional[int] = key(None, "cohort size (null: round(0.05 n) of all n clients, at least 1)",
                                           "thesis §4.4: 5% of the clients per round")
    # The headline is unmasked for every algorithm, as thesis Table 4.1 reports PeFLL (the authors' code masks by
    # default, mask-absent True; the label-masked numbers are Table B.4's, always reported beside it).
    label_mask: bool = key(False, "headline accuracy with classes absent from a client's train data masked out",
                           "thesis Table 4.1: PeFLL without label masking (LM: Table B.4)")
    eval_every: int = key(30, "rounds between evaluations (and checkpoints)", "PeFLL authors' code: eval-every 30")
    local_steps: int = key(50, "k: client SGD steps per round", "thesis §4.4: k = 50")
    lr: float = key(2e-3, "client SGD step size", "PeFLL authors' code: inner-lr 2e-3")
    momentum: float = key(0.9, "client SGD momentum", "thesis §4.4: SGD, batch 32, momentum 0.9")
    batch_size: int = key(32, "client minibatch size", "thesis §4.4: batch 32")
    server_optimizer: str = key("adam", "adam (the code) | sgd (Alg. 8 update rule)", "PeFLL authors' code: optim adam",
                                choices=SERVER_OPTIMIZERS)
    server_lr: Optional[float] = key(None, "server step (null: adam 2e-4; sgd 1, Alg. 8)",
                                     "PeFLL authors' code: lr 2e-4")
    server_momentum: float = key(0.0, "momentum of the sgd server optimizer")
    server_clip: Optional[float] = key(None, "clip of the server gradient (null: adam 50, sgd off; 0 = off)",
                                       "PeFLL authors' code: clip 50")
    lambda_h: float = key(1e-3, "Eq. (4.1) regularizer of the hypernetwork", "thesis App. B.1.2: lambda_h = 1e-3")
    lambda_v: float = key(1e-3, "Eq. (4.1) regularizer of the embedding net", "thesis App. B.1.2: lambda_v = 1e-3")
    lambda_theta: float = key(0.0, "Eq. (4.1) regularizer of the client model", "thesis App. B.1.2: lambda_theta = 0")
    embedding: str = key("auto", "embedding net: auto (lstm for text, cnn for images, mlp for vectors) | cnn | cnn-x "
                         "| linear | mlp | mlp-x | lstm | lstm-x", "PeFLL authors' code: embed-model cnn", choices=EMBEDDINGS)
    embed_dim: int = key(0, "descriptor dimension l (0 = int(1 + n / 4))",
                         "thesis App. B.1.2: l = n/4, as int(1 + n/4) in the code")
    hyper_size: str = key("M", "hypernetwork S / M / L = 1 / 3 / 5 hidden layers",
                          "PeFLL authors' code: hyper-nhid 3 (thesis Table B.5: M)", choices=HYPER_SIZES)
    hyper_hidden: int = key(100, "hypernetwork hidden width", "PeFLL authors' code: hyper-hid 100")
    descriptor_batch: int = key(32, "samples per training descriptor", "thesis §4.4: descriptor batch 32")
    eval_descriptor: str = key("all", "descriptor at evaluation: all train samples (code) | one batch (paper)",
                               "PeFLL authors' code", choices=EVAL_DESCRIPTORS)
    standardize_descriptor: bool = key(True, "the code's frozen scalar (v - m) / s from the first descriptor",
                                       "PeFLL authors' code: its frozen m, s")
    track_descriptors: bool = key(False, "log Spearman(descriptor, label-distribution distances) of holdout clients")

    def validate(self) -> None:
        super().validate()
        if self.server_momentum and self.server_optimizer != "sgd":
            from pfl_cli.fl.config import inert_refusal

            raise inert_refusal("server_momentum", self.algorithm, f"its server optimizer is {self.server_optimizer} "
                                "(server_momentum is the sgd server optimizer's: --set server_optimizer=sgd)",
                                self.server_momentum)

    def planned_cohort(self, num_clients: int | None = None) -> int | None:
        """``clients_per_round``, else round(0.05 n) of all n clients, at least 1 (thesis §4.4: 5% of the clients)."""
        if self.clients_per_round is not None or num_clients is None:
            return self.clients_per_round
        return max(1, round(0.05 * num_clients))

    def server_floats(self, client_floats: int) -> int:
        """The hypernetwork's floats: its hidden layer and its output head onto the client model."""
        return self.hyper_hidden * (self.hyper_hidden + client_floats + max(self.embed_dim, 1))


class PeFLL(ServerOptimizerState, Attackable, Algorithm):
    name = "pefll"
    # under --secagg (pfl_cli.fl.secagg)
    individual_reads = "each client's model delta, back-propagated through the hypernetwork at that client's own embedding"
    search_space = {
        "lr": "log:1e-3:3e-1",
        "lambda_theta": "choice:0,1e-5,1e-4,1e-3,3e-3",
        "lambda_h": "choice:0,1e-5,1e-3",
        "lambda_v": "choice:0,1e-5,1e-3",
        "embedding": "choice:auto,linear",
    }
    search_space_source = ("Scott et al., PeFLL (ICLR 2024) / thesis §4.4: client lr by grid search on validation "
                           "data; thesis App. B, Table B.6: lambda_theta x lambda_h = lambda_v over {0, 1e-5, 1e-3}; "
                           "embedding: thesis §4.4's linear label embedding as the alternative descriptor")
    tune_group = "new"
    paper = "PeFLL: Scott, Zakerinia, Lampert, ICLR 2024 / thesis ch. 4"
    new_client_protocol = "a model generated from its descriptor, no optimizer step (Alg. 7)"
    config = PeFLLConfig
    inert_keys = {**dict.fromkeys(BACKBONE_KEYS, GENERATED_NETS), "model_weights": GENERATED_WEIGHTS}
    serves_unlabeled = "pefll with --embedding cnn-x or mlp-x (label-free descriptors, Table 4.2)"
    # The run axis (pfl_cli.fl.stack): step 10 of a round is one plain cohort SGD call (:meth:`cohort_train`), so
    # runs that differ only in these keys train stacked in one process, their generated models' local SGD one
    # batched call per step over run x client rows; each run's descriptors, hypernetwork, backward and server
    # step (steps 5-9, 12-18) stay its own (lambda_h, lambda_v and the server step's keys act there only).
    stackable = True
    stack_keys = ("seed", "lr", "momentum", "lambda_theta", "client_clip", "server_lr", "server_momentum",
                  "server_clip", "lambda_h", "lambda_v")

    @property
    def needs_labels_to_predict(self) -> bool:
        return bool(self.embed.uses_labels)

    dp_unit = "client"
    dp_contribution = "server gradient of hypernetwork and embedding network"

    @staticmethod
    def check_dp_config(cfg) -> None:
        from pfl_cli.errors import ConfigError

        if cfg.standardize_descriptor:
            raise ConfigError("standardize_descriptor freezes the mean and std of one private client's descriptor "
                              "into the model, outside --dp's mechanism; pass --no-standardize-descriptor with --dp.")
        if not cfg.embed_dim:
            raise ConfigError("--embed-dim defaults to int(1 + clients / 4), which would put the private number of "
                              "clients into the model's shape; give it with --dp, e.g. --embed-dim 8.")

    @staticmethod
    def resolve_arch(cfg, store) -> dict:
        from pfl_cli.models import embedding_spec, hyper_spec

        text = {"vocab": getattr(store, "vocab_size", None), "lstm_hidden": cfg.lstm_hidden}  # LEAF's LSTM for text
        client = model_arch_spec(cfg, store)
        dim = descriptor_dim(cfg, store.num_clients)
        return {
            "client": client,
            # App. B.1.3: for Shakespeare "the LSTM model ... as the client model, and as the embedding network"
            "embedding": embedding_spec(cfg.embedding, store.input_shape, store.num_classes, dim, **text),
            "hypernetwork": hyper_spec(dim, client, cfg.hyper_size, cfg.hyper_hidden),
        }

    @staticmethod
    def floats_per_client_round(arch: dict) -> int:
        """Alg. 8's messages: eta_v down, v up, theta down, delta theta up, dv down, d eta_v up: 2(d + |eta_v| + l)."""
        from pfl_cli.models import num_parameters

        return 2 * (num_parameters(arch["client"]) + num_parameters(arch["embedding"])
                    + int(arch["hypernetwork"]["in_dim"]))

    def build(self) -> None:
        import torch

        from pfl_cli.models import build

        self.net = self.client_net()
        self.embed = seeded(self.cfg.seed, "init-embedding", lambda: build(self.arch["embedding"])).to(self.device)
        self.hnet = seeded(self.cfg.seed, "init-hypernetwork", lambda: build(self.arch["hypernetwork"])).to(self.device)
        self.names = [k for k, _ in self.net.named_parameters()]
        self.desc_stats = None  # frozen (m, s) of the code's descriptor standardization
        params = [*self.hnet.parameters(), *self.embed.parameters()]
        defaults = SERVER_DEFAULTS[self.cfg.server_optimizer]
        lr = self.cfg.server_lr if self.cfg.server_lr is not None else defaults["lr"]
        self.server_clip = self.cfg.server_clip if self.cfg.server_clip is not None else defaults["clip"]
        if self.cfg.server_optimizer == "adam":
            self.make_optimizer = lambda: torch.optim.Adam(params, lr=lr)
        else:
            self.make_optimizer = lambda: torch.optim.SGD(params, lr=lr, momentum=self.cfg.server_momentum)
        self._optimizer = None

    # ------------------------------------------------------------------ descriptors (thesis §4.3)
    def _embed_mean(self, index, mask):
        """v = masked mean of phi(x, y) over each row of ``index`` (k, b) -> (k, l)."""
        return self._embed_batch(self.store.inputs(index), self.store.onehot(index), mask)

    def _embed_batch(self, x, onehot, mask):
        """Masked mean of phi over the b samples of each row: x (k, b, ...), onehot (k, b, C) -> (k, l)."""
        k, b = mask.shape
        e = self.embed(x.flatten(0, 1), onehot.flatten(0, 1))
        e = e.view(k, b, e.shape[-1])
        return (e * mask[..., None]).sum(1) / mask.sum(1, keepdim=True).clamp_min(1.0)

    def _embed_cohort(self, index, mask, *, chunk_samples: int | None = None):
        """Raw descriptors (c, l) of a cohort's rows ``index`` (c, b), ``chunk_samples`` samples per pass.

        Distributed, each rank embeds the clients whose data it holds and the rows come back
        whole through :func:`~pfl_cli.fl.distributed.gather_rows` (differentiable: the
        embedding network's gradient is then each rank's share, summed in :meth:`run_round`).
        """
        import torch

        from pfl_cli.fl.distributed import gather_rows, rows_here, world

        rows = slice(None) if world()[1] == 1 else rows_here(self.store, index)
        index, mask = index[rows], mask[rows]
        per = len(index) if chunk_samples is None else max(1, chunk_samples // max(index.shape[1], 1))
        parts = [self._embed_mean(index[lo:lo + per], mask[lo:lo + per]) for lo in range(0, len(index), max(per, 1))]
        raw = torch.cat(parts) if parts else self._embed_mean(index, mask)
        return raw if isinstance(rows, slice) else gather_rows(raw, rows, len(rows))

    def _standardize(self, v):
        if not self.cfg.standardize_descriptor:
            return v
        if self.desc_stats is None:
            # The authors' code: scalar mean and std of the very first descriptor, frozen.
            first = v[0].detach()
            # A descriptor of one number (l = 1: 3 clients, or --embed-dim 1) has no spread;
            # its unbiased std is NaN, so it is only centred.
            spread = first.std().clamp_min(1e-8) if first.numel() > 1 else first.new_ones(())
            self.desc_stats = torch_stack_scalar(first.mean(), spread)
        m, s = self.desc_stats[0], self.desc_stats[1]
        return (v - m) / s

    def descriptors(self, clients, gen, *, chunk_samples: int = 8192):
        """Evaluation descriptors: over all fit samples (code) or one random batch (paper)."""
        return self._standardize(self.raw_descriptors(clients, gen, chunk_samples=chunk_samples))

    def raw_descriptors(self, clients, gen, *, chunk_samples: int = 8192):
        """:meth:`descriptors` before the server's standardization (Alg. 7 steps 2-3, a client's half)."""
        import torch

        from pfl_cli.fl.batches import sample_batches

        sel = torch.as_tensor(clients, device=self.device)
        with torch.no_grad():
            if self.cfg.eval_descriptor == "batch":
                index, mask = sample_batches(self.store.fit, sel, 1, self.cfg.descriptor_batch, gen)
                return self._embed_cohort(index[:, 0], mask[:, 0])
            rows, length = self.store.fit.rows(sel)
            mask = (torch.arange(rows.shape[1], device=rows.device) < length[:, None]).to(torch.float32)
            return self._embed_cohort(rows, mask, chunk_samples=chunk_samples)

    def server_models(self, raw):
        """Alg. 7 step 5: theta = h(v) for raw descriptors (c, l), standardized as in training; no graph."""
        import torch

        with torch.no_grad():
            return self.hnet(self._standardize(raw))

    # ------------------------------------------------------------------ Alg. 8
    # The round in halves: the client_* methods run where a client's data is (all cohort rows at
    # once in the simulation, one row on a Flower node), the server_* methods where the
    # hypernetwork is. pflx train and the Flower app (pfl_cli.interop.flower_app.pefll) call the
    # same halves, so a deployment computes the simulation's numbers.
    def run_round(self, t, cohort, gen):
        from pfl_cli.fl.distributed import sum_grads

        if self.dp is not None:
            return self._run_round_dp(t, cohort, gen)
        c = len(cohort)
        d_index, d_mask = self.descriptor_batches(cohort, gen)                                       # step 5
        raw = self.client_descriptor(d_index, d_mask)                                                 # steps 6-7
        raw_leaf, theta = self.server_generate(raw)                                                   # steps 8-9
        new, loss = self.cohort_train(theta, cohort, gen)                                            # steps 10-11
        neg_delta = [(theta[k].detach() - new[k]) / c for k in self.names]                            # -delta / |P|
        g_h, g_raw = self.server_backward(theta, raw_leaf, neg_delta)                                 # steps 12-13
        g_e = self.client_embedding_grad(raw, g_raw)                                                  # steps 14-15
        e_params = list(self.embed.parameters())
        self._server_step(list(self.hnet.parameters()), g_h, e_params, sum_grads(g_e, e_params))    # lines 17-18
        self._record_traffic(c, raw_leaf, theta, new)
        return loss

    def descriptor_batches(self, cohort, gen):
        """Step 5: one batch B_i per cohort client for its descriptor, (c, b) indices and mask."""
        from pfl_cli.fl.batches import sample_batches

        d_index, d_mask = sample_batches(self.store.fit, cohort, 1, self.cfg.descriptor_batch, gen)
        return d_index[:, 0], d_mask[:, 0]

    def client_descriptor(self, d_index, d_mask):
        """Steps 6-7: the raw descriptors (c, l) of batches B_i, with the embedding net's graph kept."""
        return self._embed_cohort(d_index, d_mask)

    def server_generate(self, raw):
        """Step 8: theta_i = h(v_i) from the clients' raw descriptors (standardized here, frozen (m, s)).

        Returns the leaf the server back-propagates to and the generated models ``{name: (c, ...)}``.
        """
        raw_leaf = raw.detach().requires_grad_(True)
        return raw_leaf, self.hnet(self._standardize(raw_leaf))

    def cohort_train(self, theta, cohort, gen):
        """Step 10 in a simulated round: :meth:`client_train` of the whole cohort through
        :meth:`~pfl_cli.algorithms.base.Algorithm.cohort_sgd` -> (theta_new, loss).

        The same numbers as ``client_train(theta, *step_batches(cohort, gen, lazy=False))``: the
        ``local_steps`` batches are drawn from ``gen`` right after the descriptor batches (step 5) either
        way, lazily here. One plain cohort SGD call, so K runs stacked on the run axis
        (:mod:`pfl_cli.fl.stack`) train their cohorts as one batched call per step.
        """
        new, loss, _ = self.cohort_sgd({k: theta[k].detach() for k in self.names}, cohort, gen,
                                       steps=self.cfg.local_steps)
        return new, loss

    def client_train(self, theta, index, mask=None):
        """Step 10: k local SGD steps from theta (tables ``index``/``mask``) -> (theta_new, loss)."""
        from pfl_cli.fl.cohort import local_sgd

        return local_sgd(self.net, {k: theta[k].detach() for k in self.names}, self.store, index, mask,
                         **self.sgd_options())

    def server_backward(self, theta, raw_leaf, neg_delta):
        """Step 12: the VJP of -delta / |P| through h: the eta_h gradient and the raw descriptors' (c, l)."""
        import torch

        h_params = list(self.hnet.parameters())
        grads = torch.autograd.grad([theta[k] for k in self.names], [*h_params, raw_leaf], grad_outputs=neg_delta)
        return grads[:-1], grads[-1]

    def client_embedding_grad(self, raw, g_raw):
        """Step 14: the VJP of the descriptor gradient through v(B_i; eta_v) (None where a parameter is unused)."""
        import torch

        return torch.autograd.grad(raw, list(self.embed.parameters()), grad_outputs=g_raw, allow_unused=True)

    def _run_round_dp(self, t, cohort, gen):
        """Alg. 8 under client-level DP: each client's own (eta_h, eta_v) gradient is clipped, the sum noised.

        Steps 5-11 as :meth:`run_round`; steps 12-14 per client (``torch.func.vmap`` over the
        cohort), then :meth:`ClientLevelDP.private_mean` replaces the average of line 17.
        """
        import torch

        from pfl_cli.privacy.randomness import mechanism_generator

        cfg = self.cfg
        h_params, e_params = dict(self.hnet.named_parameters()), dict(self.embed.named_parameters())
        if len(cohort) == 0:  # an empty Poisson cohort: only noise is added
            contrib = {f"{n}.{k}": p.detach().new_zeros((0, *p.shape))
                       for n, ps in (("h", h_params), ("e", e_params)) for k, p in ps.items()}
            loss = torch.zeros(0)
        else:
            d_index, d_mask = self.descriptor_batches(cohort, gen)                                       # step 5
            with torch.no_grad():
                v = self._embed_cohort(d_index, d_mask)                                                 # steps 6-7
                theta = self.hnet(v)                                                                    # step 8
            new, loss = self.cohort_train(theta, cohort, gen)                                          # step 10
            self._record_traffic(len(cohort), v, theta, new)
            neg_delta = {k: theta[k] - new[k] for k in self.names}                                     # -delta_i
            contrib = self._client_gradients(h_params, e_params, d_index, d_mask, neg_delta)
        mean = self.dp.private_mean(contrib, mechanism_generator(cfg, f"dp-noise-{t}", self.device))
        self._server_step(list(h_params.values()), [mean[f"h.{k}"] for k in h_params],
                          list(e_params.values()), [mean[f"e.{k}"] for k in e_params])
        return loss

    def _client_gradients(self, h_params, e_params, d_index, d_mask, neg_delta) -> dict:
        """Each client's VJP of -delta_i through h(v_i) and v_i = mean_b phi(x_b, y_b) (steps 12, 14), vmapped."""
        from pfl_cli.fl.distributed import split_cohort

        return split_cohort(self._client_vjps, self.store, d_index, {"d_index": d_index, "d_mask": d_mask,
                                                                     "neg_delta": neg_delta},
                            h_params=h_params, e_params=e_params)

    def _client_vjps(self, h_params, e_params, d_index, d_mask, neg_delta) -> dict:
        from torch.func import functional_call, grad, vmap

        store, names = self.store, self.names

        def inner(hp, ep, x, y1, m, nd):
            e = functional_call(self.embed, ep, (x, y1))
            v = (e * m[:, None]).sum(0) / m.sum().clamp_min(1.0)
            theta = functional_call(self.hnet, hp, (v,))
            return sum((theta[k] * nd[k]).sum() for k in names)  # its gradient is J^T (-delta_i)

        hp = {k: p.detach() for k, p in h_params.items()}
        ep = {k: p.detach() for k, p in e_params.items()}
        g_h, g_e = vmap(grad(inner, argnums=(0, 1)), in_dims=(None, None, 0, 0, 0, 0))(
            hp, ep, store.inputs(d_index), store.onehot(d_index), d_mask, neg_delta)
        return {**{f"h.{k}": g for k, g in g_h.items()}, **{f"e.{k}": g for k, g in g_e.items()}}

    def _record_traffic(self, c, v, theta, new) -> None:
        """Alg. 8's messages: eta_v down, v up, theta down, delta theta up, dv down, d eta_v up, per cohort client."""
        t = self.traffic
        for k, p in self.embed.named_parameters():
            t.send(f"embedding.{k}", p, copies=c)
            t.receive(f"embedding_grad.{k}", p, copies=c)  # each client's own VJP into eta_v
        t.receive("descriptor", v)
        t.send("descriptor_grad", v)
        for k in self.names:
            t.send(k, theta[k])
            t.receive(f"delta.{k}", new[k])

    def _server_step(self, h_params, g_h, e_params, g_e) -> None:
        """Lines 17-18: the averaged gradients plus 2 lambda eta, clipped, one optimizer step."""
        import torch

        from pfl_cli.fl.server import server_step

        cfg = self.cfg
        grads = []
        for params, gs, lam in ((h_params, g_h, cfg.lambda_h), (e_params, g_e, cfg.lambda_v)):
            for p, g in zip(params, gs):
                g = torch.zeros_like(p) if g is None else g
                grads.append(g + 2.0 * lam * p.detach() if lam else g)
        server_step(self.opt, [*h_params, *e_params], grads, clip=self.server_clip)

    def run_round_sequential(self, t, cohort, gen):
        """:meth:`run_round` one client at a time (the reference for tests and the benchmark)."""
        import torch

        from pfl_cli.fl.cohort import local_sgd_reference

        c = len(cohort)
        d_index, d_mask = self.descriptor_batches(cohort, gen)
        index, mask = self.step_batches(cohort, gen, lazy=False)
        h_params, e_params = list(self.hnet.parameters()), list(self.embed.parameters())
        acc_h = [torch.zeros_like(p) for p in h_params]
        acc_e = [torch.zeros_like(p) for p in e_params]
        losses = []
        for i in range(c):
            v = self._standardize(self._embed_mean(d_index[i:i + 1], d_mask[i:i + 1]))
            v_leaf = v.detach().requires_grad_(True)
            theta = self.hnet(v_leaf)
            new, loss = local_sgd_reference(self.net, {k: theta[k].detach() for k in self.names}, self.store,
                                            index[i:i + 1], mask[i:i + 1], **self.sgd_options())
            neg = [(theta[k].detach() - new[k]) / c for k in self.names]
            grads = torch.autograd.grad([theta[k] for k in self.names], [*h_params, v_leaf], grad_outputs=neg)
            g_e = torch.autograd.grad(v, e_params, grad_outputs=grads[-1], allow_unused=True)
            for a, g in zip(acc_h, grads[:-1]):
                a += g
            for a, g in zip(acc_e, g_e):
                if g is not None:
                    a += g
            losses.append(loss)
        self._server_step(h_params, acc_h, e_params, acc_e)
        return torch.cat(losses)

    def round_upload_steps(self) -> int:
        """Its rounds take ``local_steps`` SGD steps (``local_epochs`` is not read)."""
        return self.cfg.local_steps

    def upload(self, x, y, *, steps: int, noise_gen=None, start=None, clients=None, private=None):
        """Alg. 8's messages 2 and 4 (lines 7 and 11): the descriptor v of the client's batch and its delta theta.

        The same batch builds the descriptor (steps 5-6) and feeds the ``steps`` local steps
        from theta = h(v) (steps 8-11; 0 steps: the gradient at theta). Message 6 (d eta_v) is a
        function of the server's dv and is not modelled. ``start``: the theta the server sent,
        when known (an attacker's model of the upload keeps it fixed rather than h(v(x))).
        """
        import torch

        onehot = torch.nn.functional.one_hot(y, self.store.num_classes).to(x.dtype)
        v = self._standardize(self._embed_batch(x, onehot, torch.ones(y.shape, device=x.device)))
        if start is None:
            start = self.hnet(v)
            start = {k: start[k] for k in self.names}
        return {"v": v, **self.local_update(start, x, y, steps)}, start

    # ------------------------------------------------------------------ Alg. 7
    def protocol(self, new: bool) -> dict:
        return {"protocol": f"descriptor ({self.cfg.eval_descriptor} fit samples) -> hypernetwork forward pass "
                "(Alg. 7), no optimizer step", "rounds": 0}

    def personalize(self, clients: np.ndarray, gen):
        return self.server_models(self.raw_descriptors(clients, gen)), True

    # ------------------------------------------------------------------ descriptor analysis (thesis §4.4, Fig. 4.1)
    def diagnostics(self):
        if not self.cfg.track_descriptors:
            return {}
        from pfl_cli.fl.descriptors import descriptor_rank_correlation
        from pfl_cli.fl.store import ROLE_HOLDOUT

        rho = descriptor_rank_correlation(self, self.store.clients(ROLE_HOLDOUT))
        return {"holdout": {"descriptor_spearman": rho}}

    # ------------------------------------------------------------------ state (+ ServerOptimizerState)
    def weights(self):
        out = {"hypernetwork": cpu_state_dict(self.hnet), "embedding": cpu_state_dict(self.embed)}
        if self.desc_stats is not None:
            out["descriptor_stats"] = self.desc_stats.detach().cpu().clone()
        return out

    def load_weights(self, weights):
        self.hnet.load_state_dict(weights["hypernetwork"])
        self.embed.load_state_dict(weights["embedding"])
        stats = weights.get("descriptor_stats")
        self.desc_stats = None if stats is None else stats.to(self.device)


def torch_stack_scalar(a, b):
    import torch

    return torch.stack([a, b]).detach()
