"""FedPAC (Xu, Tong, Huang, ICLR 2023): feature alignment and classifier collaboration.

The client net is a feature extractor f (the body, shared) and a linear classifier phi (the head,
one per client; the split is :mod:`pfl_cli.fl.split`). A round, for every cohort client i
(the paper's Algorithm 1):

1. it receives the global body and the global class prototypes c_k, and with the received body
   computes its feature statistics (§4, classifier collaboration): h_i[k] = p_{i,k} mu_{i,k}, its class prior times its
   class mean of f(x), and the variance term V_i = sum_k p_{i,k} E[||f(x)||^2 | k] -
   sum_k p_{i,k}^2 ||mu_{i,k}||^2;
2. it trains its head for ``head_epochs`` epochs with the body frozen (step size ``head_lr``), then the
   body for ``body_epochs`` epochs with the head frozen on cross-entropy plus the feature alignment
   lambda * ||f(x) - c_y||^2 (§4, the local objective; from the second round on, once prototypes
   exist, and only for the classes that have one);
3. it uploads body, head, its class prototypes (class means of f(x) with the trained body) and
   its statistics (h_i, V_i and its class counts);
4. the server averages the bodies weighted by data size, merges the prototypes into the global
   ones, c_k = sum_i n_{i,k} c_{i,k} / sum_i n_{i,k} (§4; a class no cohort client holds keeps its
   last prototype), and per client solves the paper's quadratic program (§4, classifier
   collaboration) for the combination weights

       alpha_i = argmin_{alpha in simplex} || sum_j alpha_j (h_i - h_j) ||^2 + sum_j alpha_j^2 V_j / n_j

   over the cohort j, sending back the personalized head phi_i = sum_j alpha_{ij} phi_j (the
   client's model until its next round, and the head its next round starts from).

The program is solved for the whole cohort at once (:func:`combination_weights`: a batched
primal-dual interior-point solve, then the exact solution on the support it finds where the KKT
conditions confirm it).

Exchanged per cohort client and round: down the body, the C x d global prototypes and the
personalized head; up the body, the head, the C x d prototypes, the C x d statistics h_i, V_i and
the C class counts (:meth:`FedPAC.floats_per_client_round`).

A new client (unseen in training): the global body with a head from the initial one trained
``new_client_epochs`` epochs on its own data, the body frozen (pflx's protocol for private heads,
PeFLL App. A.2's 20 epochs; the paper evaluates training clients only).

Defaults: the authors' code (the paper's App. A.5 points to it): ``options.py`` lam 1.0, local_epoch 5
(body epochs), local_bs 50, lr 0.01, momentum 0.5; ``methods/fedpac.py`` one classifier epoch at lr
0.1 and weight decay 5e-4 (lambda_theta 2.5e-4 here, pflx adding 2 * lambda_theta * param). Their
lam 1.0 weighs the mean over the d feature coordinates (below), so ``fedpac_lambda`` defaults to 1 / d
on the paper's squared norm, the same strength. Measured on the ring task (100 clients, 10 a round,
200 rounds, seed 1): lambda = 1 / d = 1 / 32 gives the train clients 0.833, lambda = 1 on the squared
norm 0.461.

Departures of the peers from the paper, where pflx follows the paper:

- the alignment term: the authors' code and PFLlib (``clientpac.py`` line 78) take ``MSELoss`` of f(x) and
  c_y, the mean over the d coordinates, where the paper's regularizer has the squared norm; their
  lambda is pflx's ``fedpac_lambda * d`` (PFLlib's ``-lam 1`` on a 100-wide feature is
  ``fedpac_lambda=0.01``, pflx's default there);
- global prototypes: PFLlib (``serverpac.py`` line 189, ``proto_aggregation``) averages the clients'
  prototypes uniformly; the paper (and the authors' code) weighs them by class counts;
- combination weights: the authors' code and PFLlib solve the program with cvxpy after dropping
  eigenvalues below 0.01 when the matrix is not numerically PSD and zero weights below 1e-3
  (``serverpac.py`` line 242); PFLlib's ``add_heads`` does not renormalize the rest; pflx takes the
  program's exact minimizer. Where a cohort client gets no solution PFLlib falls back to
  ``uploaded_heads[cid]`` (line 162), indexing the cohort's list by client id.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import numpy as np

from pfl_cli.algorithms.base import PrivateState, epochs_protocol
from pfl_cli.algorithms.partial import _GlobalModel
from pfl_cli.errors import ConfigError
from pfl_cli.fl.config import TrainConfig, check_own_keys, key
from pfl_cli.fl.params import stack, weighted_mean
from pfl_cli.fl.prototypes import KeepsGlobalPrototypes
from pfl_cli.fl.prototypes import aligned_steps as fedpac_steps  # noqa: F401 - the local steps (§4), here too

NET = "net."
SRC = "FedPAC (ICLR 2023) authors' code"


# ----------------------------------------------------------------------------- the combination weights
def _exact_on_support(P, alpha, tol: float):
    """The minimizer of a^T P a over the simplex restricted to each row's support, where KKT confirms it.

    On a support S the optimum solves P_SS a_S = mu 1 with 1^T a_S = 1 (a_S = P_SS^-1 1 / 1^T P_SS^-1 1);
    it is the global optimum when a_S >= 0 and every gradient entry off S is >= mu. Rows where the
    solve fails or KKT does not hold keep ``alpha``.
    """
    import torch

    b, m, _ = P.shape
    on = alpha > tol
    eye = torch.eye(m, dtype=P.dtype, device=P.device).expand(b, m, m)
    both = on.unsqueeze(-1) & on.unsqueeze(-2)
    A = torch.where(both, P, eye)
    rhs = on.to(P.dtype).unsqueeze(-1)
    z, info = torch.linalg.solve_ex(A, rhs)
    z = z.squeeze(-1) * on
    total = z.sum(-1, keepdim=True)
    exact = z / total
    grad = 2.0 * torch.einsum("bij,bj->bi", P, exact)
    mu = (grad * exact).sum(-1, keepdim=True)
    scale = P.diagonal(dim1=-2, dim2=-1).abs().amax(-1, keepdim=True).clamp_min(1e-300)
    ok = ((info == 0) & (total.squeeze(-1) > 0) & torch.isfinite(exact).all(-1) & (exact >= -1e-12).all(-1)
          & ((grad - mu >= -1e-9 * scale) | on).all(-1))
    return torch.where(ok.unsqueeze(-1), exact.clamp_min(0.0) / exact.clamp_min(0.0).sum(-1, keepdim=True), alpha)


def simplex_qp(P, *, iters: int = 100, tol: float = 1e-13):
    """``argmin_{a in simplex} a^T P a`` for each symmetric PSD matrix of ``P`` (b, m, m): (b, m) float64.

    The simplex program is the nonnegative one ``min_{z >= 0} z^T P z / 2 - 1^T z`` rescaled, a = z / 1^T z
    (the KKT conditions of the two coincide with mu = 2 / 1^T z), solved for the whole batch by a
    primal-dual interior-point method (Mehrotra's predictor-corrector: two batched m x m solves an
    iteration, converged in a few dozen at most), then made exact on the support it finds where the KKT
    conditions confirm it (:func:`_exact_on_support`). Each P is scaled to a unit largest diagonal and
    gets a 1e-10 ridge, so a client with a zero-cost partner (P singular) still has a bounded program.
    """
    import torch

    P = P.to(torch.float64)
    P = 0.5 * (P + P.transpose(-1, -2))
    b, m, _ = P.shape
    if m == 1:
        return torch.ones(b, 1, dtype=torch.float64, device=P.device)
    scale = P.diagonal(dim1=-2, dim2=-1).abs().amax(-1).clamp_min(1e-300)[:, None, None]
    Q = P / scale + 1e-10 * torch.eye(m, dtype=P.dtype, device=P.device)
    z = torch.ones(b, m, dtype=P.dtype, device=P.device)
    s = torch.ones_like(z)
    one = torch.ones_like(z)

    def solve(M, r):
        return torch.linalg.solve(M, r.unsqueeze(-1)).squeeze(-1)

    def longest(v, dv):  # the largest step in (0, 1] keeping v + step * dv >= 0, per problem
        ratio = torch.where(dv < 0, -v / dv, torch.full_like(v, float("inf")))
        return ratio.amin(-1, keepdim=True).clamp(max=1.0)

    for _ in range(iters):
        rd = torch.einsum("bij,bj->bi", Q, z) - one - s
        mu = (z * s).mean(-1, keepdim=True)
        if bool(((rd.abs().amax(-1) <= tol * (1.0 + z.abs().amax(-1))) & (mu.squeeze(-1) <= tol)).all()):
            break
        M = Q + torch.diag_embed(s / z)
        dz = solve(M, -rd - s)                                   # predictor: the affine-scaling direction
        ds = -s - s * dz / z
        a = torch.minimum(longest(z, dz), longest(s, ds))
        sigma = ((((z + a * dz) * (s + a * ds)).mean(-1, keepdim=True)) / mu).clamp(0.0, 1.0) ** 3
        rc = z * s + dz * ds - sigma * mu                        # corrector with centring
        dz = solve(M, -rd - rc / z)
        ds = (-rc - s * dz) / z
        a = 0.99 * torch.minimum(longest(z, dz), longest(s, ds))
        z, s = z + a * dz, s + a * ds
    alpha = z / z.sum(-1, keepdim=True)
    return _exact_on_support(P, alpha.masked_fill(alpha < 1e-9, 0.0), 0.0)


def combination_weights(h, v, n):
    """FedPAC's classifier-combination weights (§4) of a cohort of m clients: (m, m), row i client i's alpha.

    ``h`` (m, C, d): each client's h_j[k] = p_{j,k} mu_{j,k}; ``v`` (m,): its variance term V_j; ``n`` (m,): its
    number of labeled samples. Row i minimizes ``||sum_j a_j (h_i - h_j)||^2 + sum_j a_j^2 V_j / n_j`` over
    the simplex. The bias matrix is formed from the Gram matrix K = H H^T:
    <h_i - h_j, h_i - h_l> = K_ii - K_ij - K_il + K_jl.
    """
    import torch

    H = h.reshape(h.shape[0], -1).to(torch.float64)
    K = H @ H.T
    diag = K.diagonal()
    bias = diag[:, None, None] - K[:, :, None] - K[:, None, :] + K[None, :, :]       # (i, j, l)
    var = torch.diag_embed((v.to(torch.float64) / n.to(torch.float64).clamp_min(1.0)).clamp_min(0.0))
    return simplex_qp(bias + var.unsqueeze(0))


def feature_statistics(sums):
    """``(h, V, n)`` of each client from its :class:`~pfl_cli.fl.prototypes.ClassSums` (§4).

    h[k] = p_k mu_k = S_k / n; V = sum_k p_k E[||f||^2 | k] - sum_k p_k^2 ||mu_k||^2
    = sum_k Q_k / n - sum_k ||S_k||^2 / n^2, with S_k, Q_k the class sums of f(x) and of ||f(x)||^2
    and n the client's labeled samples.
    """
    n = sums.counts.sum(-1)
    nn_ = n.clamp_min(1.0)
    h = sums.sums / nn_[:, None, None]
    v = sums.sq.sum(-1) / nn_ - (sums.sums ** 2).sum((-1, -2)) / nn_ ** 2
    return h, v.clamp_min(0.0), n


# ----------------------------------------------------------------------------- config and algorithm
@dataclass(frozen=True)
class FedPACConfig(TrainConfig):
    """FedPAC's keys: epochs on the head and on the body, the alignment weight and the head's step size."""

    algorithm: str = key("fedpac", "the algorithm these keys configure")
    rounds: int = key(5000, "communication rounds", "thesis §4.4, App. B.1.2: all methods but Local train 5000 rounds")
    batch_size: int = key(50, "client minibatch size", f"{SRC}, options.py: --local_bs 50")
    lr: float = key(0.01, "client SGD step size of the body", f"{SRC}, options.py: --lr 0.01")
    momentum: float = key(0.5, "client SGD momentum (buffer reset every round and phase)",
                          f"{SRC}, options.py: --momentum 0.5")
    lambda_theta: float = key(2.5e-4, "client weight decay, added as 2*lambda_theta*param",
                              f"{SRC}, methods/fedpac.py: SGD weight_decay 5e-4")
    head_lr: float = key(0.1, "client SGD step size of the head (its epochs, and a new client's)",
                         f"{SRC}, methods/fedpac.py: the classifier's SGD at lr 0.1")
    head_epochs: int = key(1, "epochs on the head per round, body frozen (Alg. 1)",
                           f"{SRC}, methods/fedpac.py: epoch_classifier = 1")
    body_epochs: int = key(5, "epochs on the body per round, head frozen, with the feature alignment (Alg. 1)",
                           f"{SRC}, options.py: --local_epoch 5")
    fedpac_lambda: Optional[float] = key(None, "lambda: weight of the feature alignment ||f(x) - c_y||^2 (§4); "
                                         "null: 1 / d, d the feature width",
                                         f"{SRC}, options.py: --lam 1.0 on MSELoss, the mean over the d "
                                         "coordinates: 1 / d on the squared norm")
    new_client_epochs: int = key(20, "epochs a new client trains a head from the initial one on the frozen body",
                                 "PeFLL (ICLR 2024) App. A.2: a new client's head trained locally for 20 epochs")

    def validate(self) -> None:
        super().validate()
        check_own_keys(self, {"fedpac_lambda": "a finite number >= 0", "head_lr": "a finite number > 0",
                              "head_epochs": "an integer >= 0", "body_epochs": "an integer >= 0",
                              "new_client_epochs": "an integer >= 0"})
        if self.head_epochs == 0 and self.body_epochs == 0:
            raise ConfigError("head_epochs / body_epochs: fedpac needs local training; got 0 epochs on both (set "
                              "body_epochs >= 1).")


class FedPAC(KeepsGlobalPrototypes, PrivateState, _GlobalModel):
    name = "fedpac"
    # under --secagg (pfl_cli.fl.secagg)
    individual_reads = "each client's feature statistics, from which the server solves a classifier combination per client"
    paper = "FedPAC: Xu, Tong, Huang, ICLR 2023"
    new_client_protocol = "the global body with a head trained new_client_epochs from the initial one"
    config = FedPACConfig
    dp_unit = None
    not_distributed = "its statistics, prototypes and per-client head combination run in one process"
    search_space = {"lr": "log:1e-3:1", "head_lr": "log:1e-2:1", "fedpac_lambda": "log:1e-3:10"}
    search_space_source = ("Xu, Tong & Huang, FedPAC (ICLR 2023) and the authors' code: the client lr, the "
                           "classifier's own step (their 0.1) and lambda from 1e-3 to 10 around 1 / d (their lam 1 on "
                           "the coordinate mean: 0.01 to 0.03 for 100- to 32-wide features)")
    tune_group = "train"

    @classmethod
    def floats_per_client_round(cls, arch: dict) -> int:
        """Down: body, C x d prototypes, personalized head; up: body, head, C x d prototypes, C x d h_i, V_i,
        C counts."""
        from pfl_cli.fl.split import split_names
        from pfl_cli.models import build

        net = build(arch["client"])
        body, head = split_names(net, cls.name)
        sizes = dict((k, p.numel()) for k, p in net.named_parameters())
        nb, nh = sum(sizes[k] for k in body), sum(sizes[k] for k in head)
        classes, d = int(arch["client"]["num_classes"]), net.head().in_features
        return (nb + classes * d + nh) + (nb + nh + 2 * classes * d + 1 + classes)

    def build(self) -> None:
        from pfl_cli.fl.prototype_nets import FeatureNet
        import torch

        from pfl_cli.fl.split import split_names

        self.net = FeatureNet(self.client_net(), self.name)
        body, head = split_names(self.net.net, self.name)
        init = {k: v.detach().clone() for k, v in self.net.named_parameters()}
        self.body, self.head = [NET + k for k in body], [NET + k for k in head]
        self.global_params = init
        self.init_head = {k: init[k] for k in self.head}
        self.private = self.new_private_state(self.init_head)
        d = self.net.net.head().in_features
        self.prototypes = torch.zeros(self.store.num_classes, d, device=self.device)
        self.seen = torch.zeros(self.store.num_classes, dtype=torch.bool, device=self.device)

    @property
    def alignment_weight(self) -> float:
        """lambda: ``fedpac_lambda``, or 1 / d (the authors' lam 1 on the mean over the d coordinates)."""
        lam = self.cfg.fedpac_lambda
        return float(lam) if lam is not None else 1.0 / self.net.net.head().in_features

    # -- pieces of a round
    def _features(self):
        from torch.func import functional_call

        return lambda p, x: functional_call(self.net, p, (x,), {"parts": True})[0]

    def _class_sums(self, params: dict, clients):
        from pfl_cli.fl.prototypes import class_feature_sums

        return class_feature_sums(self._features(), params, self.store, clients)

    def _train(self, start: dict, clients, gen, *, part: str, epochs: int, align: bool):
        steps, taken = self.draw_batches(clients, gen, epochs=epochs)
        sgd = self.sgd_update_options()
        if part == "head":
            sgd = {**sgd, "lr": float(self.cfg.head_lr)}
        theta, loss = fedpac_steps(self.net, start, self.store, steps, sgd=sgd,
                                   trainable=self.head if part == "head" else self.body,
                                   lam=self.alignment_weight, prototypes=self.prototypes if align else None,
                                   seen=self.seen)
        return theta, loss, taken

    def run_round(self, t, cohort, gen):
        import torch

        from pfl_cli.fl.prototypes import merge_prototypes

        cfg = self.cfg
        c = len(cohort)
        start = {**stack({k: self.global_params[k] for k in self.body}, c), **self.private.gather(cohort)}
        self.traffic.send("body", torch.cat([self.global_params[k].flatten() for k in self.body]), copies=c)
        self.traffic.send("prototypes", self.prototypes, copies=c)
        # 1. statistics of the received body (every cohort client's h_j in the same feature space)
        h, v, n = feature_statistics(self._class_sums(start, cohort))
        # 2. head epochs (body frozen), then body epochs with the alignment to the global prototypes
        theta, loss = start, None
        if cfg.head_epochs:
            theta, loss, _ = self._train(theta, cohort, gen, part="head", epochs=cfg.head_epochs, align=False)
        if cfg.body_epochs:
            theta, loss, _ = self._train(theta, cohort, gen, part="body", epochs=cfg.body_epochs,
                                         align=bool(self.seen.any()))
        # 3. uploads: body, head, class prototypes of the trained body, statistics
        local = self._class_sums(theta, cohort)
        protos = local.prototypes()
        for name, k in (("body", self.body), ("head", self.head)):
            self.traffic.receive(name, torch.cat([theta[j].flatten(1) for j in k], 1))
        self.traffic.receive("prototypes", protos)
        self.traffic.receive("class_counts", local.counts)
        self.traffic.receive("statistics_h", h)
        self.traffic.receive("statistics_v", v)
        # 4. server: body mean, global prototypes, each client's combined head
        self.global_params.update(weighted_mean(self.store, cohort, {k: theta[k] for k in self.body}))
        self.prototypes, self.seen = merge_prototypes(self.prototypes, self.seen, protos, local.counts)
        alpha = combination_weights(h, v, n).to(theta[self.head[0]].dtype)
        heads = {k: torch.einsum("ij,j...->i...", alpha, theta[k]) for k in self.head}
        self.traffic.send("personalized_head", torch.cat([heads[k].flatten(1) for k in self.head], 1))
        self.private.scatter(cohort, heads)
        self.last_alpha = alpha
        return loss

    # -- serving
    def own_models(self, rows):
        return {**stack({k: self.global_params[k] for k in self.body}, len(rows)), **self.private.gather(rows)}

    def new_clients(self, clients: np.ndarray, gen) -> dict:
        """The initial head trained ``new_client_epochs`` epochs (cross-entropy, ``head_lr``), the body frozen."""
        start = dict(self.global_params)  # its head never moves from the initial one
        if not self.cfg.new_client_epochs or not len(clients):
            return stack(start, len(clients))

        def build(sel):
            theta, _, taken = self._train(stack(start, len(sel)), sel, gen, part="head",
                                          epochs=self.cfg.new_client_epochs, align=False)
            self.client_sgd_steps += taken
            return theta

        return self.chunked(np.asarray(clients, dtype=np.int64), build)

    def protocol(self, new: bool) -> dict:
        return epochs_protocol(new, self.cfg.new_client_epochs,
                               "the global body with its own combined head",
                               "the global body with a head trained {e} epochs",
                               "the global body with the initial head")
