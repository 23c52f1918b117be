"""Several shared models and the clients they serve: what the clustered algorithms (IFCA, q-FFL's loss read) share.

``models`` is a stack of k models ``{name: (k, *shape)}`` that every client may read. :func:`losses_under`
scores each of the k models on each client's samples at once (one batched forward over clients x models
per chunk, never a loop over clients); :func:`cluster_means` is the server's average per cluster of the
cohort's trained models, a cluster nobody joined this round keeping its model.

>>> import torch
>>> theta = {"w": torch.tensor([[1.0], [3.0], [10.0]])}
>>> old = {"w": torch.tensor([[0.0], [0.0], [-1.0]])}
>>> cluster_means(theta, torch.tensor([0, 0, 1]), torch.tensor([1.0, 1.0, 1.0]), old)["w"].flatten().tolist()
[2.0, 10.0, -1.0]
"""

from __future__ import annotations

# Samples of one client read per forward chunk, and clients per chunk: bounds a chunk's logits at
# clients x models x samples x classes floats whatever the clients' data sizes.
SAMPLE_CHUNK = 256
CLIENT_CHUNK = 16


def losses_under(net, store, padded, clients, models: dict, how: str):
    """Each client's mean cross-entropy on its samples ``padded`` (e.g. ``store.fit``) under each model: (c, k).

    ``models`` {name: (k, *shape)} are read by every client. Unlabeled samples add nothing; a client
    without a labeled sample scores 0 under every model. Computed without a graph, chunked over
    :data:`CLIENT_CHUNK` clients and :data:`SAMPLE_CHUNK` samples, each chunk one batched forward
    (``how``: :func:`pfl_cli.fl.cohort.resolve_cohort_exec`) over its clients x the k models.
    """
    import torch
    import torch.nn.functional as F

    k = int(next(iter(models.values())).shape[0])
    c = len(clients)
    dev = next(iter(models.values())).device
    total = torch.zeros(c, k, dtype=torch.float64, device=dev)
    count = torch.zeros(c, 1, dtype=torch.float64, device=dev)
    if c == 0:
        return total.to(torch.float32)
    with torch.no_grad():
        for lo, hi, y, m, logits in _chunk_logits(net, store, padded, clients, models, how):
            n = hi - lo
            ce = F.cross_entropy(logits.flatten(0, -2), y.clamp_min(0).repeat_interleave(k, 0).flatten(),
                                 reduction="none").view(n, k, -1)
            mk = m[:, None, :].to(ce.dtype)
            total[lo:hi] += (ce * mk).sum(-1).to(torch.float64)
            count[lo:hi] += m.sum(-1, keepdim=True).to(torch.float64)
    return (total / count.clamp_min(1.0)).to(torch.float32)


def _chunk_logits(net, store, padded, clients, models: dict, how: str):
    """Yield, per chunk of :data:`CLIENT_CHUNK` clients x :data:`SAMPLE_CHUNK` of their samples ``padded``,
    ``(lo, hi, y, mask, logits)``: the chunk's clients ``clients[lo:hi]``, their labels ``y`` (n, b), which of them
    are real labeled samples ``mask`` (n, b), and the logits (n, k, b, classes) of one batched forward over the
    chunk's clients x the k ``models`` (``how``: :func:`pfl_cli.fl.cohort.resolve_cohort_exec`). Chunks without a
    labeled sample are skipped. The caller holds ``torch.no_grad()``."""
    import torch

    from pfl_cli.fl.cohort import cohort_forward

    k = int(next(iter(models.values())).shape[0])
    c = len(clients)
    index, length = padded.rows(clients)
    for lo in range(0, c, CLIENT_CHUNK):
        hi = min(c, lo + CLIENT_CHUNK)
        for s0 in range(0, index.shape[1], SAMPLE_CHUNK):
            idx = index[lo:hi, s0:s0 + SAMPLE_CHUNK]
            pos = torch.arange(s0, s0 + idx.shape[1], device=idx.device)
            y = store.y[idx]
            m = (pos[None, :] < length[lo:hi, None]) & (y >= 0)
            if not bool(m.any()):
                continue
            x = store.inputs(idx)
            n = hi - lo
            xs = x.unsqueeze(1).expand(n, k, *x.shape[1:]).flatten(0, 1)          # (n k, b, ...)
            params = {name: v.unsqueeze(0).expand(n, *v.shape).flatten(0, 1) for name, v in models.items()}
            yield lo, hi, y, m, cohort_forward(net, params, xs, how).view(n, k, idx.shape[1], -1)


