"""pFedHN and pFedHN-PC (Shamsian, Navon, Fetaya, Chechik, ICML 2021, §3, Alg. 1; the official code where the paper is silent).

A server-side hypernetwork h(v_i; phi) maps a trainable per-client embedding v_i (a row of a
table over the train clients, dimension int(1 + n/4)) to the client's model theta_i. One round
(Alg. 1 with two errata fixed, as the official code has it):

1. the server sends theta_i = h(v_i; phi) to each cohort client (one client per round in the paper);
2. the client runs K local SGD steps and returns delta_i = theta~_i - theta_i;
3. the server takes ONE step on (phi, v) with the gradient J^T (theta_i - theta~_i) -- descent on the
   surrogate 1/2 ||theta~_i - h(v_i; phi)||^2 (erratum 2: the sign), after all K steps (erratum 1:
   the indentation) -- by SGD with momentum, weight decay and clipping (the official code's outer optimizer).

A cohort of c > 1 clients runs as one batched computation (generated weights stacked, local steps
vmapped) and averages the c VJPs.

pFedHN-PC (§3.3) generates the feature extractor only; every client keeps a private head (the
client net's last layer) and its SGD momentum across rounds, stepped jointly with the K local steps.
With mixed sizes (``client_sizes``, §5.2) h generates each size's feature extractor and a client's
head has its own size's shape (one private-head store per size).

New clients (§5 "generalization to novel clients"; the PeFLL thesis's protocol for pFedHN, §4.4): phi frozen, a fresh embedding
v_new ~ N(0, I) trained for ``embed_rounds`` rounds of the same delta-VJP rule (pFedHN-PC also
trains a fresh head during the local steps).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import numpy as np

from pfl_cli.algorithms.base import (BACKBONE_KEYS, GENERATED_NETS, GENERATED_WEIGHTS, Algorithm, ServerOptimizerState,
                                     descriptor_dim, model_arch_spec, seeded)
from pfl_cli.attack.protocol import Attackable
from pfl_cli.fl.config import HYPER_SIZES, TrainConfig, key
from pfl_cli.fl.params import cpu_state_dict, cpu_tree, merge_rows, stack
from pfl_cli.fl.server import server_step


DEFAULT_SERVER_LR = 1e-2      # pFedHN's outer lr (official code)
DEFAULT_SERVER_LR_PC = 5e-2   # pFedHN-PC's outer lr (official code)


P = "pFedHN (ICML 2021)"
C = "pFedHN official code"


@dataclass(frozen=True)
class PFedHNConfig(TrainConfig):
    """pFedHN's keys; defaults from the paper (§5, App. B) and the official code."""

    algorithm: str = key("pfedhn", "the algorithm these keys configure")
    rounds: int = key(5000, "communication rounds (server steps)", f"{P} §5: at most 5000 steps")
    clients_per_round: Optional[int] = key(1, "clients per server step", f"{P} Alg. 1: sample one client i")
    local_steps: int = key(50, "K: inner SGD steps of a client", f"{P} §5: K = 50")
    lr: float = key(5e-3, "inner (client) SGD step size", f"{C}: inner lr 5e-3")
    momentum: float = key(0.9, "inner SGD momentum", f"{C}: inner momentum 0.9")
    lambda_theta: float = key(2.5e-5, "inner weight decay / 2", f"{C}: inner wd 5e-5 = 2 lambda_theta")
    client_clip: float = key(50.0, "inner gradient-norm clip", f"{C}: inner grad-clip 50")
    batch_size: int = key(64, "client minibatch size", f"{C}: batch size 64")
    eval_every: int = key(30, "rounds between evaluations", f"{C}: eval every 30 steps")
    server_lr: float = key(DEFAULT_SERVER_LR, "outer SGD step on the hypernetwork", f"{C}: outer lr 1e-2")
    embed_lr: Optional[float] = key(None, "outer step of the embedding rows (null: server_lr)",
                                    f"{C}: embed_lr = lr")
    hn_momentum: float = key(0.9, "outer SGD momentum", f"{C}: outer momentum 0.9")
    hn_weight_decay: float = key(1e-3, "outer weight decay (touches the whole embedding table, as in the official code)",
                                 f"{C}: outer wd 1e-3")
    server_clip: float = key(50.0, "clip of the hypernetwork gradient (0 = off)", f"{C}: HN grad clip 50")
    embed_dim: int = key(0, "embedding dimension (0 = int(1 + n / 4) over the n train clients)",
                         f"{P} §5: embedding dim int(1 + n/4)")
    hyper_size: str = key("M", "hypernetwork S / M / L = 1 / 3 / 5 hidden layers",
                          f"{P} App. B: HN 3 hidden x 100 units", choices=HYPER_SIZES)
    hyper_hidden: int = key(100, "hypernetwork hidden width", f"{P} App. B: HN 3 hidden x 100 units")
    embed_rounds: int = key(20, "rounds a new client's embedding trains (phi frozen)",
                            "thesis §4.4, App. B.1.2: optimized for 20 rounds")
    client_sizes: str = key("", 'target widths "S,M,L" (client j gets size j mod 3; "" = one size)',
                            f"{P} §5.2")

    def validate(self) -> None:
        super().validate()
        from pfl_cli.errors import ConfigError
        from pfl_cli.fl.config import CLIENT_SIZES, client_sizes

        unknown = [s for s in client_sizes(self.client_sizes) if s not in CLIENT_SIZES]
        if unknown:
            raise ConfigError(f"client_sizes must be a comma-separated list of {', '.join(CLIENT_SIZES)}; got "
                              f"{self.client_sizes!r} (unknown {', '.join(map(repr, unknown))}).")
        if self.embed_rounds < 1:
            raise ConfigError(f"embed_rounds must be >= 1 for {self.algorithm} (a new client's embedding is trained "
                              f"for that many rounds; an untrained embedding is not a model); got "
                              f"{self.embed_rounds}.")


