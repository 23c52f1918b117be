"""FedAMP (Huang, Chu, Zhou, Wang, Liu, Pei, Zhang, AAAI 2021, Alg. 1): attentive message passing.

Every client i keeps a personalized model w_i (all start at the initial model w^0). In iteration k
the server builds each client's cloud model ``u_i = sum_j xi_ij w_j`` from the models it holds,
``xi_ij = alpha_k A'(||w_i - w_j||^2)`` (j != i), ``xi_ii = 1 - sum_{j != i} xi_ij``, with the
attention-inducing function ``A(x) = 1 - exp(-x / sigma)`` of the paper's experiments, so
``A'(x) = exp(-x / sigma) / sigma`` (:mod:`pfl_cli.fl.attention`: two matmuls over
the cohort's flattened models); the client then solves
``argmin_w F_i(w) + lambda / (2 alpha_k) ||w - u_i||^2`` (the proximal step of Alg. 1) by local SGD
from its own w_i, the proximal gradient joining each step as FedProx's does (the cohort engine,
vectorized over the cohort), and sends its new w_i back.

Partial participation: the paper is cross-silo and every client takes part in every iteration
(``clients_per_round`` null, the default: then pflx is the paper's Alg. 1). With a cohort, pflx
builds u_i from the cohort's own models (the ones the round exchanges, as PFLlib does), so
``xi`` is (c, c) and the clients outside the round neither send nor receive.

Personalized models are per-client state (:class:`~pfl_cli.algorithms.base.PrivateState`: in the
checkpoint and in ``model.pt``); a trained client is served its own w_i. A new client (no w_i for
the attention to read) takes the uniform mean of the trained clients' personalized models as its
cloud model u and solves its client problem from it for ``new_client_epochs`` epochs (the paper
serves no new clients; this is its client step with the attention of a client equally far from
all). Exchanged: u_i down and w_i up (2 x |client net| floats a cohort client and round). No DP
variant.

Departures, said here: alpha_k is a constant over the rounds (the paper's analysis lets it vary with the
iteration k; PFLlib keeps it constant too). The paper sets alpha_k, sigma and lambda per data set (its
values were not read: the text was not at hand); alpha_k = lambda = 1 are PFLlib's defaults (``main.py``:
``-alk 1.0``, ``-lam 1.0``; FL-bench has no FedAMP), sigma is pflx's 100, not PFLlib's 1 (issue 40).

Why sigma = 100: A'(x) = exp(-x / sigma) / sigma is at most 1 / sigma, so the off-diagonal weights of a
cohort of c sum to at most alpha_k (c - 1) / sigma, and u_i stays a convex combination of the models
(xi_ii >= 0, the weighted average the message passing is read as) for every cohort of up to
1 + sigma / alpha_k clients: 101 at the defaults, 2 at PFLlib's sigma = 1. Measured on the defaults suite's
digits IID cell (24 clients, pflx's digits MLP of 2,410 floats): at sigma = 1 the first round after the
common start (squared distances ~0.24) gave xi_ii down to -17.8, u_i ~ w_i + 18 (mean of the others - w_i),
which threw the models apart (squared distances 22 a round later), and from then on every xi_ij was below
1e-6: each client trained alone with a proximal term to its own model (78.0 / 86.1 % after 100 rounds,
between Local's 68.5 and FedAvg's 97.0 / 92.6). At sigma = 100 every round's xi_ii stayed >= 0.77
(off-diagonal mass 0.22-0.23) and the cell reached 94.4 / 94.4 %; rotated digits 85.6 / 87.0 % against
73.1 / 60.2 %, two classes a client 99.5 / 100.0 against 99.3 / 100.0 (seed 0, the best validation round).
For these models the distances under the coupling (0.2-6) are small beside sigma, so the attention is
close to uniform; a larger model (more floats apart) or a sharper attention wants sigma set for it, and
``pflx tune`` searches sigma over [10, 1000].
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import numpy as np

from pfl_cli.algorithms.base import PrivateState
from pfl_cli.algorithms.fedavg import FedAvg, FedAvgRoundConfig
from pfl_cli.fl.config import check_own_keys, key
from pfl_cli.fl.params import stack

HUANG = "Huang et al. (AAAI 2021)"


@dataclass(frozen=True)
class FedAMPConfig(FedAvgRoundConfig):
    """FedAMP's keys: the round's local work, the attention (alpha_k, sigma) and the proximal weight lambda."""

    algorithm: str = key("fedamp", "the algorithm these keys configure")
    clients_per_round: Optional[int] = key(None, "cohort size of every round (null: every train client)",
                                           f"{HUANG} §3, Alg. 1: cross-silo, every client in every iteration")
    alpha_k: float = key(1.0, "alpha_k: step of the attentive message passing (xi_ij = alpha_k A'(.))",
                         f"{HUANG} §4, Alg. 1: alpha_k, set per data set; 1, PFLlib's default (main.py -alk 1.0)")
    sigma: float = key(100.0, "sigma: scale of the attention function A(x) = 1 - exp(-x / sigma)",
                       f"{HUANG} §5: A(x) = 1 - exp(-x / sigma), sigma set per data set; pflx: 100, so that u_i "
                       "is a convex combination for cohorts up to 1 + sigma / alpha_k = 101 clients (PFLlib's 1 "
                       "extrapolates, then vanishes on pflx's models: the module docstring's measurements)")
    lam: float = key(1.0, "lambda: weight of the attention penalty; the client's proximal weight is lambda / alpha_k",
                     f"{HUANG} §4, Alg. 1: argmin F_i(w) + lambda/(2 alpha_k) ||w - u_i||^2; 1, PFLlib's default "
                     "(main.py -lam 1.0)")
    new_client_epochs: int = key(20, "epochs a new client solves its client problem from the mean model",
                                 "thesis §4.4, App. B.1.2: new clients fine-tune 20 epochs")

    def validate(self) -> None:
        super().validate()
        check_own_keys(self, {"alpha_k": "a finite number > 0", "sigma": "a finite number > 0",
                              "lam": "a finite number >= 0"})


class FedAMP(PrivateState, FedAvg):
    name = "fedamp"
    # under --secagg (pfl_cli.fl.secagg)
    individual_reads = "each client's model, weighed against every other cohort model (the attention of its cloud models)"
    paper = "FedAMP: Huang et al., AAAI 2021 (Alg. 1, attentive message passing)"
    new_client_protocol = "the mean personalized model, trained new_client_epochs with the proximal term to it"
    config = FedAMPConfig
    dp_unit = None  # no DP variant
    models_upload = False  # each client's own model goes up, not FedAvg's delta from one global model
    inert_keys = {k: "its server builds each client's cloud model by attention (Huang et al. 2021, Alg. 1): there is "
                  "no global step" for k in ("server_lr", "server_momentum")}
    search_space = {"lr": "log:1e-3:1", "lam": "log:0.01:10", "sigma": "log:10:1000"}
    search_space_source = (f"{HUANG} §5: lambda and sigma (and alpha_k) set per data set; pflx searches lambda over "
                           "a log range around 1 and sigma over one around its default 100 (below ~c, the cohort "
                           "size, the weights of close models sum past 1 and u_i extrapolates) with the client lr")
    tune_group = "train"

    def build(self) -> None:
        super().build()
        self.personalized = True
        self.private = self.new_private_state(self.global_params)  # w_i^0 = w^0 for every client

    def prox_weight(self) -> float:
        return float(self.cfg.lam) / float(self.cfg.alpha_k)

    def run_round(self, t, cohort, gen):
        from pfl_cli.fl.attention import cloud_models
        from pfl_cli.fl.cohort import local_sgd

        w = self.private.gather(cohort)
        u, _ = cloud_models(w, float(self.cfg.alpha_k), float(self.cfg.sigma))        # the server's message step
        batches = self.local_batches(cohort, gen, **self.round_schedule())
        mu = self.prox_weight()
        theta, loss = local_sgd(self.net, w, self.store, batches, prox_mu=mu, prox_anchor=u if mu else None,
                                **self.sgd_options())                                   # argmin F_i + mu/2 ||w-u_i||^2
        for k in u:
            self.traffic.send(k, u[k])       # each client's own cloud model
            self.traffic.receive(k, theta[k])
        self.private.scatter(cohort, theta)
        self.global_params = self.mean_model()
        return loss

    def mean_model(self) -> dict:
        """The uniform mean of the trained clients' personalized models (a new client's cloud model)."""
        has = self.private.has
        if not bool(has.any()):
            return {k: v.clone() for k, v in self.global_params.items()}
        return {k: v[has].mean(0) for k, v in self.private.values.items()}

    def own_models(self, rows):
        return self.private.gather(rows)

    def new_clients(self, clients: np.ndarray, gen):
        """Its client problem with u the mean model, from u, for ``new_client_epochs`` epochs."""
        if not self.cfg.new_client_epochs:
            return stack(self.global_params, len(clients))
        mu = self.prox_weight()
        return self.train_clients(self.global_params, clients, gen, epochs=self.cfg.new_client_epochs,
                                  prox_mu=mu, prox_anchor=self.global_params if mu else None)

    def protocol(self, new: bool) -> dict:
        from pfl_cli.algorithms.base import epochs_protocol

        return epochs_protocol(new, self.cfg.new_client_epochs, "its own personalized model",
                               "the mean personalized model trained {e} epochs with the proximal term",
                               "the mean personalized model")