def cluster_means(theta: dict, assign, weight, old: dict) -> dict:
    """Each cluster's weighted mean of the cohort models assigned to it; a cluster without one keeps ``old``.

    ``theta`` {name: (c, ...)}, ``assign`` LongTensor (c,) of cluster ids in [0, k), ``weight`` (c,) (data
    sizes, or ones for the uniform mean), ``old`` {name: (k, ...)}. One (k, c) matrix product per tensor.
    """
    import torch

    k = int(next(iter(old.values())).shape[0])
    onehot = torch.nn.functional.one_hot(assign, k).T.to(torch.float32) * weight.to(torch.float32)[None, :]  # (k, c)
    mass = onehot.sum(1)
    share = onehot / mass.clamp_min(torch.finfo(torch.float32).tiny)[:, None]
    out = {}
    for name, v in theta.items():
        mean = torch.einsum("kc,c...->k...", share, v.to(torch.float32)).to(v.dtype)
        keep = (mass > 0).view(-1, *([1] * (v.dim() - 1)))
        out[name] = torch.where(keep, mean, old[name])
    return out


def cluster_means_secure(theta: dict, assign, weight, old: dict) -> dict:
    """:func:`cluster_means` from the cohort's secure sums only (``--secagg``, :mod:`pfl_cli.fl.secagg`).

    Client i sends, for every cluster m, ``1[m = j_i] n_i theta_i`` and ``1[m = j_i] n_i`` (rows of k slots, zero
    but in the cluster it chose); secure aggregation sums them, so the server learns each cluster's sum of
    weighted models and its mass, not which client chose which cluster. Each cluster's mean is the sum over its
    mass (a cluster of zero mass keeps ``old``): :func:`cluster_means` to the float rounding of sum-then-divide.
    """
    import torch

    from pfl_cli.fl.secagg import WEIGHT, secure_sum

    k = int(next(iter(old.values())).shape[0])
    slot = torch.nn.functional.one_hot(assign, k).to(torch.float32) * weight.to(torch.float32)[:, None]  # (c, k)
    rows = {name: torch.einsum("ck,c...->ck...", slot, v.to(torch.float32)) for name, v in theta.items()}
    sums = secure_sum({**rows, WEIGHT: slot}, spent=(theta,)).total()
    mass = sums.pop(WEIGHT)
    out = {}
    for name, v in theta.items():
        keep = (mass > 0).view(-1, *([1] * (v.dim() - 1)))
        mean = (sums[name] / mass.clamp_min(torch.finfo(torch.float32).tiny).view_as(keep)).to(v.dtype)
        out[name] = torch.where(keep, mean, old[name])
    return out


def mixture_weights(net, store, padded, clients, models: dict, pi, how: str):
    """One E-step of a mixture of the k shared ``models`` per client: the mean over each client's labeled samples
    of the posterior ``q_s(m) ∝ pi_m p_m(y_s | x_s)``; ``pi`` (c, k) -> (c, k). A client without a labeled sample
    keeps its ``pi``. Chunked and batched as :func:`losses_under`."""
    import torch

    k = int(next(iter(models.values())).shape[0])
    c = len(clients)
    total = torch.zeros(c, k, dtype=torch.float64, device=pi.device)
    count = torch.zeros(c, 1, dtype=torch.float64, device=pi.device)
    if c == 0:
        return pi.clone()
    log_pi = torch.log(pi.to(torch.float64).clamp_min(1e-30))
    with torch.no_grad():
        for lo, hi, y, m, logits in _chunk_logits(net, store, padded, clients, models, how):
            n = hi - lo
            logp = torch.log_softmax(logits.to(torch.float64), -1).gather(
                -1, y.clamp_min(0)[:, None, :, None].expand(n, k, -1, 1)).squeeze(-1)  # (n, k, b)
            q = torch.softmax(logp + log_pi[lo:hi, :, None], 1)                      # posterior over k
            mk = m[:, None, :].to(q.dtype)
            total[lo:hi] += (q * mk).sum(-1)
            count[lo:hi] += m.sum(-1, keepdim=True).to(torch.float64)
    out = torch.where(count > 0, total / count.clamp_min(1.0), pi.to(torch.float64))
    return out.to(pi.dtype)