@dataclass(frozen=True)
class PFedHNPCConfig(PFedHNConfig):
    """pFedHN-PC's keys: pFedHN's with its own outer step (official code)."""

    algorithm: str = key("pfedhn-pc", "the algorithm these keys configure")
    server_lr: float = key(DEFAULT_SERVER_LR_PC, "outer SGD step on the hypernetwork", f"{C}: PC outer lr 5e-2")


class PFedHN(ServerOptimizerState, Attackable, Algorithm):
    name = "pfedhn"
    # under --secagg (pfl_cli.fl.secagg)
    individual_reads = "each client's model delta, back-propagated through the hypernetwork at that client's own embedding"
    search_space = {
        "server_lr": "choice:0.1,0.05,0.01,0.005",
        "lr": "choice:0.05,0.01,0.005,0.001",
        "embed_dim": "choice:5,15,25,35",
    }
    search_space_source = ("Shamsian et al., pFedHN (ICML 2021), App. B: hypernetwork lr {1e-1, 5e-2, 1e-2, 5e-3} "
                           "and inner lr {5e-2, 1e-2, 5e-3, 1e-3} tuned on validation data; §5, embedding-size "
                           "ablation {5, 15, 25, 35}")
    tune_group = "train"
    paper = "pFedHN: Shamsian, Navon, Fetaya, Chechik, ICML 2021, §3, Alg. 1"
    new_client_protocol = "a fresh embedding trained embed_rounds rounds, hypernetwork frozen"
    config = PFedHNConfig
    inert_keys = {**dict.fromkeys(BACKBONE_KEYS, GENERATED_NETS), "model_weights": GENERATED_WEIGHTS}
    personal_head = False

    @classmethod
    def resolve_arch(cls, cfg, store) -> dict:
        from pfl_cli.errors import InputError
        from pfl_cli.fl.config import client_sizes, model_kind
        from pfl_cli.fl.store import ROLE_TRAIN
        from pfl_cli.fl.split import split_names
        from pfl_cli.models import build, hyper_spec, table_spec

        if client_sizes(cfg.client_sizes) and model_kind(cfg.model_arch) is not None:
            raise InputError(f"client_sizes: pFedHN's S / M / L client nets are pflx's LeNet and MLP at three widths; "
                             f"model_arch {cfg.model_arch!r} is a model kind's net, of one size. Drop client_sizes, or "
                             "use model_arch lenet or mlp.")
        client = model_arch_spec(cfg, store)
        rows = max(len(store.clients(ROLE_TRAIN)), 1)   # one row per train client: holdout clients have none
        dim = descriptor_dim(cfg, rows)  # §5: e = int(1 + n/4), n the train clients (the table's rows)
        generate = split_names(build(client))[0] if cls.personal_head else None
        arch = {"client": client, "table": table_spec(rows, dim)}
        targets = None
        if client_sizes(cfg.client_sizes):
            targets = {s: sized_client(client, s) for s in dict.fromkeys(client_sizes(cfg.client_sizes))}
            arch.update({f"client_{s}": spec for s, spec in targets.items()})
        arch["hypernetwork"] = hyper_spec(dim, client, cfg.hyper_size, cfg.hyper_hidden, generate=generate,
                                          targets=targets)
        return arch

    @property
    def server_clip(self) -> float:
        """The clip of the server gradient: --set server_clip, else 50 (the official code's default)."""
        return 50.0 if self.cfg.server_clip is None else float(self.cfg.server_clip)

    def build(self) -> None:
        import torch

        from pfl_cli.fl.client_state import ClientState
        from pfl_cli.fl.config import client_sizes
        from pfl_cli.models import build

        self.net = self.client_net()
        self.hnet = seeded(self.cfg.seed, "init-hypernetwork", lambda: build(self.arch["hypernetwork"])).to(self.device)
        self.table = seeded(self.cfg.seed, "init-embedding-table", lambda: build(self.arch["table"])).to(self.device)
        # Size slots (client j gets slot j mod len); one unnamed group when every client has the same net.
        self.slots = client_sizes(self.cfg.client_sizes) or [""]
        self.nets = {"": self.net} if self.slots == [""] else {
            s: seeded(self.cfg.seed, f"init-client-{s}", lambda s=s: build(self.arch[f"client_{s}"])).to(self.device)
            for s in dict.fromkeys(self.slots)}
        # generated tensor names per group: (name in h's output, parameter name in the group's net)
        self.generated = {g: [(k, k.split("/", 1)[1] if g else k) for k in self.hnet.target_names
                              if not g or k.startswith(f"{g}/")] for g in self.nets}
        self.names = [plain for _, plain in self.generated[self.slots[0]]]  # of the single-size net
        self.head_names = [k for k, _ in self.net.named_parameters() if k not in self.names]
        self.partition_sha = self.store.partition_sha
        self._map_rows()
        default = DEFAULT_SERVER_LR_PC if self.personal_head else DEFAULT_SERVER_LR
        lr = self.cfg.server_lr if self.cfg.server_lr is not None else default
        embed_lr = self.cfg.embed_lr if self.cfg.embed_lr is not None else lr
        self.embed_lr = embed_lr  # also the step of a new client's embedding fit (no optimizer needed there)
        groups = [{"params": list(self.hnet.parameters()), "lr": lr},
                  {"params": list(self.table.parameters()), "lr": embed_lr}]
        self.make_optimizer = lambda: torch.optim.SGD(groups, lr=lr, momentum=self.cfg.hn_momentum,
                                                      weight_decay=self.cfg.hn_weight_decay)
        self._optimizer = None
        self.heads = None
        if self.personal_head:
            # Per size group: a fresh client's head (its size's initial last layer) and every client's
            # private head + momentum. Rows of a group's state that belong to another size stay unused.
            self.head_init, self.heads = {}, {}
            for g, net in self.nets.items():
                init = dict(net.named_parameters())
                self.head_init[g] = {k: init[k].detach().clone() for k in self.head_names}
                template = dict(self.head_init[g])
                template.update({f"momentum.{k}": torch.zeros_like(init[k]) for k in self.head_names})
                self.heads[g] = ClientState(template, self.store.num_clients, self.partition_sha)

    def _map_rows(self) -> None:
        """Row of every store client in the embedding table (-1: none), valid on the trained partition only."""
        import torch

        from pfl_cli.fl.store import ROLE_TRAIN

        row = np.full(self.store.num_clients, -1, dtype=np.int64)
        if bytes(self.partition_sha) == bytes(self.store.partition_sha):
            train = self.store.clients(ROLE_TRAIN)
            row[train] = np.arange(len(train))
        self.row_of = torch.as_tensor(row, device=self.device)

    def has_state(self, clients: np.ndarray) -> np.ndarray:
        return self.row_of[np.asarray(clients, dtype=np.int64)].cpu().numpy() >= 0

    def group_of(self, clients) -> np.ndarray:
        """The size group of each client: slot (partition position mod the number of slots)."""
        pos = np.asarray(clients.cpu() if hasattr(clients, "cpu") else clients, dtype=np.int64)
        return np.asarray(self.slots, dtype=object)[pos % len(self.slots)]

    def model_groups(self, clients: np.ndarray) -> list:
        clients = np.asarray(clients, dtype=np.int64)
        groups = self.group_of(clients)
        return [(clients[groups == g], self.nets[g]) for g in self.nets if (groups == g).any()]

    # ------------------------------------------------------------------ Alg. 1 (errata fixed)
    def _local(self, theta, clients, gen, heads=None, momentum=None, group: str = ""):
        """K local SGD steps from the generated ``theta`` (h's output names; plus private heads) on the
        group's net; returns (theta~ under h's output names, heads, loss)."""
        from pfl_cli.fl.cohort import local_sgd

        index, mask = self.step_batches(clients, gen, lazy=False)
        start = {plain: theta[out].detach() for out, plain in self.generated[group]}
        if heads is not None:
            start.update(heads)
        new, loss = local_sgd(self.nets[group], start, self.store, index, mask, momentum_state=momentum,
                              **self.sgd_options())
        return ({out: new[plain] for out, plain in self.generated[group]},
                {k: new[k] for k in self.head_names if heads is not None}, loss)

    def run_round(self, t, cohort, gen):
        import torch

        c = len(cohort)
        theta = self.generate(cohort)
        neg_delta = {k: torch.zeros_like(t) for k, t in theta.items()}  # sizes a client does not use: no gradient
        loss = torch.zeros(c, device=self.device)
        groups = self.group_of(cohort)
        for g in self.nets:
            members = torch.as_tensor(np.flatnonzero(groups == g), device=self.device)
            if len(members) == 0:
                continue
            clients = cohort[members]
            heads = momentum = None
            if self.personal_head:
                private = self.heads[g].gather(clients)
                heads = {k: private[k] for k in self.head_names}
                momentum = {k: private[f"momentum.{k}"] for k in self.head_names}
            mine = {out: theta[out][members] for out, _ in self.generated[g]}
            new, new_heads, loss_g = self._local(mine, clients, gen, heads, momentum, g)
            if self.personal_head:
                self.heads[g].scatter(clients, {**new_heads, **{f"momentum.{k}": b for k, b in momentum.items()}})
            for out, plain in self.generated[g]:
                self.traffic.send(plain, mine[out])                     # theta_i down (the client's size only)
                self.traffic.receive(f"delta.{plain}", new[out])        # delta theta_i up
                # Erratum 2: J^T (theta - theta~), descent on 1/2 ||theta~ - h(v; phi)||^2; averaged over the cohort.
                neg_delta[out][members] = (mine[out].detach() - new[out]) / c
            loss[members] = loss_g
        self.server_update(theta, neg_delta)
        return loss

    # The server's halves of a round, which a Flower deployment runs apart from the clients' local steps.
    def generate(self, cohort):
        """Alg. 1 line 1: theta_i = h(v_i; phi) for the cohort's embeddings v_i, every size, with the graph."""
        return self.hnet(self.table(self.row_of[cohort]))

    def server_update(self, theta: dict, neg_delta: dict) -> None:
        """Alg. 1 lines 3-4: phi and the embeddings step along J^T neg_delta, neg_delta = (theta - theta~) / c."""
        import torch

        params = [*self.hnet.parameters(), *self.table.parameters()]
        grads = torch.autograd.grad(list(theta.values()), params, grad_outputs=list(neg_delta.values()))
        server_step(self.opt, params, grads, clip=self.server_clip)     # erratum 1: once per round

    # ------------------------------------------------------------------ the client's message (pflx attack)
    def round_upload_steps(self) -> int:
        """Its rounds take ``local_steps`` SGD steps (``local_epochs`` is not read)."""
        return self.cfg.local_steps

    def upload(self, x, y, *, steps: int, noise_gen=None, start=None, clients=None, private=None):
        """Alg. 1 step 2: delta theta_i after ``steps`` local steps from theta_i = h(v_i) (0: the gradient there).

        A train client gets h of its trained embedding; a client without one (holdout) the
        first model the novel-client protocol sends it, h of a fresh v ~ N(0, I). pFedHN-PC: the private head joins
        the local steps (``private``: the attacker's guess of it) and only the feature
        extractor's delta goes up. The steps are the trainer's (same clip, momentum, decay).
        """
        from pfl_cli.errors import InputError

        if len(self.nets) > 1:
            raise InputError(f"--model: a {self.name!r} run with client_sizes has several client nets; pflx attack "
                             "models the uploads of a single-size run.")
        if start is None:
            start = self._sent(clients)
        heads = private if private is not None else self._heads_of(clients)
        update = self.local_update({**start, **heads}, x, y, steps)
        return {k: v for k, v in update.items() if k.split("/", 1)[1] in start}, start

    def attack_private(self, n: int) -> dict:
        """pFedHN-PC: the head the server never sees, guessed as a fresh client's (the public init)."""
        return stack(self.head_init[""], n) if self.personal_head else {}  # a single-size run (upload refuses others)

    def _sent(self, clients) -> dict:
        """theta_i = h(v_i) the server sends each of ``clients`` (a fresh seeded v for clients without a row)."""
        import torch

        from pfl_cli.rng import torch_generator

        clients = torch.as_tensor(clients, device=self.device)
        rows = self.row_of[clients]
        fresh = torch.randn((len(clients), self.table.embedding_dim),
                            generator=torch_generator(self.cfg.seed, "attack-new-embedding")).to(self.device)
        with torch.no_grad():
            v = torch.where((rows >= 0)[:, None], self.table(rows.clamp_min(0)), fresh)
            theta = self.hnet(v)
        return {plain: theta[out] for out, plain in self.generated[""]}

    def _heads_of(self, clients) -> dict:
        """pFedHN-PC: each client's private head (a fresh client's for clients never trained)."""
        import torch

        if not self.personal_head:
            return {}
        clients = torch.as_tensor(clients, device=self.device)
        known = torch.as_tensor(self.has_state(clients.cpu().numpy()), device=self.device)
        mine, init = self.heads[""].gather(clients), self.head_init[""]  # single size: the one group ""
        return {k: torch.where(known.view(-1, *[1] * init[k].dim()), mine[k], init[k]) for k in self.head_names}

    # ------------------------------------------------------------------ models for any client
    def personalize(self, clients: np.ndarray, gen):
        import torch

        clients = np.asarray(clients, dtype=np.int64)
        group = self.group_of(clients[:1])[0] if len(clients) else self.slots[0]   # model_groups: one size
        known = self.has_state(clients)
        parts = []
        if known.any():
            sel = torch.as_tensor(clients[known], device=self.device)
            with torch.no_grad():
                theta = self.hnet(self.table(self.row_of[sel]))
            heads = self.heads[group].gather(sel) if self.personal_head else {}
            parts.append((known, {**{plain: theta[name] for name, plain in self.generated[group]},
                                  **{k: heads[k] for k in self.head_names}}))
        if (~known).any():
            parts.append((~known, self.new_clients(clients[~known], gen, group)))
        return merge_rows(len(clients), parts), True

    def new_clients(self, clients: np.ndarray, gen, group: str = "", local=None) -> dict:
        """Novel clients (§5; PeFLL thesis §4.4): phi frozen; a fresh embedding per client trained by the delta-VJP rule for ``embed_rounds``.

        The embedding takes the server's optimizer settings (embedding lr, momentum, weight decay,
        clip per client); pFedHN-PC also trains a fresh head with a persistent momentum buffer.
        Every client is independent: they run as one batched computation. ``local`` replaces
        :meth:`_local` (a Flower deployment sends theta to the clients' nodes and gets theta~ back).
        """
        import torch

        from pfl_cli.fl.cohort import sgd_step

        cfg, c = self.cfg, len(clients)
        sel = torch.as_tensor(clients, device=self.device)
        dim = self.table.embedding_dim
        v = torch.randn((c, dim), generator=gen).to(self.device)         # nn.Embedding's N(0, 1) init
        buf = torch.zeros_like(v)
        lr = self.embed_lr
        heads = momentum = None
        if self.personal_head:
            heads = stack(self.head_init[group], c)
            momentum = {k: torch.zeros_like(heads[k]) for k in self.head_names}
        for _ in range(cfg.embed_rounds):
            leaf = v.detach().requires_grad_(True)
            theta = self.hnet(leaf)
            new, new_heads, _ = (local or self._local)(theta, sel, gen, heads, momentum, group)
            if heads is not None:
                heads = new_heads
            # Per-client rows: the gradient of the sum is each client's own J_v^T (theta - theta~).
            (g,) = torch.autograd.grad([theta[k] for k in new], [leaf],
                                       grad_outputs=[theta[k].detach() - new[k] for k in new])
            with torch.no_grad():
                if self.server_clip > 0:  # each embedding's own norm (torch.norm, as clip_grad_norm_ of one row)
                    g = g * (self.server_clip / (g.norm(dim=1, keepdim=True) + 1e-6)).clamp(max=1.0)
                stepped, bufs = sgd_step({"v": v}, {"v": g}, {"v": buf}, lr=lr, momentum=cfg.hn_momentum,
                                         weight_decay=cfg.hn_weight_decay)
                v, buf = stepped["v"], bufs["v"]
            self.client_sgd_steps += cfg.local_steps * c
            self.new_client_steps += c
        with torch.no_grad():
            theta = self.hnet(v)
        out = {plain: theta[k] for k, plain in self.generated[group]}
        if heads is not None:
            out.update(heads)
        return out

    def protocol(self, new: bool) -> dict:
        if not new:
            return {"protocol": "trained embedding: theta_i = h(v_i; phi)" + (" + private head" if
                                                                                self.personal_head else ""),
                    "rounds": 0}
        return {"protocol": (f"frozen hypernetwork; fresh embedding{' and head' if self.personal_head else ''} "
                             f"trained by the delta-VJP rule, {self.cfg.embed_rounds} rounds x "
                             f"{self.cfg.local_steps} local steps"),
                "rounds": int(self.cfg.embed_rounds)}

    # ------------------------------------------------------------------ state (+ ServerOptimizerState)
    def weights(self):
        import torch

        out = {"hypernetwork": cpu_state_dict(self.hnet), "table": cpu_state_dict(self.table),
               "partition_sha": torch.tensor(list(self.partition_sha), dtype=torch.uint8)}
        if self.heads is not None:
            out.update({head_key(g): cpu_tree(state.state()) for g, state in self.heads.items()})
        return out

    def load_weights(self, weights):
        from pfl_cli.fl.client_state import ClientState

        self.hnet.load_state_dict(weights["hypernetwork"])
        self.table.load_state_dict(weights["table"])
        self.partition_sha = bytes(weights["partition_sha"].tolist())
        self._map_rows()
        if self.personal_head:
            self.heads = {g: ClientState.from_state(weights[head_key(g)], self.device) for g in self.nets}


