"""Class prototypes: per-client, per-class sums of a representation over a client's own samples.

A class prototype (a feature centroid) is the mean representation f(x) of a client's samples of
one class (FedProto, Tan et al. AAAI 2022; FedPAC, Xu, Tong & Huang ICLR 2023, §4). The server's
global prototype of class k is the sample-weighted mean of the clients' prototypes,
``c_k = sum_i n_{i,k} c_{i,k} / sum_i n_{i,k}`` (FedPAC §4), which is the pooled sum of
features over the pooled count: :func:`class_feature_sums` returns the sums, counts and summed
squared norms from which prototypes, global prototypes and second-moment statistics follow.

Everything is batched over clients: the representation of every client's fit samples runs
as one ``vmap`` over the clients' (stacked) parameters, ``chunk`` samples of each client at a time.

The other pieces the prototype methods share: :class:`FeatureNet` (a client net answering with its
representation and its logits), :func:`aligned_steps` (the cohort's local steps on cross-entropy plus the
alignment of f(x) to its class's global prototype: FedPAC §4, FedProto Eq. 7-8),
:class:`NearestPrototypeNet` (FedProto's inference: the class of the nearest global prototype),
:class:`TrainsNewClients` (a new client's model trained from the server's start, FedProto's and FedNH's protocol),
:func:`spread_prototypes` (unit prototypes spread over the sphere, FedNH §4) and
:func:`smoothed_prototypes` (FedNH's server update of the prototypes).
"""

from __future__ import annotations

from dataclasses import dataclass



