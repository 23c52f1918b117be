"""FedFomo (Zhang, Sapra, Fidler, Yeung, Alvarez, ICLR 2021): first-order model optimization.

Every train client i keeps its model theta_i (all start at the same initial model); the server
stores each client's model as last uploaded and an affinity matrix P (train clients x train
clients, zero at the start). In a round, each cohort client i:

1. receives M other train clients' models, chosen by the server's epsilon-greedy rule (Alg. 1):
   with probability epsilon_t, M uniformly at random; otherwise the M with the largest P_i,n
   (ties in a random order);
2. scores them on its local validation split (the engine's per-client validation carve, the
   same one model selection reads) against its own model theta_i^{t-1} (Eq. 3-4):
   ``w_n = max(0, (L_i(theta_i^{t-1}) - L_i(theta_n)) / ||theta_n - theta_i^{t-1}||)``,
   normalized to sum to one (Eq. 6; all zero: the client keeps its own model);
3. moves ``theta_i <- theta_i^{t-1} + sum_n w_n (theta_n - theta_i^{t-1})`` (Eq. 7), trains it
   with local SGD (``local_steps``, or ``local_epochs``), and uploads it with its weights w;
4. the server stores theta_i and adds w_n to P_i,n (Alg. 1).

epsilon_t = max(0, ``fomo_epsilon`` - t ``fomo_epsilon_decay``). The cohort's clients score the
models stored at the start of the round and train in parallel: the weighted sum for the whole
cohort is an einsum over the stacked models, and the (M + 1) validation losses of
each client are one batched forward (``pfl_cli.fl.cohort.cohort_forward``). The sum runs per parameter
tensor (an einsum over the cohort's stacked models each): concatenating the flattened models first cost a
copy of the (c, M, |theta|) stack, 30 % of the round in ``benchmarks/fomo_apple_round.py``; the distances are
``vector_norm`` of one tensor's differences at a time (``torch.cdist`` took three times as long).

Partial participation: the paper samples a share of the clients each round and the server sends
the models it holds, as last uploaded; pflx does the same (a client that never trained is sent as
the initial model, whose weight is then zero unless it scores better). A client's P row moves only
in its rounds.

A train client's personalized model is its own model as last trained. A client unseen in training
has no model and no row in P (the paper serves none): it trains the train clients' data-size
weighted mean model on its data for ``new_client_epochs`` epochs (pflx's fine-tuning protocol for
new clients, as pFedLA's).

Exchanged: M models down, the client's model and its M weights up ((M + 1) x |client net| + M
floats a cohort client and round; the paper's Table 5 counts the M models down).

Defaults (checked for issue 40 against the authors' code, github.com/NVlabs/FedFomo; the paper's text was
not at hand): epsilon 0.3 decaying by 0.05 a round is the authors' README's every run
(``--client_weight_epsilon 0.3 --client_weight_epsilon_decay 0.05``). M = 5 is PFLlib's default (``-M 5``);
the authors' README downloads ``--num_update_clients`` 4 or 9 models (15 clients), so 5 is a peer's value,
not the authors'. Their runs also use SGD at lr 0.1 without momentum (decay 0.99 a round) and an 80 %
train split; pflx keeps FedAvg's client settings. Two options of those runs pflx does not take: they pass
``--leave_one_out`` (a model's gain is the loss of the received models' average without it minus with it,
``federation.py``; pflx scores it against the client's own model, Eq. 3, the code's other branch) and leave
``--model_delta_norm`` at its default ``l1`` (the L1 norm of theta_n - theta_i; pflx's is the Euclidean
norm). Departure of PFLlib (``clientfomo.py``), where pflx
follows the paper: PFLlib holds out the last 20 % of the client's train split, unshuffled, as its validation
data (``clientfomo.py`` lines 66-71: pflx carves a content-keyed random split) and trains on the rest, and sets theta_i to sum_n w_n theta_n over the received models, its own
model among them only as the server sends it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import numpy as np

from pfl_cli.algorithms.base import Algorithm, PrivateState, epochs_protocol
from pfl_cli.errors import ConfigError, InputError
from pfl_cli.fl.config import TrainConfig, check_own_keys, inert_refusal, key
from pfl_cli.fl.params import cpu_tree, stack, weighted_mean


@dataclass(frozen=True)
class FedFomoConfig(TrainConfig):
    """FedFomo's keys: the round, the models each client downloads and the epsilon-greedy schedule."""

    algorithm: str = key("fedfomo", "the algorithm these keys configure")
    rounds: int = key(5000, "communication rounds", "thesis §4.4, App. B.1.2: all methods but Local train 5000 rounds")
    local_steps: int = key(50, "k: client SGD steps per round", "thesis §4.4: k = 50")
    local_epochs: Optional[int] = key(None, "epochs of local SGD per round instead of local_steps (null: steps)")
    fomo_models: int = key(5, "M: other clients' models each cohort client downloads and weighs (Eq. 3-4)",
                           "PFLlib's default M = 5 (main.py -M 5); the authors' code's README (NVlabs/FedFomo) "
                           "downloads 4 or 9 of 15 clients' models (--num_update_clients)")
    fomo_epsilon: float = key(0.3, "epsilon: the chance a cohort client gets M random models instead of its "
                              "top-M by affinity (Alg. 1's epsilon-greedy selection)",
                              "Zhang et al., FedFomo (ICLR 2021), Alg. 1; 0.3, the authors' code's README "
                              "(NVlabs/FedFomo: --client_weight_epsilon 0.3)")
    fomo_epsilon_decay: float = key(0.05, "epsilon falls by this much every round (never below 0)",
                                    "the authors' code's README (NVlabs/FedFomo: --client_weight_epsilon_decay "
                                    "0.05)")
    new_client_epochs: int = key(20, "epochs a new client trains the train clients' mean model on its data",
                                 "PeFLL (ICLR 2024) App. A.2: new clients of the baselines train 20 local epochs")

    def validate(self) -> None:
        super().validate()
        check_own_keys(self, {"fomo_models": "an integer >= 1", "fomo_epsilon": "a finite number >= 0",
                              "fomo_epsilon_decay": "a finite number >= 0", "new_client_epochs": "an integer >= 0"})
        if self.fomo_epsilon > 1:
            raise ConfigError(f"fomo_epsilon must be a probability in [0, 1] for fedfomo (the chance of M random "
                              f"models, Alg. 1); got {self.fomo_epsilon!r}. Use e.g. --set fomo_epsilon=0.3.")
        if not self.val_fraction > 0:
            raise ConfigError(f"val_fraction must be > 0 for fedfomo (each client weighs the models it downloads "
                              f"by their loss on its validation split, Zhang et al. 2021 Eq. 3); got "
                              f"{self.val_fraction!r}. Use --set val_fraction=0.1.")


