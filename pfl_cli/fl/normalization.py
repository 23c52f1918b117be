"""Local normalization layers: a cohort's local SGD on a batch-norm client net, each client's statistics its own.

FedBN (Li et al., ICLR 2021, Algorithm 1) keeps every client's batch-normalization layers, their
affine parameters and their running statistics, on the client. :func:`norm_local_steps` runs a
cohort's local steps on such a net (:mod:`pfl_cli.models.normalized`) with ``vmap``: each client's
batch is normalized with the statistics of its own real samples (the cohort batch's padding rows
left out), and each client's running statistics move as ``torch.nn.BatchNorm``'s do in training
mode (momentum 0.1, unbiased batch variance), on the steps the client takes.
"""

from __future__ import annotations


def norm_local_steps(model, params: dict, buffers: dict, store, steps, *, trainable: list[str], sgd: dict):
    """Local SGD of ``trainable`` (names of ``params``) for every cohort client; returns (params, buffers, loss).

    ``params`` / ``buffers``: name -> (c, *shape) (the buffers: the normalization layers' running
    statistics); ``steps``: :class:`~pfl_cli.fl.batches.LocalSteps`; ``sgd``: the client optimizer's
    settings (:meth:`pfl_cli.algorithms.base.Algorithm.sgd_update_options`). ``model`` is in training
    mode (batch statistics); the loss is each client's mean cross-entropy over its active steps.
    """
    import torch
    from torch.func import functional_call, vmap

    from pfl_cli.fl.batches import ActiveMean
    from pfl_cli.fl.cohort import _masked_mean_loss, sgd_update_
    from pfl_cli.models.normalized import MOMENTUM, norm_layers

    layers = norm_layers(model)
    forward = vmap(lambda p, x, m: functional_call(model, p, (x,), {"mask": m, "with_stats": True}))
    theta = {k: v.detach().clone() for k, v in params.items()}
    stats = {k: v.detach().clone() for k, v in buffers.items()}
    moving = {k: theta[k] for k in trainable}
    buf = {k: torch.zeros_like(v) for k, v in moving.items()} if sgd.get("momentum") else {}
    mean_loss = ActiveMean(steps.num_clients, next(iter(theta.values())).device)
    for idx, m, go in steps:
        leaves = {k: v.requires_grad_(True) for k, v in moving.items()}
        logits, batch_stats = forward({**theta, **leaves, **stats}, store.inputs(idx), m)
        loss = _masked_mean_loss(logits, store.y[idx], m)
        grads = dict(zip(leaves, torch.autograd.grad(loss.sum(), list(leaves.values()))))
        for v in moving.values():
            v.requires_grad_(False)
        sgd_update_(moving, grads, buf, **sgd, active=go)
        with torch.no_grad():
            for layer, (mu, var) in zip(layers, batch_stats):
                for name, new in ((f"{layer}.running_mean", mu), (f"{layer}.running_var", var)):
                    old = stats[name]
                    moved = (1.0 - MOMENTUM) * old + MOMENTUM * new
                    stats[name] = moved if go is None else torch.where(go[:, None], moved, old)
        mean_loss.add(loss.detach(), go)
    return {k: v.detach() for k, v in theta.items()}, stats, mean_loss.mean()


def population_stats(model, params: dict, store, clients) -> dict:
    """Each client's normalization statistics over all its fit samples: name -> (c, channels).

    One training-mode forward of every client's whole fit set as one batch (padding masked out):
    each layer is then normalized with the statistics of that same set, so the statistics it
    returns are the population statistics of every layer's input under ``params`` (the mean and
    the unbiased variance, what ``nn.BatchNorm``'s running averages estimate).
    """
    import torch
    from torch.func import functional_call, vmap

    from pfl_cli.models.normalized import norm_layers

    index, length = store.fit.rows(clients)
    mask = (torch.arange(index.shape[1], device=index.device)[None, :] < length[:, None]).to(torch.float32)
    forward = vmap(lambda p, x, m: functional_call(model, p, (x,), {"mask": m, "with_stats": True}))
    with torch.no_grad():
        _, stats = forward(params, store.inputs(index), mask)
    out = {}
    for layer, (mu, var) in zip(norm_layers(model), stats):
        out[f"{layer}.running_mean"], out[f"{layer}.running_var"] = mu, var
    return out
