"""Class prototypes: per-client, per-class sums of a representation over a client's own samples.

A class prototype (a feature centroid) is the mean representation f(x) of a client's samples of
one class (FedProto, Tan et al. AAAI 2022; FedPAC, Xu, Tong & Huang ICLR 2023, §4). The server's
global prototype of class k is the sample-weighted mean of the clients' prototypes,
``c_k = sum_i n_{i,k} c_{i,k} / sum_i n_{i,k}`` (FedPAC §4), which is the pooled sum of
features over the pooled count: :func:`class_feature_sums` returns the sums, counts and summed
squared norms from which prototypes, global prototypes and second-moment statistics follow.

Everything is batched over clients: the representation of every client's fit samples runs
as one ``vmap`` over the clients' (stacked) parameters, ``chunk`` samples of each client at a time.
"""

from __future__ import annotations

from dataclasses import dataclass


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
