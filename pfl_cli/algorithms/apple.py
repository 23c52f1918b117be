"""APPLE (Luo & Wu, IJCAI 2022): adaptive personalized cross-silo FL with directed relationship vectors.

Every train client i keeps a core model theta_i (all start at the same initial model) and a directed
relationship (DR) vector p_i over the N train clients' core models (all start at p^0, the clients'
train-set sizes normalized to sum to one). Its personalized model is

    theta_hat_i = sum_j p_ij theta_j                                   (§3, the personalized model)

In a round, a cohort client downloads the other clients' core models as the server holds them, and
trains theta_i and p_i together by local SGD on

    L_i(theta_hat_i) + lambda(r) ||p_i - p^0||^2                        (§3, the loss with its proximal term)

where the other clients' core models stay fixed (only theta_i moves among the cores, by the chain
rule p_ii grad L_i; p_ij moves by <grad L_i, theta_j>), then uploads theta_i; p_i never leaves the
client. lambda(r) = mu s(r / L) for rounds r < L = ``apple_reg_rounds`` x ``rounds`` and 0 after: the
proximal term holds p_i near p^0 (a FedAvg-like mixture: the global objective) early and lets it go
(the local objective) later; s is ``exponential`` (1e-3 ** (r / L), the authors' default) or ``cosine``
((cos(pi r / L) + 1) / 2). The cohort trains in parallel from the core models stored at the start of
the round: theta_hat for the whole cohort is one matrix product (c, N) x (N, |theta|) over the stacked,
flattened core models a step, and the DR gradient one more (the work APPLE adds over FedAvg: a weighted sum
of N models per local step and its transpose); the gradient at theta_hat is one backward of the client net
(the chain rule to theta_i and p_i is written out, not traced through the sum).

Partial participation: the paper is cross-silo and every client trains every round (the authors'
``train_APPLE.py`` loops over all clients), so ``clients_per_round`` defaults to every train client;
with fewer, a client outside the cohort keeps its core model and DR vector, the others read its core
model as last uploaded, and lambda(r) follows the global round r.

A train client's personalized model is theta_hat_i from its DR vector and the current core models.
A client unseen in training has no DR vector (the paper serves none): it takes p^0's mixture of the
core models (APPLE's starting personalized model: the core models weighted by train-set size) and
trains it for ``new_client_epochs`` epochs on its data (pflx's fine-tuning protocol for new clients).

Exchanged: the N - 1 other core models down, the client's core model up (N x |client net| floats a
cohort client and round; the paper's §4 bandwidth-limited variant that downloads fewer is not built).

Defaults are the authors' code (``utils/utils.py`` of github.com/ljaiverson/pFL-APPLE, re-read for issue
40; the paper's text was not at hand to check its sections): core lr 0.01 (``--lr_net``) with momentum
0.9 on both (``train_APPLE.py``'s one SGD optimizer), DR lr 0.001 (``--lr_coef``), mu 0.1, L = 0.1 of the
rounds (``--reg_last_round_over_total_round``), the exponential schedule, the proximal term mu ||p - p^0||^2
without a 1/2 (``utils/losses.py``), and the DR vector left unconstrained (no projection to the simplex:
``ClientNet.ps`` is a free parameter). The client clip and weight decay apply to the core model's gradient
only. The authors' runs take 5 local epochs of batch 256 a round for 160 rounds over 12 clients of
thousands of samples; pflx's round is the thesis's k = 50 steps of batch 32. Departure, said here: the
authors' ``train_APPLE.py`` draws every client's initial core model separately (one ``Net()`` each); pflx
starts every core model at the one seeded initial model, as its other algorithms start their clients.
Departure of PFLlib (``clientapple.py``), where pflx follows the authors: PFLlib multiplies the core
lr by the number of clients, starts p at the uniform vector, averages the DR gradient over parameter
tensors (a mean of element-wise products rather than the inner product) and applies the schedule
(cosine, L = all rounds) once a round to lambda alone.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional

import numpy as np

from pfl_cli.algorithms.base import Algorithm, PrivateState, epochs_protocol
from pfl_cli.errors import ConfigError, InputError
from pfl_cli.fl.config import TrainConfig, check_own_keys, inert_refusal, key
from pfl_cli.fl.params import cpu_tree, stack

CORE = "core."  # private: a client's core model
DR = "p"        # private: its directed relationship vector over the train clients with labels
SCHEDULES = ("exponential", "cosine")
AUTHORS = "Luo & Wu, APPLE (IJCAI 2022), authors' code utils/utils.py"


@dataclass(frozen=True)
class AppleConfig(TrainConfig):
    """APPLE's keys: the round, the DR vectors' step and the proximal term's schedule."""

    algorithm: str = key("apple", "the algorithm these keys configure")
    rounds: int = key(5000, "communication rounds", "thesis §4.4, App. B.1.2: all methods but Local train 5000 rounds")
    clients_per_round: Optional[int] = key(None, "cohort size of every round (null: every train client)",
                                           "Luo & Wu, APPLE (IJCAI 2022): cross-silo, every client trains every "
                                           "round (authors' code train_APPLE.py)")
    local_steps: int = key(50, "k: client SGD steps per round", "thesis §4.4: k = 50")
    local_epochs: Optional[int] = key(None, "epochs of local SGD per round instead of local_steps (null: steps)")
    lr: float = key(0.01, "step size of the client's core model", f"{AUTHORS}: lr_net 0.01")
    momentum: float = key(0.9, "SGD momentum of the core model and the DR vector (buffers reset every round)",
                          "Luo & Wu, APPLE (IJCAI 2022), authors' code train_APPLE.py: one SGD optimizer, momentum 0.9")
    apple_dr_lr: float = key(0.001, "step size of the client's directed relationship vector p_i",
                             f"{AUTHORS}: lr_coef 0.001")
    apple_mu: float = key(0.1, "mu: weight of the proximal term on p_i toward p^0 (0: none)", f"{AUTHORS}: mu 0.1")
    apple_reg_rounds: float = key(0.1, "L as a share of the rounds: the proximal term's weight reaches 0 at round L",
                                  f"{AUTHORS}: reg_last_round_over_total_round 0.1")
    apple_schedule: str = key("exponential", "exponential (mu 1e-3^(r/L)) | cosine (mu (cos(pi r/L) + 1) / 2)",
                              f"{AUTHORS}: scheduler exponential", choices=SCHEDULES)
    new_client_epochs: int = key(20, "epochs a new client trains p^0's mixture of the core models on its data",
                                 "PeFLL (ICLR 2024) App. A.2: new clients of the baselines train 20 local epochs")

    def validate(self) -> None:
        super().validate()
        check_own_keys(self, {"apple_dr_lr": "a finite number > 0", "apple_mu": "a finite number >= 0",
                              "apple_reg_rounds": "a fraction in (0, 1]", "new_client_epochs": "an integer >= 0"})
        if self.apple_schedule not in SCHEDULES:
            raise ConfigError(f"apple_schedule must be one of {', '.join(SCHEDULES)} for apple; got "
                              f"{self.apple_schedule!r}. Use --set apple_schedule=exponential.")