def head_key(group: str) -> str:
    """Key of a size group's private heads in ``weights()``: "heads" for one size, else "heads_<size>"."""
    return f"heads_{group}" if group else "heads"


SIZE_KERNELS = {"S": 8, "M": 16, "L": 32}     # App. B: conv1 filters of the S / M / L LeNets
SIZE_WIDTH = {"S": 0.5, "M": 1.0, "L": 2.0}   # the MLP analogue: hidden widths scaled


def sized_client(client: dict, size: str) -> dict:
    """The client spec of width ``size`` (pFedHN §5.2, Table 2): LeNet kernels, or MLP hidden widths scaled."""
    from pfl_cli.errors import ConfigError
    from pfl_cli.models import client_spec

    arch, shape, classes = client["arch"], client["input_shape"], client["num_classes"]
    if arch == "lenet":
        return client_spec(arch, shape, classes, client["hidden"], kernels=SIZE_KERNELS[size])
    if arch == "mlp":
        return client_spec(arch, shape, classes, [max(1, round(h * SIZE_WIDTH[size])) for h in client["hidden"]])
    raise ConfigError(f"client_sizes needs a lenet or mlp client net (their S/M/L widths are defined); got "
                      f"model_arch {arch!r}.")


class PFedHNPC(PFedHN):
    """pFedHN-PC (§3.3): the hypernetwork generates the feature extractor; heads stay on the clients."""

    name = "pfedhn-pc"
    # under --secagg (pfl_cli.fl.secagg)
    individual_reads = "each client's model delta, back-propagated through the hypernetwork at that client's own embedding"
    search_space = {
        "server_lr": "choice:0.1,0.05,0.01,0.005",
        "lr": "choice:0.05,0.01,0.005,0.001",
        "embed_dim": "choice:5,15,25,35",
    }
    search_space_source = ("Shamsian et al., pFedHN (ICML 2021), App. B: hypernetwork lr {1e-1, 5e-2, 1e-2, 5e-3} "
                           "and inner lr {5e-2, 1e-2, 5e-3, 1e-3}; §5, embedding sizes {5, 15, 25, 35}")
    tune_group = "train"
    paper = "pFedHN-PC: Shamsian et al., ICML 2021 §3.3"
    inert_keys = dict.fromkeys(BACKBONE_KEYS, GENERATED_NETS)  # model_weights starts the head, which is not generated
    new_client_protocol = "a fresh embedding and head trained embed_rounds rounds"

    @staticmethod
    def floats_per_client_round(arch: dict) -> int:
        """The generated feature extractor down and its update up; the head never leaves the client (§3.3)."""
        from pfl_cli.fl.split import part_floats

        return 2 * part_floats(arch["client"], "body")
    config = PFedHNPCConfig
    personal_head = True