class FedFomo(PrivateState, Algorithm):
    name = "fedfomo"
    individual_reads = "each client's model, which other clients download and weigh one by one"  # under --secagg
    paper = "FedFomo: Zhang et al., ICLR 2021 (Alg. 1, Eq. 3-7)"
    new_client_protocol = "the train clients' mean model trained new_client_epochs (no model or affinity row of its own)"
    config = FedFomoConfig
    dp_unit = None  # no DP variant: the weights read the client's validation split and its model goes up in the clear
    not_distributed = "its model selection and first-order weighting read every stored model in one process"
    search_space = {"lr": "log:1e-3:1", "fomo_models": "choice:1,2,5,10", "fomo_epsilon": "float:0:0.5"}
    search_space_source = ("Zhang et al., FedFomo (ICLR 2021): the number of downloaded models M studied in its "
                           "ablation, the epsilon-greedy exploration rate, and the client lr per dataset")
    tune_group = "train"

    def build(self) -> None:
        import torch

        from pfl_cli.fl.store import ROLE_TRAIN

        self.net = self.client_net()
        init = {k: v.detach().clone() for k, v in self.net.named_parameters()}
        self.names = list(init)
        self.private = self.new_private_state(init)
        train = np.asarray(self.store.clients(ROLE_TRAIN))
        # The clients whose models the server may send: train clients with labels (they upload).
        self.pool = torch.as_tensor(train[np.asarray(self.store.labeled)[train]], device=self.device)
        n = self.store.num_clients
        self.affinity = torch.zeros(n, n, device=self.device)  # P, over store positions (rows of train clients move)

    def check_trainable(self, train_clients) -> None:
        super().check_trainable(train_clients)
        if len(self.pool) < 2:
            raise InputError(f"fedfomo: each client weighs other clients' models; this partition has "
                             f"{len(self.pool)} train client with labels. Give it at least 2.")
        cfg, default, others = self.cfg, type(self.cfg)(), len(self.pool) - 1
        if cfg.fomo_models > others and cfg.fomo_models != default.fomo_models:
            raise InputError(f"fomo_models must be at most the {others} other train clients with labels for fedfomo "
                             f"(the models a client can download); got {cfg.fomo_models}. Use --set "
                             f"fomo_models={others} (every other client) or fewer.")
        for name in ("fomo_epsilon", "fomo_epsilon_decay"):
            if self.models_down() == others and getattr(cfg, name) != getattr(default, name):
                raise inert_refusal(name, "fedfomo", f"M = {others} sends every other train client's model on this "
                                    "partition, so the epsilon-greedy choice picks the same models whatever epsilon",
                                    getattr(cfg, name))

    def models_down(self) -> int:
        """M as the run can honour it: the default 5 is capped at the other train clients with labels (a value set
        above them is refused, :meth:`check_trainable`)."""
        return min(int(self.cfg.fomo_models), max(len(self.pool) - 1, 1))

    @staticmethod
    def resolve_arch(cfg, store) -> dict:
        from pfl_cli.fl.store import ROLE_TRAIN

        arch = Algorithm.resolve_arch(cfg, store)
        train = np.asarray(store.clients(ROLE_TRAIN))
        others = max(int(np.asarray(store.labeled)[train].sum()) - 1, 1)
        arch["fomo"] = {"models_down": int(min(cfg.fomo_models, others))}
        return arch

    @staticmethod
    def floats_per_client_round(arch: dict) -> int:
        """M models down; the client's model and its M weights up."""
        from pfl_cli.models import num_parameters

        m = int(arch["fomo"]["models_down"])
        return (m + 1) * num_parameters(arch["client"]) + m

    def epsilon(self, t: int) -> float:
        return max(0.0, float(self.cfg.fomo_epsilon) - t * float(self.cfg.fomo_epsilon_decay))

    # ------------------------------------------------------------------ the round
    def select(self, t: int, cohort, gen):
        """Alg. 1's epsilon-greedy choice: (c, M) store positions of the models each cohort client receives."""
        import torch

        c, m, pool = len(cohort), self.models_down(), self.pool
        explore = torch.rand(c, generator=gen).to(self.device) < self.epsilon(t)
        order = torch.argsort(torch.rand(c, len(pool), generator=gen).to(self.device), dim=1)  # random tie order
        score = torch.where(explore[:, None], torch.zeros(()), self.affinity[cohort[:, None], pool[None, :]])
        score = score.masked_fill(pool[None, :] == cohort[:, None], float("-inf"))  # never its own model
        ranked = torch.sort(score.gather(1, order), dim=1, descending=True, stable=True).indices
        return pool[order.gather(1, ranked)[:, :m]]

    def val_losses(self, cohort, models: dict):
        """Each cohort client's mean validation cross-entropy under each of its models: ``models`` (c, K, ...)
        -> (c, K); a client without labeled validation samples scores 0 under every model."""
        import torch
        import torch.nn.functional as F

        from pfl_cli.fl.cohort import cohort_forward, resolve_cohort_exec

        c, k = len(cohort), next(iter(models.values())).shape[1]
        index, length = self.store.val.rows(cohort)
        how = resolve_cohort_exec(self.cfg.cohort_exec, self.net, self.device)
        out = []
        with torch.no_grad():
            for lo in range(0, c, 16):
                hi = min(c, lo + 16)
                idx, n = index[lo:hi], length[lo:hi]
                y = self.store.y[idx]
                m = (torch.arange(idx.shape[1], device=idx.device)[None, :] < n[:, None]) & (y >= 0)
                x = self.store.inputs(idx)
                xs = x.unsqueeze(1).expand(-1, k, *x.shape[1:]).flatten(0, 1)
                params = {name: v[lo:hi].flatten(0, 1) for name, v in models.items()}
                logits = cohort_forward(self.net, params, xs, how).view(hi - lo, k, idx.shape[1], -1)
                ce = F.cross_entropy(logits.flatten(0, -2), y.clamp_min(0).repeat_interleave(k, 0).flatten(),
                                     reduction="none").view(hi - lo, k, -1)
                mk = m[:, None, :].to(ce.dtype)
                out.append((ce * mk).sum(-1) / mk.sum(-1).clamp_min(1.0))
        return torch.cat(out)

    def first_order_step(self, cohort, models: dict):
        """Eq. 3-7 on ``models`` (c, 1 + M, ...): each client's own model, then the M it received. Returns the
        weights w (c, M) and the moved models theta_i + sum_n w_n (theta_n - theta_i)."""
        import torch

        loss = self.val_losses(cohort, models)
        own = {k: v[:, :1].flatten(2) for k, v in models.items()}
        got = {k: v[:, 1:].flatten(2) for k, v in models.items()}
        # ||theta_n - theta_i|| over all parameter tensors, one tensor's differences in memory at a time
        dist = torch.sqrt(sum(torch.linalg.vector_norm(got[k] - own[k], dim=2) ** 2 for k in models))  # (c, M)
        gain = (loss[:, :1] - loss[:, 1:]).clamp_min(0.0)                                  # Eq. 3, max(0, .)
        w = torch.where(dist > 0, gain / dist.clamp_min(torch.finfo(dist.dtype).tiny), torch.zeros(()))
        total = w.sum(1, keepdim=True)
        w = torch.where(total > 0, w / total.clamp_min(torch.finfo(w.dtype).tiny), torch.zeros(()))  # Eq. 6
        # Eq. 7: theta_i + sum_n w_n (theta_n - theta_i) = (1 - sum_n w_n) theta_i + sum_n w_n theta_n
        keep = 1.0 - w.sum(1)
        return w, {k: (torch.einsum("cm,cmd->cd", w, got[k]) + keep[:, None] * own[k][:, 0]).view_as(v[:, 0])
                   for k, v in models.items()}

    def run_round(self, t, cohort, gen):
        import torch

        chosen = self.select(t, cohort, gen)
        rows = torch.cat([cohort[:, None], chosen], 1)                   # its own model, then the M received
        models = {k: v[rows] for k, v in self.private.values.items()}  # (c, 1 + M, ...): stored at round start
        for k in self.names:
            self.traffic.send(k, models[k][:, 1:])  # M models down to each cohort client
        w, start = self.first_order_step(cohort, models)
        theta, loss, _ = self.cohort_sgd(start, cohort, gen, **self.round_schedule())
        for k in self.names:
            self.traffic.receive(k, theta[k])       # its trained model up
        self.traffic.receive("fomo_weights", w)    # its M weights up (P's update)
        self.private.scatter(cohort, theta)
        self.affinity[cohort[:, None], chosen] += w  # Alg. 1: P_i,n += w_n
        return loss

    # ------------------------------------------------------------------ models for clients
    def own_models(self, rows) -> dict:
        return self.private.gather(rows)

    def mean_model(self) -> dict:
        """The models of the train clients with labels (those that upload) averaged by their train-split sizes (fit
        and validation samples together, so that predict, which carves no validation split, rebuilds the same
        mean)."""
        models = {k: v[self.pool] for k, v in self.private.values.items()}
        return weighted_mean(self.store, self.pool, models, whole_train_split=True)

    def new_clients(self, clients: np.ndarray, gen) -> dict:
        start = self.mean_model()
        if not self.cfg.new_client_epochs:
            return stack(start, len(clients))
        return self.train_clients(start, clients, gen, epochs=self.cfg.new_client_epochs)

    def protocol(self, new: bool) -> dict:
        return epochs_protocol(new, self.cfg.new_client_epochs, "its own model as last trained",
                               "train clients' mean model trained {e} epochs", "train clients' mean model")

    def state(self):
        return {"private": self.private.state(), "affinity": self.affinity.detach().clone()}

    def load_state(self, state):
        self.private.load_state(state["private"], self.device)
        self.affinity = state["affinity"].to(self.device)

    def weights(self):
        return {"private": cpu_tree(self.private.state()), "affinity": self.affinity.detach().cpu()}

    def load_weights(self, weights):
        self.private.load_state(weights["private"], self.device)
        if "affinity" in weights:
            self.affinity = weights["affinity"].to(self.device)