def __getattr__(name: str):  # the torch modules, from where they were first defined
    if name in ("FeatureNet", "NearestPrototypeNet"):
        from pfl_cli.fl import prototype_nets

        return getattr(prototype_nets, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


class TrainsNewClients:
    """Mixin: a client without state of its own (unseen in training) gets the server's ``global_params`` trained
    ``new_client_epochs`` epochs on its own data by the algorithm's ``_train(start, clients, gen, epochs)``, as a
    cohort client trains (0: ``global_params`` as they are). FedProto (the common initialization, towards the global
    prototypes) and FedNH (the GM, its prototypes fixed)."""

    def new_clients(self, clients, gen) -> dict:
        import numpy as np

        from pfl_cli.fl.params import stack

        if not self.cfg.new_client_epochs or not len(clients):
            return stack(self.global_params, len(clients))

        def build(sel):
            theta, _, taken = self._train(stack(self.global_params, len(sel)), sel, gen, self.cfg.new_client_epochs)
            self.client_sgd_steps += taken
            return theta

        return self.chunked(np.asarray(clients, dtype=np.int64), build)


def aligned_steps(model: nn.Module, params: dict, store, steps, *, trainable: list[str], sgd: dict,
                  lam: float = 0.0, prototypes=None, seen=None):
    """The cohort's local steps (``vmap``) on cross-entropy plus ``lam`` * ||f(x) - c_y||^2 (FedPAC §4;
    FedProto Eq. 7-8 with the squared L2 distance of its App. B), each averaged over a client's real labeled
    samples; the alignment only for samples whose class has a prototype (``seen``). ``prototypes`` None:
    cross-entropy alone. ``model(x, parts=True)`` answers (f(x), logits). Returns (params, each client's
    mean loss).
    """
    import torch

    from torch.func import functional_call, vmap

    from pfl_cli.fl.batches import ActiveMean
    from pfl_cli.fl.cohort import _masked_mean_loss, sgd_update_

    forward = vmap(lambda p, x: functional_call(model, p, (x,), {"parts": True}))
    theta = {k: v.detach().clone() for k, v in params.items()}
    moving = {k: theta[k] for k in trainable}
    buf = {k: torch.zeros_like(v) for k, v in moving.items()} if sgd.get("momentum") else {}
    device = next(iter(theta.values())).device
    mean_loss = ActiveMean(steps.num_clients, device)
    align = prototypes is not None and lam > 0
    for idx, m, go in steps:
        for v in moving.values():
            v.requires_grad_(True)
        h, logits = forward(theta, store.inputs(idx))
        y = store.y[idx]
        loss = _masked_mean_loss(logits, y, m)
        if align:
            yc = y.clamp_min(0)
            w = m * (y >= 0) * seen[yc]
            dist = ((h - prototypes[yc]) ** 2).sum(-1)                                   # (c, b)
            loss = loss + lam * (dist * w).sum(-1) / (m * (y >= 0)).sum(-1).clamp_min(1.0)
        grads = dict(zip(moving, torch.autograd.grad(loss.sum(), list(moving.values()))))
        for v in moving.values():
            v.requires_grad_(False)
        sgd_update_(moving, grads, buf, **sgd, active=go)
        mean_loss.add(loss.detach(), go)
    return {k: v.detach() for k, v in theta.items()}, mean_loss.mean()


@dataclass(frozen=True)
class ClassSums:
    """Per-client, per-class sums over labeled samples: ``counts`` (c, C), ``sums`` (c, C, d) of f(x),
    ``sq`` (c, C) of ||f(x)||^2; float64."""

    counts: "object"
    sums: "object"
    sq: "object"

    def prototypes(self):
        """Each client's class means (c, C, d); a class the client has no sample of is zero."""
        return self.sums / self.counts.clamp_min(1.0).unsqueeze(-1)


def class_feature_sums(features, params: dict, store, clients, *, split: str = "fit", chunk: int = 256) -> ClassSums:
    """Sums of ``features`` over each client's labeled ``split`` samples, by class.

    ``features(params_i, x) -> (b, d)``: one client's representation; ``params``: name -> (c, ...),
    one row per entry of ``clients`` (LongTensor). Unlabeled samples (label -1) and padding
    add nothing. No gradient flows (statistics, not a loss).
    """
    import torch

    from torch.func import vmap

    index, length = getattr(store, split).rows(clients)
    c, width = index.shape
    if c == 0:
        raise ValueError("class_feature_sums needs at least one client")
    forward = vmap(features)
    counts = sums = sq = None
    with torch.no_grad():
        for lo in range(0, width, chunk):
            idx = index[:, lo:lo + chunk]
            real = (torch.arange(lo, lo + idx.shape[1], device=idx.device)[None, :] < length[:, None])
            y = store.y[idx]
            real = real & (y >= 0)
            h = forward(params, store.inputs(idx)).to(torch.float64)                     # (c, w, d)
            hot = torch.nn.functional.one_hot(y.clamp_min(0), store.num_classes).to(torch.float64)
            hot = hot * real.unsqueeze(-1)                                               # (c, w, C)
            part = (hot.sum(1), torch.einsum("cwk,cwd->ckd", hot, h),
                    torch.einsum("cwk,cw->ck", hot, (h * h).sum(-1)))
            if counts is None:
                counts, sums, sq = part
            else:
                counts, sums, sq = counts + part[0], sums + part[1], sq + part[2]
    return ClassSums(counts, sums, sq)


def merge_prototypes(previous, seen, prototypes, counts):
    """The global prototypes: ``sum_i n_{i,k} c_{i,k} / sum_i n_{i,k}`` over the clients that hold class k
    (FedPAC §4); a class none of them holds keeps ``previous`` (and its ``seen`` flag).

    ``previous`` (C, d), ``seen`` (C,) bool; ``prototypes`` (c, C, d) and ``counts`` (c, C) of the cohort.
    Returns the new (C, d) float32 prototypes and (C,) ``seen``.
    """
    import torch

    total = counts.sum(0)                                                     # (C,)
    pooled = (prototypes.to(torch.float64) * counts.unsqueeze(-1)).sum(0) / total.clamp_min(1.0).unsqueeze(-1)
    have = total > 0
    new = torch.where(have.unsqueeze(-1), pooled.to(previous.dtype), previous)
    return new, seen | have


def spread_prototypes(num_classes: int, dim: int, gen, *, steps: int = 1000, lr: float = 0.1):
    """``num_classes`` unit vectors of R^dim spread over the sphere (FedNH, Dai et al. AAAI 2023, Alg. 1's
    initialization: prototypes uniformly spread, for uniformity): (C, d) float32.

    With C <= d the rows are orthonormal (pairwise cosine 0, the authors' code's orthogonal initialization,
    ``FedUH.py``: ``torch.nn.init.orthogonal_``), here from a QR factorization of a Gaussian matrix drawn
    from ``gen``. With C > d no orthonormal set exists: the largest pairwise cosine is minimized through its
    smooth maximum (log-sum-exp at temperature 1 / 20 over the pairs) by ``steps`` normalized gradient steps
    of size ``lr`` from Gaussian rows, the spreading FedNH asks for (small max_{k != k'} <w_k, w_k'>).
    """
    import torch

    if num_classes <= dim:
        q, r = torch.linalg.qr(torch.randn(dim, num_classes, generator=gen, dtype=torch.float64))
        q = q * torch.sign(torch.diagonal(r)).unsqueeze(0)                  # a unique, Haar-uniform frame
        return q.T.contiguous().to(torch.float32)
    w = torch.nn.functional.normalize(torch.randn(num_classes, dim, generator=gen, dtype=torch.float64), dim=1)
    off = ~torch.eye(num_classes, dtype=torch.bool)
    for _ in range(steps):
        w.requires_grad_(True)
        cos = w @ w.T
        loss = torch.logsumexp(20.0 * cos[off], 0) / 20.0
        (grad,) = torch.autograd.grad(loss, [w])
        with torch.no_grad():
            w = torch.nn.functional.normalize(w - lr * grad / grad.norm().clamp_min(1e-12), dim=1)
    return w.detach().to(torch.float32)


def smoothed_prototypes(previous, unit_means, counts, rho: float):
    """FedNH's server update (Dai et al. AAAI 2023, Alg. 1; the authors' ``FedNH.py`` ``aggregate``): each class's
    count-weighted mean of the clients' unit class means, normalized, then
    ``w_k <- normalize(rho w_k + (1 - rho) mu_k)``.

    ``previous`` (C, d) unit rows; ``unit_means`` (c, C, d): each cohort client's normalized class mean of its
    normalized representations (zero for a class it lacks); ``counts`` (c, C). A class no cohort client holds
    has mu_k = 0 and keeps its prototype.
    """
    import torch
    import torch.nn.functional as F

    F = torch.nn.functional
    total = counts.sum(0)                                                              # (C,)
    mu = (unit_means.to(torch.float64) * counts.unsqueeze(-1)).sum(0) / total.clamp_min(1e-12).unsqueeze(-1)
    mu = F.normalize(mu, dim=1)
    new = F.normalize(rho * previous.to(torch.float64) + (1.0 - rho) * mu, dim=1)
    return new.to(previous.dtype)


def secure_class_sums(prototypes, counts):
    """The two sums the prototype servers need, from the cohort's secure sums only (``--secagg``,
    :mod:`pfl_cli.fl.secagg`): client i sends ``n_{i,k} c_{i,k}`` (float64, (C, d)) and ``n_{i,k}`` ((C,)), so the
    server learns ``sum_i n_{i,k} c_{i,k}`` and ``sum_i n_{i,k}`` per class and no client's prototypes or counts.
    ``prototypes`` (c, C, d), ``counts`` (c, C) -> ((C, d) float64, (C,))."""
    import torch

    from pfl_cli.fl.secagg import secure_sum

    rows = {"weighted": prototypes.to(torch.float64) * counts.unsqueeze(-1), "count": counts}
    sums = secure_sum(rows, spent=({"prototypes": prototypes, "counts": counts},)).total()
    return sums["weighted"], sums["count"]


def merge_prototypes_secure(previous, seen, prototypes, counts):
    """:func:`merge_prototypes` from the cohort's secure sums (:func:`secure_class_sums`): the same
    ``sum_i n_{i,k} c_{i,k} / sum_i n_{i,k}``, to the float rounding of the order of the sum."""
    import torch

    weighted, total = secure_class_sums(prototypes, counts)
    pooled = weighted / total.clamp_min(1.0).unsqueeze(-1)
    have = total > 0
    new = torch.where(have.unsqueeze(-1), pooled.to(previous.dtype), previous)
    return new, seen | have


def smoothed_prototypes_secure(previous, unit_means, counts, rho: float):
    """:func:`smoothed_prototypes` (FedNH's server update) from the cohort's secure sums
    (:func:`secure_class_sums`): mu_k = sum_i n_{i,k} u_{i,k} / sum_i n_{i,k}, normalized, then the same step."""
    import torch

    F = torch.nn.functional
    weighted, total = secure_class_sums(unit_means, counts)
    mu = F.normalize(weighted / total.clamp_min(1e-12).unsqueeze(-1), dim=1)
    new = F.normalize(rho * previous.to(torch.float64) + (1.0 - rho) * mu, dim=1)
    return new.to(previous.dtype)


class KeepsGlobalPrototypes:
    """Mixin of an algorithm whose server holds global class prototypes (``self.prototypes``, ``self.seen``): they
    join its checkpointed state and its ``model.pt`` weights (FedPAC, FedProto). Placed before the algorithm's base
    class, so that its methods extend the base's through ``super()``."""

    def _prototype_state(self) -> dict:
        return {"prototypes": self.prototypes.detach().cpu().clone(), "seen": self.seen.detach().cpu().clone()}

    def _load_prototypes(self, state: dict) -> None:
        self.prototypes = state["prototypes"].to(self.device)
        self.seen = state["seen"].to(self.device)

    def state(self):
        return {**super().state(), "prototypes": self._prototype_state()}

    def load_state(self, state):
        super().load_state(state)
        self._load_prototypes(state["prototypes"])

    def weights(self):
        from pfl_cli.fl.params import cpu_tree

        return {**super().weights(), "prototypes": cpu_tree(self._prototype_state())}

    def load_weights(self, weights):
        super().load_weights(weights)
        if "prototypes" in weights:  # a model.pt written before the prototypes were saved with it
            self._load_prototypes(weights["prototypes"])
