"""Per-client drift state kept across rounds, and local SGD corrected by it (SCAFFOLD, FedDyn).

SCAFFOLD (Karimireddy et al., ICML 2020, Alg. 1) keeps a control variate c_i on every client and
c on the server, and each local step follows ``g_i(y) - c_i + c`` (line 10). FedDyn (Acar et al.,
ICLR 2021, Alg. 1) keeps the gradient ``grad L_k(theta_k^{t-1})`` of every client's last local
model and a server state h, and each client minimizes
``L_k(theta) - <grad L_k(theta_k^{t-1}), theta> + alpha/2 ||theta - theta^{t-1}||^2``, whose
gradient is the batch gradient plus the constant ``-grad L_k(theta_k^{t-1})`` plus FedProx's
proximal term. Both are one block: a model-shaped tensor per client (a
:class:`~pfl_cli.fl.client_state.ClientState` row over every client of the store, starting at
zero, as both papers initialize it), one on the server, and cohort local SGD whose gradient gets
a per-client constant ``correction`` (:func:`pfl_cli.fl.cohort.local_sgd`) and optionally a
proximal term, vectorized over the cohort like every other algorithm's local steps.

The state is the algorithm's: it joins ``state()`` (checkpoints, so ``--resume`` continues with
it byte for byte) and not ``weights()`` (``model.pt`` serves the global model; no client's
prediction reads its drift state).
"""

from __future__ import annotations

import numpy as np

from pfl_cli.errors import InputError
from pfl_cli.fl.params import broadcast


class DriftState:
    """Mixin of a FedAvg-family algorithm with a per-client drift tensor (``self.drift``) and a server one
    (``self.server_drift``), both shaped like the global model and starting at zero."""

    drift_paper = ""  # the paper and line whose server update needs the whole population, for the refusal

    def build_drift(self) -> None:
        from pfl_cli.fl.client_state import ClientState

        zeros = {k: v.new_zeros(v.shape) for k, v in self.global_params.items()}
        self.drift = ClientState(zeros, self.store.num_clients, self.store.partition_sha)
        self.server_drift = {k: v.clone() for k, v in zeros.items()}

    def population(self) -> int:
        """N: the train clients with labels, the population the cohorts are drawn from uniformly."""
        from pfl_cli.fl.store import ROLE_TRAIN

        train = np.asarray(self.store.clients(ROLE_TRAIN))
        return int(np.asarray(self.store.labeled)[train].sum())

    def check_trainable(self, train_clients) -> None:
        """Refuse a cohort larger than the population: the server update divides by N and assumes |S| <= N
        clients drawn uniformly without replacement; pflx would otherwise cut the cohort silently."""
        super().check_trainable(train_clients)
        n, c = self.population(), self.cfg.clients_per_round
        if c is not None and c > n:
            raise InputError(f"clients_per_round must be at most the {n} train clients with labels for "
                             f"{self.name} (its server state moves by |S|/N, {self.drift_paper}); got {c}. "
                             f"Use --clients-per-round {n} (every client) or fewer.")

    def local_steps_of(self, cohort):
        """K_i: the local steps each cohort client takes this round (``local_steps``, or its epochs' batches)."""
        import torch

        epochs = self.round_schedule().get("epochs")
        if epochs:
            return self.epoch_steps(cohort, epochs)[1].sum(1).to(torch.float32)
        return torch.full((len(cohort),), float(self.cfg.local_steps), device=self.device)

    def corrected_sgd(self, cohort, gen, correction: dict, *, prox_mu: float = 0.0):
        """Local SGD of ``cohort`` from the global model, each step's gradient plus ``correction`` (c, *shape)
        and ``prox_mu * (theta - global)``; returns the models (c, ...), each client's mean loss and K_i."""
        from pfl_cli.fl.cohort import local_sgd

        c = len(cohort)
        batches = self.local_batches(cohort, gen, **self.round_schedule())
        anchor = broadcast(self.global_params, c) if prox_mu else None
        theta, loss = local_sgd(self.net, broadcast(self.global_params, c), self.store, batches, prox_mu=prox_mu,
                                prox_anchor=anchor, correction=correction, **self.sgd_options())
        return theta, loss, self.local_steps_of(cohort)

    def state(self):
        return {**super().state(), "drift": self.drift.state(),
                "server_drift": {k: v.detach().clone() for k, v in self.server_drift.items()}}

    def load_state(self, state):
        super().load_state(state)
        self.drift.load_state(state["drift"], self.device)
        self.server_drift = {k: v.to(self.device) for k, v in state["server_drift"].items()}


def uniform_mean(theta: dict) -> dict:
    """(1/|S|) sum over the cohort axis: both papers' server average (SCAFFOLD Alg. 1 lines 16-17, FedDyn Alg. 1)."""
    return {k: v.mean(0) for k, v in theta.items()}
