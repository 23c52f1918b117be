"""HyperFL (Guo et al., AAAI 2025, §3.1-3.2, App. D.1; its code where the paper is silent).

Every client holds a copy of the hypernetwork phi plus a private embedding v_i (dim 64) and a
private classifier (the client net's last layer). The feature extractor is never a free
parameter: theta_i = h(v_i; phi) is generated. One round (§3.2, eqs. 4-6):

1. each cohort client starts from the global phi (downloaded) and its private v_i, classifier;
2. step 1 (eq. 4): one epoch of SGD on the classifier, the generated feature extractor frozen;
3. step 2 (eq. 5): E epochs of SGD on (phi, v_i) through the generated weights, classifier frozen
   (exact back-propagation through h, which equals the code's dL/dtheta VJP);
4. the client uploads phi_i only; the server averages phi_i weighted by n_i over the cohort (eq. 6).

Client sampling: ``clients_per_round`` (the paper: all 20, or 30 % of 100), and every client in the
last round (App. D.1). Both optimizers are re-created every round (no momentum crosses rounds), so the
private state is just (v_i, classifier_i), kept for every client in :class:`~pfl_cli.fl.client_state.ClientState`.

A client never trained (a new client in ``predict``) starts from the shared initial embedding and
classifier and trains them locally under the frozen global phi: ``local_epochs`` alternations of one
classifier epoch (step 1) and one embedding epoch (step 2 without phi).

Communication: the whole hypernetwork each way per participant, ~128x FedAvg's model on the CIFAR
CNN; the ledger records it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import numpy as np

from pfl_cli.algorithms.base import BACKBONE_KEYS, GENERATED_NETS, Algorithm, model_arch_spec, seeded
from pfl_cli.attack.protocol import Attackable
from pfl_cli.fl.config import TrainConfig, key
from pfl_cli.fl.params import cpu_state_dict, cpu_tree, merge_rows, stack
from pfl_cli.fl.secagg import cohort_mean


DEFAULT_EMBED_DIM = 64    # App. D.1: "learnable vectors with dimension equals 64"
DEFAULT_HEAD_LR = 0.1     # App. D.1: eta_g
DEFAULT_EPOCHS = 5        # App. D.1: local epochs of step 2


S = "HyperFL (AAAI 2025)"


@dataclass(frozen=True)
class HyperFLConfig(TrainConfig):
    """HyperFL's keys; defaults from the paper's main configuration (App. D.1) and its code."""

    algorithm: str = key("hyperfl", "the algorithm these keys configure")
    rounds: int = key(200, "communication rounds", f"{S} App. D.1: 200 rounds")
    clients_per_round: Optional[int] = key(None, "cohort size (null: every client; the last round takes every client)",
                                           f"{S} App. D.1: 20 clients, full participation")
    batch_size: int = key(50, "client minibatch size", f"{S} App. D.1: batch size 50 (EMNIST 100)")
    lr: float = key(0.01, "eta_h: step-2 SGD step on the hypernetwork", f"{S} App. D.1: 0.01 EMNIST/FMNIST (CIFAR 0.02)")
    embed_lr: Optional[float] = key(None, "eta_v: step-2 step on the embedding (null: lr)", f"{S} App. D.1: eta_v = eta_h")
    head_lr: float = key(DEFAULT_HEAD_LR, "eta_g: step-1 SGD step on the classifier", f"{S} App. D.1: eta_g 0.1")
    momentum: float = key(0.5, "SGD momentum of both steps", f"{S} App. D.1: momentum 0.5")
    lambda_theta: float = key(2.5e-4, "weight decay / 2 of both steps", f"{S} App. D.1: weight decay 5e-4 = 2 lambda_theta")
    client_clip: float = key(50.0, "step-2 gradient-norm clip, HN and embedding apart (step 1 is not clipped)",
                             "HyperFL code: clip_grad_norm_(..., 50) in step 2 only")
    local_epochs: int = key(DEFAULT_EPOCHS, "step-2 epochs per round (new clients: alternations of steps 1-2)",
                            f"{S} App. D.1: 5 local epochs")
    embed_dim: int = key(DEFAULT_EMBED_DIM, "embedding dimension", f"{S} App. D.1: embedding dim 64")
    hyper_hidden: int = key(128, "width of the hypernetwork's one hidden layer", "HyperFL code: HN 1 layer, width 128")


class HyperFL(Attackable, Algorithm):
    name = "hyperfl"
    individual_reads = ""  # under --secagg eq. (6)'s mean of the hypernetwork parameters from sums
    search_space = {"lr": "log:1e-3:1e-1", "head_lr": "log:1e-2:1", "embed_dim": "choice:16,32,64,128"}
    search_space_source = ("Guo et al., HyperFL (AAAI 2025), §Experiments: the hypernetwork, embedding and "
                           "classifier lrs are the tuned keys (defaults eta_h = 0.01, eta_g = 0.1); embedding sizes "
                           "around its 64")
    tune_group = "train"
    paper = "HyperFL: Guo et al., AAAI 2025, §3"
    new_client_protocol = "its embedding and classifier trained local_epochs under the global hypernetwork"
    config = HyperFLConfig
    inert_keys = dict.fromkeys(BACKBONE_KEYS, GENERATED_NETS)

    @staticmethod
    def resolve_arch(cfg, store) -> dict:
        from pfl_cli.fl.split import split_names
        from pfl_cli.models import build, hyper_spec

        client = model_arch_spec(cfg, store)
        features = split_names(build(client))[0]
        dim = int(cfg.embed_dim) or DEFAULT_EMBED_DIM
        # the HyperFL code: Linear(64, hidden) -> ReLU -> one linear head per feature-extractor tensor
        return {"client": client,
                "hypernetwork": hyper_spec(dim, client, "M", cfg.hyper_hidden, n_hidden=0, relu_out=True,
                                           generate=features)}

    def build(self) -> None:
        from torch import nn
        from pfl_cli.algorithms.hyperfl_net import GeneratedNet

        from pfl_cli.fl.client_state import ClientState
        from pfl_cli.models import build

        self.net = self.client_net()
        self.hnet = seeded(self.cfg.seed, "init-hypernetwork", lambda: build(self.arch["hypernetwork"])).to(self.device)
        self.names = list(self.hnet.target_names)
        self.head_names = [k for k, _ in self.net.named_parameters() if k not in self.names]
        self.hn_names = [k for k, _ in self.hnet.named_parameters()]
        dim = self.hnet.in_dim
        # "These embedding vectors are randomly initialized to the same value" (App. D.2): one seeded draw.
        v0 = seeded(self.cfg.seed, "init-embedding", lambda: nn.Embedding(1, dim)).weight[0].detach().to(self.device)
        init = dict(self.net.named_parameters())
        self.template = {"embedding": v0, **{k: init[k].detach().clone() for k in self.head_names}}
        self.private = ClientState(self.template, self.store.num_clients, self.store.partition_sha)
        self.generated = GeneratedNet(self.hnet, self.net, dim)

    @staticmethod
    def floats_per_client_round(arch: dict) -> int:
        """§3.2: the whole hypernetwork comes down and phi_i goes up; the client net never travels."""
        from pfl_cli.models import num_parameters

        return 2 * num_parameters(arch["hypernetwork"])

    def cohort_size(self, t: int, total: int, available: int) -> int:
        return available if t == total - 1 else super().cohort_size(t, total, available)  # App. D.1: last round full

    def has_state(self, clients: np.ndarray) -> np.ndarray:
        return self.private.known(clients, self.store.partition_sha)

    # ------------------------------------------------------------------ client steps (eq. 4, eq. 5)
    def _options(self, *, clip: bool = True) -> dict:
        """Both steps' SGD settings; only step 2 clips (the HyperFL code: ``clip_grad_norm_`` in step 2 alone)."""
        o = self.sgd_options()
        return {"momentum": o["momentum"], "weight_decay": o["weight_decay"], "clip": o["clip"] if clip else 0.0}

    def step_classifier(self, clients, v, head, gen, epochs: int = 1, batch=None):
        """Step 1: ``epochs`` of SGD on the classifier; the generated feature extractor is fixed.

        ``batch`` (x, y) of shapes (c, b, ...), (c, b): each client's whole data as one batch
        (``pflx attack``, ``--upload weights``): the same SGD steps, one per epoch, unrolled on
        the autograd graph (:func:`~pfl_cli.fl.cohort.unrolled_sgd`) so the attacker can
        differentiate them in the data, the embedding and the classifier.
        """
        import torch

        from pfl_cli.fl.cohort import local_sgd, unrolled_sgd

        lr = self.cfg.head_lr if self.cfg.head_lr is not None else DEFAULT_HEAD_LR
        if batch is not None:
            theta = self.hnet(v)  # on the graph: v may be the attacker's unknown
            return unrolled_sgd(self.net, head, *batch, epochs, lr=lr, fixed=theta, **self._options(clip=False)), None
        with torch.no_grad():
            theta = self.hnet(v)
        batches, taken = self.draw_batches(clients, gen, epochs=epochs)
        new, loss = local_sgd(self.net, head, self.store, batches, lr=lr, fixed=theta, **self._options(clip=False))
        self.client_sgd_steps += taken
        return new, loss

    def step_generator(self, clients, phi, v, head, gen, epochs: int, batch=None):
        """Step 2: ``epochs`` of SGD on (phi_i, v_i) through theta = h(v; phi); the classifier is fixed.

        ``phi`` is a per-client stack (training), or None: the global phi frozen (new clients).
        ``batch``: as in :meth:`step_classifier` (with a ``phi`` stack).
        """
        from pfl_cli.fl.cohort import local_sgd, unrolled_sgd

        params, lrs, groups = self._generator_step(phi, v)
        fixed = {f"net.{k}": head[k] for k in self.head_names}
        if batch is not None:
            new = unrolled_sgd(self.generated, params, *batch, epochs, lr=lrs, fixed=fixed, clip_groups=groups,
                               **self._options())
            loss = None
        else:
            batches, taken = self.draw_batches(clients, gen, epochs=epochs)
            shared = {f"hnet.{k}": p.detach() for k, p in self.hnet.named_parameters()} if phi is None else None
            new, loss = local_sgd(self.generated, params, self.store, batches, lr=lrs, fixed=fixed, shared=shared,
                                  clip_groups=groups, **self._options())
            self.client_sgd_steps += taken
        phi_new = None if phi is None else {k: new[f"hnet.{k}"] for k in self.hn_names}
        return phi_new, new["v"], loss

    def local_round(self, cohort, phi, v, head, gen, batch=None):
        """A cohort client's local update in one round (§3.2 steps 1-2): ``(phi_i, v_i, classifier_i, loss)``.

        The round (:meth:`run_round`) and the attacker's model of a client's uploaded weights
        (:meth:`upload` with ``steps=None``, on one fixed ``batch``) both run it.
        """
        head, _ = self.step_classifier(cohort, v, head, gen, batch=batch)           # step 1, eq. (4)
        phi, v, loss = self.step_generator(cohort, phi, v, head, gen, self.local_epochs(),
                                           batch=batch)                               # step 2, eq. (5)
        return phi, v, head, loss

    def local_epochs(self) -> int:
        """``local_epochs``, or App. D.1's 5 when unset: step 2's epochs per round, a new client's alternations."""
        return self.cfg.local_epochs or DEFAULT_EPOCHS

    def round_upload_steps(self) -> int:
        """The attack protocol's SGD steps on phi behind phi_i when the client's data is one batch: step 2's epochs."""
        return self.local_epochs()

    def _generator_step(self, phi, v):
        """Step 2's trained parameters of :class:`GeneratedNet`, their step sizes (eta_h, eta_v) and clip groups."""
        eta_h = self.cfg.lr
        eta_v = self.cfg.embed_lr if self.cfg.embed_lr is not None else eta_h
        params, lrs, groups = {"v": v}, {"v": eta_v}, [["v"]]
        if phi is not None:
            params.update({f"hnet.{k}": phi[k] for k in self.hn_names})
            lrs.update({f"hnet.{k}": eta_h for k in self.hn_names})
            groups.append([f"hnet.{k}" for k in self.hn_names])  # clipped apart from v, as the code
        return params, lrs, groups

    # ------------------------------------------------------------------ the client's message (pflx attack)
    def upload(self, x, y, *, steps, noise_gen=None, start=None, clients=None, private=None):
        """Eq. (5)-(6): what leaves the client is phi_i only (§3.2).

        ``steps = None`` (``--upload weights``): ``delta/<phi name>`` = phi_i - phi after the
        client's whole local update of a round as trained (:meth:`local_round`: one classifier
        epoch, then the step-2 epochs on (phi, v_i)) on its data (x, y) as one batch: what it
        uploads, less the global phi the server sent. ``steps = 0``: ``grad/<phi name>``, the
        hypernetwork gradient at the global phi through theta = h(v_i; phi) and the private
        classifier (the paper's eq. 8 setting); ``steps = k``: ``delta/<phi name>`` after k of
        step 2's SGD steps alone. ``private``: the embedding and classifier (the attacker's
        unknowns, the joint attack of HyperFL §5); None: the client's own (a client never trained gets
        them by the new-client protocol on its data).
        """
        from pfl_cli.fl.cohort import batch_gradients, unrolled_sgd
        from pfl_cli.rng import torch_generator

        n = y.shape[0]
        if start is None:
            start = stack({k: p.detach() for k, p in self.hnet.named_parameters()}, n)
        if private is None:
            private = self._private_of(clients, torch_generator(self.cfg.seed, "attack-new-clients", self.device))
        head = {k: private[k] for k in self.head_names}
        if steps is None:
            new, _, _, _ = self.local_round(None, start, private["embedding"], head, None, batch=(x, y))
            return {f"delta/{k}": new[k] - start[k] for k in self.hn_names}, start
        params, lrs, groups = self._generator_step(start, private["embedding"])
        fixed = {f"net.{k}": head[k] for k in self.head_names}
        if steps == 0:
            g = batch_gradients(self.generated, params, x, y, fixed)
            return {f"grad/{k}": g[f"hnet.{k}"] for k in self.hn_names}, start
        new = unrolled_sgd(self.generated, params, x, y, steps, lr=lrs, fixed=fixed, clip_groups=groups,
                           **self._options())
        return {f"delta/{k}": new[f"hnet.{k}"] - start[k] for k in self.hn_names}, start

    def attack_private(self, n: int) -> dict:
        """The embedding and classifier every client starts from (App. D.2: one shared initial value)."""
        return stack(self.template, n)

    def _private_of(self, clients, gen) -> dict:
        """Each client's embedding and classifier: a trained client's own, a new client's by the
        new-client protocol (:meth:`new_clients`, what ``predict`` serves it)."""
        import torch

        clients = np.asarray(clients.cpu() if hasattr(clients, "cpu") else clients, dtype=np.int64)
        known = self.has_state(clients)
        parts = [(known, self.private.gather(torch.as_tensor(clients[known], device=self.device)))]
        if (~known).any():
            v_new, head_new = self.new_clients(torch.as_tensor(clients[~known], device=self.device), gen)
            parts.append((~known, {"embedding": v_new, **head_new}))
        return merge_rows(len(clients), parts)

    def leaked_gradients(self, message: dict, start: dict) -> dict:
        """The generated feature extractor's gradient: head k is affine, theta_k = A_k z + b_k, so
        dL/db_k = dL/dtheta_k exactly (tests/attack), without the embedding or the classifier."""
        from pfl_cli.fl.cohort import scaled_gradient

        o = self._options()
        out = {}
        for i, name in enumerate(self.names):
            b = f"heads.{i}.bias"
            g = message.get(f"grad/{b}")
            if g is None and f"delta/{b}" in message:
                g = scaled_gradient(message[f"delta/{b}"], start[b], lr=self.cfg.lr, weight_decay=o["weight_decay"])
            if g is not None:
                out[name] = g.reshape(g.shape[0], *self.hnet.target_shapes[name])
        return out

    # ------------------------------------------------------------------ one round (§3.2)
    def run_round(self, t, cohort, gen):
        c = len(cohort)
        private = self.private.gather(cohort)
        v, head = private["embedding"], {k: private[k] for k in self.head_names}
        for k, p in self.hnet.named_parameters():
            self.traffic.send(f"hypernetwork.{k}", p, copies=c)                   # global phi down
        phi = stack(dict(self.hnet.named_parameters()), c)
        phi, v, head, loss = self.local_round(cohort, phi, v, head, gen)            # steps 1-2, eqs. (4)-(5)
        for k in self.hn_names:
            self.traffic.receive(f"hypernetwork.{k}", phi[k])                       # phi_i up, nothing else
        self.private.scatter(cohort, {"embedding": v, **head})
        self.aggregate(cohort, phi)
        return loss

    def aggregate(self, cohort, phi: dict) -> None:
        """Eq. (6): phi = sum_i w_i phi_i with w_i = n_i / sum_j n_j over the cohort."""
        import torch

        with torch.no_grad():
            mean = cohort_mean(self.store, cohort, {k: phi[k] for k in self.hn_names}, secagg=self.cfg.secagg)
            for k, p in self.hnet.named_parameters():
                p.copy_(mean[k])

    # ------------------------------------------------------------------ models for any client
    def personalize(self, clients: np.ndarray, gen):
        import torch

        private = self._private_of(clients, gen)
        with torch.no_grad():
            theta = self.hnet(private["embedding"])
        return {**{k: theta[k] for k in self.names}, **{k: private[k] for k in self.head_names}}, True

    def new_clients(self, clients, gen):
        """The shared initial embedding and classifier, trained locally under the frozen global phi."""
        c = len(clients)
        v = self.template["embedding"].unsqueeze(0).repeat(c, 1)
        head = stack({k: self.template[k] for k in self.head_names}, c)
        for _ in range(self.local_epochs()):
            head, _ = self.step_classifier(clients, v, head, gen)
            _, v, _ = self.step_generator(clients, None, v, head, gen, 1)
        return v, head

    def protocol(self, new: bool) -> dict:
        if not new:
            return {"protocol": "private embedding and classifier with the global hypernetwork", "rounds": 0}
        epochs = self.local_epochs()
        return {"protocol": (f"global hypernetwork frozen; a new embedding and classifier trained locally, "
                             f"{epochs} x (1 classifier epoch + 1 embedding epoch)"), "rounds": 0}

    # ------------------------------------------------------------------ state
    def state(self):
        return self.weights()  # optimizers are re-created every round (as in the HyperFL code): nothing else to keep

    def load_state(self, state):
        self.load_weights(state)

    def weights(self):
        return {"hypernetwork": cpu_state_dict(self.hnet), "private": cpu_tree(self.private.state())}

    def load_weights(self, weights):
        from pfl_cli.fl.client_state import ClientState

        self.hnet.load_state_dict(weights["hypernetwork"])
        self.private = ClientState.from_state(weights["private"], self.device)
