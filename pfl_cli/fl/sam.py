"""Sharpness-aware local steps (SAM) for a whole cohort, usable by any algorithm whose clients run local SGD.

SAM (Foret, Kleiner, Mobahi, Neyshabur, ICLR 2021, Eq. 2-3) minimizes ``max_{||eps|| <= rho} L(w + eps)``:
each step takes the batch gradient g at w, moves to ``w + eps`` with ``eps = rho g / ||g||`` (the
first-order solution of the inner maximum, Eq. 2), and steps w with the gradient taken there on the
same batch (Eq. 3). FedSAM (Qu, Li, Duan, Liu, Tang, Lu, ICML 2022, Alg. 1; Caldarola, Caputo, Ciccone,
ECCV 2022, §4) runs these as the clients' local steps and aggregates as FedAvg. Here the two gradients are
every cohort client's at once (one vmapped forward and backward each, or one per client:
:func:`pfl_cli.fl.cohort.resolve_cohort_exec`), ``||g||`` is each client's own norm over all its
parameters, and the SAM gradient goes through pflx's client optimizer step
(:func:`pfl_cli.fl.cohort.sgd_update_`: clipping, weight decay, momentum) in place of the plain gradient,
as SAM wraps a base optimizer. ``rho = 0`` takes one gradient a step: plain local SGD.

:func:`local_steps` is the step loop for any per-step gradient (``grad_fn``): MOON's contrastive loss
(:mod:`pfl_cli.fl.contrastive`) runs through it too, so SAM composes with another local objective.
"""

from __future__ import annotations

from typing import Callable, Mapping

# Foret et al. (ICLR 2021) Eq. 2 divides by ||g||; the official SAM code adds 1e-12 so a zero gradient gives eps 0.
NORM_EPS = 1e-12


def sam_perturbation(grads: Mapping[str, "object"], rho: float) -> dict:
    """``eps = rho g / ||g||`` per client (Foret et al. 2021, Eq. 2, p = 2): grads {name: (c, *shape)}."""
    import torch

    from pfl_cli.fl.cohort import expand_as_params

    norm = torch.sqrt(sum(g.pow(2).flatten(1).sum(1) for g in grads.values()))
    # rho a number (one run) or a (c,) tensor (stacked runs, pfl_cli.fl.stack): the same true division either way
    # (a Python number over a tensor is reciprocal-then-multiply, a last bit off the stacked run's quotient)
    scale = torch.as_tensor(rho, dtype=norm.dtype, device=norm.device) / (norm + NORM_EPS)
    return {k: g * expand_as_params(scale, g) for k, g in grads.items()}


def sam_gradient(grad_fn: Callable, theta: dict, rho: float):
    """``(loss at theta, gradient at theta + eps)`` (Foret et al. 2021, Eq. 3); ``rho = 0``: the gradient at theta.

    ``grad_fn(theta) -> (loss (c,), {name: (c, *shape)})`` on one fixed batch per client.
    """
    loss, grads = grad_fn(theta)
    if not rho:
        return loss, grads
    eps = sam_perturbation(grads, rho)
    _, sharp = grad_fn({k: v + eps[k] if k in eps else v for k, v in theta.items()})
    return loss, sharp


def cross_entropy_grad_fn(model, store, how: str):
    """``grad_fn(theta, idx, m)``: every client's masked mean cross-entropy on its batch and its gradients."""
    from pfl_cli.fl.cohort import _cohort_grads

    def grad_fn(theta, idx, m):
        return _cohort_grads(model, theta, store.inputs(idx), store.y[idx], m, how, {}, {})

    return grad_fn


def local_steps(grad_fn: Callable, params: Mapping[str, "object"], batches, *, rho: float = 0.0, sgd: dict):
    """Every cohort client's local steps from ``params`` {name: (c, *shape)} over lazy ``batches``.

    Each step: ``grad_fn(theta, idx, m)`` on the step's batch (twice with ``rho > 0``: :func:`sam_gradient`),
    then :func:`pfl_cli.fl.cohort.sgd_update_` with ``sgd`` (lr, momentum, weight_decay, clip); a client whose
    step is inactive (``local_epochs``) keeps its parameters and buffer. Returns the parameters (detached)
    and each client's mean loss over its steps (at the unperturbed point, as SAM reports it).
    """
    import torch

    from pfl_cli.fl.batches import ActiveMean
    from pfl_cli.fl.cohort import sgd_update_

    theta = {k: v.detach().clone() for k, v in params.items()}
    c = batches.num_clients
    device = next(iter(theta.values())).device
    mean_loss = ActiveMean(c, device)
    buf = {k: torch.zeros_like(v) for k, v in theta.items()} if sgd.get("momentum") else {}
    for idx, m, go in batches:
        loss, grads = sam_gradient(lambda th: grad_fn(th, idx, m), theta, rho)
        sgd_update_(theta, {k: g.detach() for k, g in grads.items()}, buf, active=go, **sgd)
        mean_loss.add(loss, go)
    return theta, mean_loss.mean()
