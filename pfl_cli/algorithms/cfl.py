"""CFL: Clustered Federated Learning (Sattler, Müller, Samek, IEEE TNNLS 2020, Alg. 1).

Clients start in one cluster around one model. Each round a cohort client downloads its cluster's model
theta_c, runs local SGD (``local_steps`` steps or ``local_epochs`` epochs) and sends its update
``dtheta_i = theta_i - theta_c``. For each cluster the server computes the norm of the mean update,
``||sum_i (|D_i| / |D_c|) dtheta_i||``, and the largest client update norm ``max_i ||dtheta_i||``
(§III-D). When the mean is small (``< cfl_eps1``: the cluster's joint objective is near a stationary
point) and some client's update is large (``> cfl_eps2``: that point is not stationary for it), the
cluster's clients in the round are bipartitioned by the cosine similarity of their updates,
``alpha_ij = <dtheta_i, dtheta_j> / (||dtheta_i|| ||dtheta_j||)``, into the two groups whose largest
cross-group similarity is smallest (§III-C, the optimal bipartition; computed exactly as the two-cluster
single-linkage cut of the similarity graph: the split across its maximum spanning tree's weakest edge).
Each new cluster's model is theta_c plus its members' mean update; a cluster that does not split takes
theta_c plus the mean update of its members in the round (Alg. 1's aggregation per cluster).

As in the authors' code (felisat/clustered-federated-learning), no cluster splits before
``cfl_warmup_rounds`` rounds, and eps1 = 0.4, eps2 = 1.6 are the thresholds of its MNIST experiment.

Partial participation (a cohort): the paper lets every client take part in every round
(``clients_per_round`` null, the default). With a cohort, a member of a cluster that split in a round it
sat out belongs to the split cluster's subtree; at its next round (or when it is served a model) it takes the
model with the lowest loss on its train data among that subtree's clusters (IFCA's estimate, Ghosh et al.
2020). A client never trained, or of another partition, takes the lowest-loss model among all clusters.
Exchanged per cohort client and round: its cluster model down, its update up (a client resolving a split it
missed receives its candidate models). No DP variant.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import numpy as np

from pfl_cli.algorithms.base import Algorithm
from pfl_cli.algorithms.fedavg import FedAvgRoundConfig
from pfl_cli.fl.config import check_own_keys, key
from pfl_cli.fl.params import cpu_tree

SATTLER = "Sattler et al. (IEEE TNNLS 2020)"
CODE = "the authors' code (felisat/clustered-federated-learning, its MNIST notebook)"


@dataclass(frozen=True)
class CFLConfig(FedAvgRoundConfig):
    """CFL's keys: FedAvg's round, the two split thresholds and the rounds before any split."""

    algorithm: str = key("cfl", "the algorithm these keys configure")
    clients_per_round: Optional[int] = key(None, "cohort size of every round (null: every train client)",
                                           f"{SATTLER} Alg. 1: every client computes its update each round")
    cfl_eps1: float = key(0.4, "eps1: a cluster may split only when the norm of its mean update is below it",
                          f"{SATTLER} §III-D, Alg. 1; 0.4 as in {CODE} (EPS_1)")
    cfl_eps2: float = key(1.6, "eps2: ... and some client's update norm is above it",
                          f"{SATTLER} §III-D, Alg. 1; 1.6 as in {CODE} (EPS_2)")
    cfl_warmup_rounds: int = key(20, "rounds before the first split may happen",
                                 f"{CODE}: splits are tested from round 20 on")

    def validate(self) -> None:
        super().validate()
        check_own_keys(self, {"cfl_eps1": "a finite number >= 0", "cfl_eps2": "a finite number >= 0",
                              "cfl_warmup_rounds": "an integer >= 0"})


class CFL(Algorithm):
    name = "cfl"
    individual_reads = "each client's update (the cosine similarities between clients' updates decide a split)"
    paper = "CFL: Sattler et al., IEEE TNNLS 2020 (Alg. 1, cosine-similarity bipartitions)"
    new_client_protocol = "the cluster model with the lowest loss on its train data"
    config = CFLConfig
    dp_unit = None  # no DP variant
    not_distributed = "its split test reads every cohort client's update in one process"
    inert_keys = {k: "its server adds each cluster's mean update to the cluster model (Sattler et al. 2020, Alg. 1): "
                  "there is no server step" for k in ("server_lr", "server_momentum")}
    search_space = {"lr": "log:1e-3:1", "cfl_eps1": "log:0.01:10", "cfl_eps2": "log:0.1:100"}
    search_space_source = (f"{SATTLER} §V: eps1 and eps2 are set per experiment from the observed update norms; "
                           "pflx searches both on log ranges around the authors' code's 0.4 and 1.6, with the client lr")
    tune_group = "train"

    @staticmethod
    def resolve_arch(cfg, store) -> dict:
        """The client net and the tree's capacity: every cluster keeps at least one train client, so there are at
        most n leaves and 2n - 1 nodes (n train clients); ``model.pt`` keeps that many model slots."""
        from pfl_cli.fl.store import ROLE_TRAIN

        n = max(len(store.clients(ROLE_TRAIN)), 1)
        return {**Algorithm.resolve_arch(cfg, store), "cfl": {"nodes": 2 * n - 1}}

    def build(self) -> None:
        import torch

        from pfl_cli.fl.client_state import ClientState
        from pfl_cli.fl.params import stack
        from pfl_cli.fl.store import ROLE_TRAIN

        cap = int(self.arch["cfl"]["nodes"])
        self.net = self.client_net()
        self.models = stack({k: v.detach() for k, v in self.net.named_parameters()}, cap)  # node 0: the root
        self.parent = torch.full((cap,), -1, dtype=torch.int64, device=self.device)
        self.leaf = torch.zeros(cap, dtype=torch.bool, device=self.device)
        self.leaf[0] = True
        self.used = torch.ones((), dtype=torch.int64)  # nodes in use: the root, then two per split
        self.member = ClientState({"node": torch.zeros((), dtype=torch.int64, device=self.device)},
                                  self.store.num_clients, self.store.partition_sha)
        train = torch.as_tensor(self.store.clients(ROLE_TRAIN), device=self.device)
        self.member.scatter(train, {"node": torch.zeros(len(train), dtype=torch.int64, device=self.device)})

    # ------------------------------------------------------------------ the cluster tree
    def below(self):
        """(nodes, nodes) bool: ``[a, l]`` when node l is a or lies under a in the tree of splits."""
        import torch

        n = len(self.parent)
        out = torch.eye(n, dtype=torch.bool, device=self.device)
        every = torch.arange(n, device=self.device)
        up = self.parent.clone()
        while bool((up >= 0).any()):  # one level of ancestors a pass
            ok = up >= 0
            out[up[ok], every[ok]] = True
            up = torch.where(ok, self.parent[up.clamp_min(0)], up)
        return out

    def lowest_loss_leaf(self, clients, nodes):
        """For each client, the cluster (leaf) under its node with the lowest loss on its train data; (c,)."""
        import torch

        from pfl_cli.fl.clusters import losses_under
        from pfl_cli.fl.cohort import resolve_cohort_exec

        leaves = torch.nonzero(self.leaf).flatten()
        how = resolve_cohort_exec(self.cfg.cohort_exec, self.net, self.device)
        loss = losses_under(self.net, self.store, self.store.fit, clients,
                            {k: v[leaves] for k, v in self.models.items()}, how)
        allowed = self.below()[nodes][:, leaves]
        return leaves[loss.masked_fill(~allowed, float("inf")).argmin(1)], allowed.sum(1)

    # ------------------------------------------------------------------ the round
    def run_round(self, t, cohort, gen):
        import torch

        node = self.member.gather(cohort)["node"]
        stale = ~self.leaf[node]
        if bool(stale.any()):  # its cluster split while it sat out: the lowest-loss cluster of the subtree
            chosen, candidates = self.lowest_loss_leaf(cohort[stale], node[stale])
            for k, v in self.models.items():
                self.traffic.send(k, v[0], copies=int(candidates.sum()))
            node = node.clone()
            node[stale] = chosen
        start = {k: v[node] for k, v in self.models.items()}
        for k, v in start.items():
            self.traffic.send(k, v)
        theta, loss, _ = self.cohort_sgd(start, cohort, gen, **self.round_schedule())
        dw = {k: theta[k] - start[k] for k in start}
        for k, v in dw.items():
            self.traffic.receive(k, v)
        size = self.store.fit.length[cohort].to(torch.float32)
        flat = torch.cat([v.flatten(1) for v in dw.values()], 1)
        for c in torch.unique(node).tolist():  # a loop over the round's clusters, not its clients
            rows = torch.nonzero(node == c).flatten()
            w = size[rows] / size[rows].sum().clamp_min(1.0)
            mean_norm = float(torch.linalg.vector_norm(w @ flat[rows]))
            max_norm = float(torch.linalg.vector_norm(flat[rows], dim=1).max())
            if split_wanted(t, len(rows), mean_norm, max_norm, self.cfg):
                side = torch.as_tensor(bipartition(cosine_similarity(flat[rows])), device=self.device)
                self.split(c, rows, side, node, dw, size)
            else:
                for k, v in dw.items():
                    self.models[k][c] = self.models[k][c] + torch.einsum("r,r...->...", w, v[rows])
        self.member.scatter(cohort, {"node": node})
        return loss

    def split(self, c: int, rows, side, node, dw: dict, size) -> None:
        """Cluster ``c`` becomes two new clusters: its round members ``rows`` by ``side``, each new model theta_c
        plus its members' mean update; ``node`` (the cohort's clusters) is updated in place."""
        import torch

        first = int(self.used)
        if first + 2 > len(self.parent):  # cannot happen: every cluster keeps a train client (resolve_arch)
            raise RuntimeError(f"cfl: the tree of {len(self.parent)} nodes is full")
        for k, v in self.models.items():
            for slot, s in ((first, False), (first + 1, True)):
                r = rows[side == s]
                w = size[r] / size[r].sum().clamp_min(1.0)
                v[slot] = v[c] + torch.einsum("r,r...->...", w, dw[k][r])
        self.parent[first:first + 2] = c
        self.leaf[first:first + 2] = True
        self.leaf[c] = False
        self.used = self.used + 2
        node[rows[~side]] = first
        node[rows[side]] = first + 1

    # ------------------------------------------------------------------ models for clients
    def has_state(self, clients: np.ndarray) -> np.ndarray:
        return self.member.known(np.asarray(clients, dtype=np.int64), self.store.partition_sha)

    def personalize(self, clients: np.ndarray, gen):
        import torch

        clients = np.asarray(clients, dtype=np.int64)
        rows = torch.as_tensor(clients, device=self.device)
        node = torch.zeros(len(clients), dtype=torch.int64, device=self.device)  # new: any cluster (root's tree)
        known = torch.as_tensor(self.has_state(clients), device=self.device)
        if bool(known.any()):
            node[known] = self.member.values["node"][rows[known]]
        need = ~self.leaf[node]
        if bool(need.any()):
            node[need] = self.lowest_loss_leaf(rows[need], node[need])[0]
        return {k: v[node] for k, v in self.models.items()}, True

    def protocol(self, new: bool) -> dict:
        if not new:
            return {"protocol": "its cluster's model (the lowest-loss one under its cluster if that split)",
                    "rounds": 0}
        return {"protocol": "the cluster model with the lowest loss on its train data", "rounds": 0}

    def state(self):
        return {"models": {k: v.detach().clone() for k, v in self.models.items()}, "parent": self.parent.clone(),
                "leaf": self.leaf.clone(), "used": self.used.clone(), "member": self.member.state()}

    def load_state(self, state):
        self.models = {k: v.to(self.device) for k, v in state["models"].items()}
        self.parent = state["parent"].to(self.device)
        self.leaf = state["leaf"].to(self.device)
        self.used = state["used"].cpu()
        self.member.load_state(state["member"], self.device)

    def weights(self):
        return cpu_tree(self.state(), clone=True)

    def load_weights(self, weights):
        self.load_state(weights)


def split_wanted(t: int, members: int, mean_norm: float, max_norm: float, cfg) -> bool:
    """Alg. 1's criterion: past the warm-up, at least two members, mean update < eps1 and max update > eps2."""
    return (t >= cfg.cfl_warmup_rounds and members >= 2 and mean_norm < cfg.cfl_eps1
            and max_norm > cfg.cfl_eps2)