def reg_weight(t: int, rounds: int, mu: float, share: float, schedule: str) -> float:
    """lambda(r): mu s(r / L) before round L = int(share x rounds), 0 from L on (authors' code, utils/losses.py).

    >>> reg_weight(0, 100, 0.1, 0.1, "cosine"), reg_weight(5, 100, 0.1, 0.1, "cosine"), reg_weight(10, 100, 0.1, 0.1, "cosine")
    (0.1, 0.05, 0.0)
    """
    last = int(rounds * share)
    if mu == 0 or t >= last:
        return 0.0
    if schedule == "cosine":
        return round((math.cos(math.pi * t / last) + 1) / 2 * mu, 15)
    return mu * 1e-3 ** (t / last)


class Apple(PrivateState, Algorithm):
    name = "apple"
    individual_reads = "each client's core model, which other clients download one by one"  # under --secagg
    paper = "APPLE: Luo & Wu, IJCAI 2022 (§3)"
    new_client_protocol = "p^0's mixture of the core models trained new_client_epochs (no DR vector of its own)"
    config = AppleConfig
    dp_unit = None  # no DP variant: its core model goes up in the clear
    not_distributed = "every cohort client reads all N core models in one process"
    search_space = {"lr": "log:1e-3:1", "apple_dr_lr": "log:1e-4:1e-1", "apple_mu": "choice:0,0.01,0.1,1"}
    search_space_source = ("Luo & Wu, APPLE (IJCAI 2022): the core and DR learning rates, and the proximal weight "
                           "mu of its study of the loss scheduler (0 switches the term off)")
    tune_group = "train"

    def build(self) -> None:
        import torch

        from pfl_cli.fl.store import ROLE_TRAIN

        self.net = self.client_net()
        init = {k: v.detach().clone() for k, v in self.net.named_parameters()}
        self.names = list(init)
        train = np.asarray(self.store.clients(ROLE_TRAIN))
        self.pool = torch.as_tensor(train[np.asarray(self.store.labeled)[train]], device=self.device)
        self.position = torch.full((self.store.num_clients,), -1, dtype=torch.int64, device=self.device)
        self.position[self.pool] = torch.arange(len(self.pool), device=self.device)
        size = (self.store.fit.length + self.store.val.length)[self.pool].to(torch.float32)
        self.p0 = size / size.sum().clamp_min(1.0)  # p^0: train-set sizes normalized (authors' init_pss)
        self.private = self.new_private_state({**{CORE + k: v for k, v in init.items()}, DR: self.p0})

    @staticmethod
    def resolve_arch(cfg, store) -> dict:
        from pfl_cli.fl.store import ROLE_TRAIN

        arch = Algorithm.resolve_arch(cfg, store)
        train = np.asarray(store.clients(ROLE_TRAIN))
        arch["apple"] = {"core_models": int(np.asarray(store.labeled)[train].sum())}
        return arch

    @staticmethod
    def floats_per_client_round(arch: dict) -> int:
        """The N - 1 other core models down, the client's core model up."""
        from pfl_cli.models import num_parameters

        return int(arch["apple"]["core_models"]) * num_parameters(arch["client"])

    def check_trainable(self, train_clients) -> None:
        super().check_trainable(train_clients)
        if len(self.pool) < 2:
            raise InputError(f"apple: each client mixes the core models of the train clients; this partition has "
                             f"{len(self.pool)} train client with labels. Give it at least 2.")
        cfg, default = self.cfg, type(self.cfg)()
        last = int(cfg.rounds * cfg.apple_reg_rounds)
        inert = {}
        if last == 0:
            why = (f"its proximal term never acts in {cfg.rounds} rounds (L = int(rounds x apple_reg_rounds) = 0: "
                   "lambda(r) is 0 from round L on)")
            inert = {k: why for k in ("apple_mu", "apple_schedule", "apple_reg_rounds")}
        elif cfg.apple_mu == 0:
            inert = {k: "apple_mu is 0: there is no proximal term to schedule" for k in ("apple_schedule",
                                                                                           "apple_reg_rounds")}
        elif last == 1:
            inert = {"apple_schedule": "L = int(rounds x apple_reg_rounds) = 1: the term acts in round 0 only, "
                                       "where both schedules weigh it mu"}
        for name, why in inert.items():
            if getattr(cfg, name) != getattr(default, name):
                raise inert_refusal(name, "apple", why, getattr(cfg, name))

    def cores(self) -> dict:
        """theta_j of every train client with labels (N, ...), as last uploaded (the initial model before)."""
        return {k: self.private.values[CORE + k][self.pool] for k in self.names}

    @staticmethod
    def mix(p, cores: dict) -> dict:
        """theta_hat = sum_j p_j theta_j for each row of ``p`` (c, N): one einsum over the stacked core models."""
        import torch

        return {k: torch.einsum("cn,n...->c...", p, v) for k, v in cores.items()}

    def run_round(self, t, cohort, gen):
        import torch

        from pfl_cli.fl.batches import ActiveMean
        from pfl_cli.fl.cohort import batch_loss, cohort_forward, resolve_cohort_exec, sgd_update_

        cfg = self.cfg
        shapes = {k: v.shape[1:] for k, v in self.private.values.items() if k.startswith(CORE)}
        sizes = [s.numel() for s in shapes.values()]
        cores = self.cores()                                    # downloaded at the start of the round, fixed
        flat = torch.cat([cores[k].flatten(1) for k in self.names], 1)             # (N, D): the stacked core models
        row = self.private.gather(cohort)
        core = {"core": torch.cat([row[CORE + k].flatten(1) for k in self.names], 1)}  # (c, D): its own, trained
        p = row[DR]
        me = self.position[cohort]
        ar = torch.arange(len(cohort), device=self.device)
        at_start = flat[me]
        lam = reg_weight(t, cfg.rounds, float(cfg.apple_mu), float(cfg.apple_reg_rounds), cfg.apple_schedule)
        how = resolve_cohort_exec(cfg.cohort_exec, self.net, self.device)

        def unflat(v) -> dict:
            return {k: part.view(len(v), *shapes[CORE + k]) for k, part in zip(self.names, v.split(sizes, 1))}

        def forward(params, x):
            return cohort_forward(self.net, params, x, how)

        batches, _ = self.draw_batches(cohort, gen, **self.round_schedule())
        buf = {"core": torch.zeros_like(core["core"])}
        p_buf = torch.zeros_like(p)
        losses = ActiveMean(len(cohort), self.device)
        options = self.sgd_update_options()
        momentum, dr_lr = float(options["momentum"]), float(cfg.apple_dr_lr)
        for index, mask, active in batches:
            # theta_hat = sum_j p_j theta_j (one product over the stacked flattened core models), the client's own
            # core at its current value; the chain rule by hand: d/d theta_i = p_ii g, d/d p_j = <g, theta_j>,
            # g the gradient at theta_hat (one backward of the net, as FedAvg's step takes)
            with torch.no_grad():
                own = p[ar, me]
                moved = core["core"] - at_start
                hat = (p @ flat + own[:, None] * moved).requires_grad_(True)
            loss = batch_loss(forward, unflat(hat), self.store, index, mask)
            g = torch.autograd.grad(loss.sum(), hat)[0]
            with torch.no_grad():
                g_p = g @ flat.T
                g_p[ar, me] += (g * moved).sum(1)
                if lam:
                    g_p += 2.0 * lam * (p - self.p0)              # d/dp of lambda(r) ||p - p^0||^2
                sgd_update_(core, {"core": g * own[:, None]}, buf, active=active, **options)
                sel = None if active is None else active[:, None].to(g_p.dtype)
                if sel is not None:
                    g_p *= sel
                if momentum:
                    p_buf.mul_(momentum if sel is None else 1.0 + (momentum - 1.0) * sel).add_(g_p)
                    p -= dr_lr * (p_buf if sel is None else p_buf * sel)
                else:
                    p -= dr_lr * g_p
            losses.add(loss, active)
        trained = unflat(core["core"])
        for k in self.names:
            others = cores[k].unsqueeze(0).expand(len(cohort), *cores[k].shape)[:, :-1]  # N - 1 models to each
            self.traffic.send(k, others)
            self.traffic.receive(k, trained[k])
        self.private.scatter(cohort, {**{CORE + k: trained[k] for k in self.names}, DR: p})
        return losses.mean()

    # ------------------------------------------------------------------ models for clients
    def own_models(self, rows) -> dict:
        return self.mix(self.private.values[DR][rows], self.cores())

    def new_clients(self, clients: np.ndarray, gen) -> dict:
        start = {k: v[0] for k, v in self.mix(self.p0[None, :], self.cores()).items()}
        if not self.cfg.new_client_epochs:
            return stack(start, len(clients))
        return self.train_clients(start, clients, gen, epochs=self.cfg.new_client_epochs)

    def protocol(self, new: bool) -> dict:
        return epochs_protocol(new, self.cfg.new_client_epochs, "its DR vector's mixture of the core models",
                               "p0 mixture of the core models trained {e} epochs", "p0 mixture of the core models")

    def state(self):
        return {"private": self.private.state()}

    def load_state(self, state):
        self.private.load_state(state["private"], self.device)

    def weights(self):
        return {"private": cpu_tree(self.private.state())}

    def load_weights(self, weights):
        self.private.load_state(weights["private"], self.device)
