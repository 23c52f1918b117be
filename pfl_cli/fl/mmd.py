"""Maximum mean discrepancy between two batches of representations, batched over clients.

FedCP (Zhang et al., KDD 2023) keeps a client's feature extractor close, in distribution, to the
global one it received by adding lambda * MMD^2 between the two extractors' features of the same
batch to the local loss. :func:`mmd2` is the biased (V-statistic) estimate of MMD^2 with a sum of
Gaussian (RBF) kernels, over each row's real samples only (padded batches carry a mask), so the
cohort's clients are scored in one call.
"""

from __future__ import annotations

# The kernel widths of FedCP's authors' code (system/flcore/clients/clientcp.py of the official
# repository, kernel "rbf"): k(x, y) = sum_a exp(-||x - y||^2 / (2a)).
FEDCP_BANDWIDTHS = (10.0, 15.0, 20.0, 50.0)


def _kernel(d2, bandwidths):
    import torch

    return sum(torch.exp(-0.5 * d2 / a) for a in bandwidths)


def _sq_dists(a, b):
    """||a_i - b_j||^2 over the last two axes: (..., n, d), (..., m, d) -> (..., n, m)."""
    aa = (a * a).sum(-1)
    bb = (b * b).sum(-1)
    return (aa.unsqueeze(-1) + bb.unsqueeze(-2) - 2.0 * a @ b.transpose(-1, -2)).clamp_min(0.0)


def mmd2(x, y, mask=None, bandwidths=FEDCP_BANDWIDTHS):
    """Biased MMD^2 of the samples ``x`` and ``y`` (paired rows of one batch) under a sum of RBF kernels.

    Parameters
    ----------
    x, y : Tensor (..., b, d)
        Two representations of the same ``b`` samples (leading axes: clients).
    mask : Tensor (..., b) or None
        1 for the real samples; padded rows take no part (None: all are real).
    bandwidths : sequence of float > 0
        The kernel widths a of k(u, v) = sum_a exp(-||u - v||^2 / (2a)).

    Returns
    -------
    Tensor (...)
        mean_{i,j} k(x_i, x_j) + mean_{i,j} k(y_i, y_j) - 2 mean_{i,j} k(x_i, y_j) over the real
        samples (0 where a row has none).
    """
    import torch

    if mask is None:
        mask = torch.ones(x.shape[:-1], dtype=x.dtype, device=x.device)
    w = mask.to(x.dtype)
    w = w / w.sum(-1, keepdim=True).clamp_min(1.0)
    pair = w.unsqueeze(-1) * w.unsqueeze(-2)
    total = _kernel(_sq_dists(x, x), bandwidths) + _kernel(_sq_dists(y, y), bandwidths) \
        - 2.0 * _kernel(_sq_dists(x, y), bandwidths)
    return (pair * total).sum((-1, -2))