def cosine_similarity(flat):
    """alpha_ij of the rows of ``flat`` (m, d): (m, m); a zero update is orthogonal to every other."""
    import torch

    unit = flat / torch.linalg.vector_norm(flat, dim=1, keepdim=True).clamp_min(1e-12)
    return unit @ unit.T


def bipartition(similarity) -> np.ndarray:
    """The split of the m >= 2 rows that minimizes the largest similarity across it (§III-C): bool (m,), row 0 False.

    The optimum is the two-cluster single-linkage cut of the similarity graph: build the maximum spanning tree
    (Prim, O(m^2)) and remove its weakest edge; ties are broken by the lowest row index.
    """
    s = np.asarray(similarity.detach().cpu() if hasattr(similarity, "detach") else similarity, dtype=np.float64)
    m = s.shape[0]
    inside = np.zeros(m, dtype=bool)
    inside[0] = True
    best = s[0].copy()
    link = np.zeros(m, dtype=np.int64)
    edges = []  # (similarity, parent, child) of the tree
    for _ in range(m - 1):
        cand = np.where(inside, -np.inf, best)
        j = int(np.argmax(cand))
        edges.append((best[j], int(link[j]), j))
        inside[j] = True
        closer = ~inside & (s[j] > best)
        best[closer] = s[j][closer]
        link[closer] = j
    weakest = min(range(len(edges)), key=lambda e: edges[e][0])
    _, _, cut = edges[weakest]
    children = {}
    for _, p, ch in edges:
        children.setdefault(p, []).append(ch)
    side = np.zeros(m, dtype=bool)
    stack = [cut]
    while stack:  # the subtree hanging below the weakest edge
        v = stack.pop()
        side[v] = True
        stack.extend(children.get(v, []))
    return side
