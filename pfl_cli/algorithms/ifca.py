"""IFCA: the Iterative Federated Clustering Algorithm (Ghosh, Chung, Yin, Ramchandran, NeurIPS 2020, Alg. 1).

The server keeps k cluster models theta_1..theta_k. In each round it sends all k to every cohort client;
the client estimates its cluster as the model with the lowest loss on its own training data,
``j = argmin_j F_i(theta_j)`` (Alg. 1, the cluster identity estimate), runs local SGD from theta_j
(Alg. 1's model averaging option: ``local_steps`` steps, or ``local_epochs`` epochs) and sends back its
model and j. The server replaces each cluster model by the mean of the models its members sent
(data-size weighted, FedAvg's mean: with equal sizes Alg. 1's uniform mean exactly); a cluster no
cohort client chose keeps its model.

The cluster estimate scores all k models over the whole cohort in batched forwards
(:func:`pfl_cli.fl.clusters.losses_under`: clients x models per call), not one client at a time.

A client's model, seen in training or not, is the cluster model with the lowest loss on its train
data (the same estimate, no optimizer step): IFCA's prediction protocol. Exchanged per cohort client
and round: k models down, one model and its cluster index up. No DP variant.

Departures, said here: the k models start from k independent random initializations (seeded streams
``init-client`` and ``init-cluster-j``), the paper's random initialization; its multiple restarts and the
weight-sharing variant (shared lower layers) are not run.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from pfl_cli.algorithms.base import Algorithm, seeded
from pfl_cli.algorithms.fedavg import FedAvgRoundConfig
from pfl_cli.fl.config import check_own_keys, key
from pfl_cli.fl.params import cpu_tree

GHOSH = "Ghosh et al. (NeurIPS 2020)"


@dataclass(frozen=True)
class IFCAConfig(FedAvgRoundConfig):
    """IFCA's keys: FedAvg's round (model averaging) and the number of clusters k."""

    algorithm: str = key("ifca", "the algorithm these keys configure")
    num_clusters: int = key(4, "k: cluster models the server keeps",
                            f"{GHOSH} §5.2: rotated MNIST with p = 4 rotations, k = 4 cluster models")

    def validate(self) -> None:
        super().validate()
        check_own_keys(self, {"num_clusters": "an integer >= 1"})


class IFCA(Algorithm):
    name = "ifca"
    individual_reads = ""  # under --secagg each cluster's mean from per-cluster sums (cluster_means_secure)
    paper = "IFCA: Ghosh et al., NeurIPS 2020 (Alg. 1, model averaging)"
    new_client_protocol = "the cluster model with the lowest loss on its train data"
    config = IFCAConfig
    dp_unit = None  # no DP variant
    not_distributed = "its cluster estimate scores every cohort client's data under the k models in one process"
    inert_keys = {k: "its server replaces each cluster model by its members' mean model (Ghosh et al. 2020, Alg. 1): "
                  "there is no server step" for k in ("server_lr", "server_momentum")}
    search_space = {"lr": "log:1e-3:1", "num_clusters": "int:1:8"}
    search_space_source = (f"{GHOSH} §5: k is set to the number of groups where it is known (4 rotations) and "
                           "varied otherwise (FEMNIST k in {2, 3}); pflx searches k in [1, 8] with the client lr, as "
                           "FedAvg's (McMahan et al. 2017, §3)")
    tune_group = "train"

    def build(self) -> None:
        from pfl_cli.models import build

        self.net = self.client_net()
        first = {k: v.detach().clone() for k, v in self.net.named_parameters()}
        models = [first] + [
            {k: v.detach().to(self.device) for k, v in seeded(self.cfg.seed, f"init-cluster-{j}",
                                                                lambda: build(self.arch["client"])).named_parameters()}
            for j in range(1, int(self.cfg.num_clusters))]
        self.clusters = {k: torch_stack([m[k] for m in models]) for k in first}

    @staticmethod
    def floats_per_client_round(arch: dict) -> int:
        """k models down; one model and its cluster index up."""
        from pfl_cli.models import num_parameters

        return (int(arch["ifca"]["clusters"]) + 1) * num_parameters(arch["client"]) + 1

    @staticmethod
    def resolve_arch(cfg, store) -> dict:
        return {**Algorithm.resolve_arch(cfg, store), "ifca": {"clusters": int(cfg.num_clusters)}}

    # ------------------------------------------------------------------ the round
    def assign(self, clients):
        """Alg. 1's cluster estimate: argmin_j of each client's mean loss on its train data (first on ties)."""
        from pfl_cli.fl.clusters import losses_under
        from pfl_cli.fl.cohort import resolve_cohort_exec

        how = resolve_cohort_exec(self.cfg.cohort_exec, self.net, self.device)
        return losses_under(self.net, self.store, self.store.fit, clients, self.clusters, how).argmin(1)

    def run_round(self, t, cohort, gen):
        from pfl_cli.fl.clusters import cluster_means

        c = len(cohort)
        for k, v in self.clusters.items():
            self.traffic.send(k, v, copies=c)            # every cluster model to every cohort client
        j = self.assign(cohort)
        start = {k: v[j] for k, v in self.clusters.items()}
        theta, loss, _ = self.cohort_sgd(start, cohort, gen, **self.round_schedule())
        for k, v in theta.items():
            self.traffic.receive(k, v)                   # its trained model
        self.traffic.receive("cluster", j)               # and the cluster it chose
        size = self.store.fit.length[cohort]
        if self.cfg.secagg:  # per-cluster sums only: neither a client's model nor its cluster is read
            from pfl_cli.fl.clusters import cluster_means_secure

            self.clusters = cluster_means_secure(theta, j, size, self.clusters)
        else:
            self.clusters = cluster_means(theta, j, size, self.clusters)
        return loss

    # ------------------------------------------------------------------ models for clients
    def personalize(self, clients: np.ndarray, gen):
        import torch

        clients = np.asarray(clients, dtype=np.int64)
        rows = torch.as_tensor(clients, device=self.device)
        j = self.assign(rows)
        return {k: v[j] for k, v in self.clusters.items()}, True

    def protocol(self, new: bool) -> dict:
        return {"protocol": "the cluster model with the lowest loss on its train data", "rounds": 0}

    def state(self):
        return {"clusters": {k: v.detach().clone() for k, v in self.clusters.items()}}

    def load_state(self, state):
        self.clusters = {k: v.to(self.device) for k, v in state["clusters"].items()}

    def weights(self):
        return {"clusters": cpu_tree(self.clusters, clone=True)}

    def load_weights(self, weights):
        self.clusters = {k: v.to(self.device) for k, v in weights["clusters"].items()}


def torch_stack(tensors):
    import torch

    return torch.stack(tensors)
