"""Gradient inversion by optimization, every target at once (HyperFL §5, eq. 7).

The dummy data of all n targets is one tensor x (n, b, *input_shape). The targets' losses
are independent, so one backward pass of their sum gives every target its own gradient,
and Adam is elementwise: a single optimizer over the stacked tensor is n independent
attacks run as one batched computation on the device.

- DLG (Zhu, Liu & Han 2019): squared L2 distance between the dummy and the true upload.
- IG (Geiping et al. 2020): 1 - cosine similarity of the uploads plus ``tv`` times the total
  variation of the image, Adam with the learning rate decayed by 0.1 at 3/8, 5/8 and 7/8 of
  the iterations (HyperFL §5 protocol), pixels boxed to the data's valid range.
- ROG-style (Yue et al. 2023): the unknown is a low-resolution image, upsampled bilinearly to the
  input size before the upload is computed (``decode``), matched by cosine; a low-dimensional
  search that ignores the detail a defence may hide in.
"""

from __future__ import annotations

from typing import Callable

MILESTONES = (3 / 8, 5 / 8, 7 / 8)
LOSSES = ("l2", "cosine")


def match_loss(message: dict, target: dict, kind: str):
    """Per-target distance between two uploads (dicts of tensors with a leading target axis)."""
    import torch

    if kind == "l2":
        return sum((message[k] - target[k]).pow(2).flatten(1).sum(1) for k in target)
    dot = sum((message[k] * target[k]).flatten(1).sum(1) for k in target)
    norm_m = torch.sqrt(sum(message[k].pow(2).flatten(1).sum(1) for k in target))
    norm_t = torch.sqrt(sum(target[k].pow(2).flatten(1).sum(1) for k in target))
    return 1.0 - dot / (norm_m * norm_t).clamp_min(1e-12)


def total_variation(images):
    """Mean absolute difference of neighbouring pixels per target: images (n, b, C, H, W) -> (n,)."""
    dh = (images[..., 1:, :] - images[..., :-1, :]).abs().flatten(1).mean(1)
    dw = (images[..., :, 1:] - images[..., :, :-1]).abs().flatten(1).mean(1)
    return dh + dw


def invert_gradients(upload: Callable, target: dict, labels, input_shape: tuple[int, ...], *, loss: str,
                     iterations: int, lr: float, tv: float = 0.0, box=None, image_shape=None, gen=None,
                     init=None, decode: Callable | None = None, latent_shape=None,
                     unknowns: dict | None = None, unknowns_lr: float | None = None,
                     on_step: Callable | None = None):
    """Dummy inputs whose upload matches ``target``, for every target at once.

    Parameters
    ----------
    upload : callable (x, labels) -> dict
        The client's message for inputs x (n, b, *input_shape), differentiable in x.
    target : dict name -> Tensor (n, ...)
        The true uploads.
    labels : LongTensor (n, b)
        Labels the attacker uses (known or inferred).
    loss : "l2" (DLG) or "cosine" (IG)
    iterations, lr : Adam steps and initial learning rate (decayed 10x at :data:`MILESTONES`).
    tv : weight of the total-variation prior (needs ``image_shape``).
    box : (low, high) tensors broadcastable to the optimized variable (x, or z with ``decode``),
        clamped to it after each step.
    image_shape : (C, H, W) view of one input for TV, or None (no spatial prior).
    gen : torch.Generator of the dummy's Gaussian initialization.
    init : Tensor (n, b, *input_shape), optional: the initialization instead of a draw from ``gen``.
    decode, latent_shape : optimize z (n, b, *latent_shape) and attack x = decode(z) (n, b, *input_shape)
        instead of x itself (ROG).
    unknowns : dict name -> Tensor (n, ...), optional
        Starting guesses of the client state the attacker does not know (HyperFL's embedding and
        classifier, HyperFL §5's joint attack), optimized with the images by the same Adam;
        ``upload`` is then called as ``upload(x, labels, unknowns)``.
    unknowns_lr : initial Adam step of the unknowns (decayed with ``lr``); None: ``lr`` (the paper's
        protocol optimizes everything "simultaneously" with one optimizer).
    on_step : callable (iteration, x) called after every step.

    Returns
    -------
    Tensor (n, b, *input_shape): for each target the iterate with the lowest objective seen
    (the initialization when ``iterations`` is 0).
    """
    import torch

    if loss not in LOSSES:
        raise ValueError(f"loss must be one of {', '.join(LOSSES)}; got {loss!r}.")
    n, b = labels.shape
    device = labels.device
    decode = decode if decode is not None else (lambda z: z)
    shape = latent_shape if latent_shape is not None else input_shape
    if init is None:
        init = torch.randn((n, b, *shape), generator=gen, device=gen.device if gen is not None else device)
    z = init.detach().clone().to(device).requires_grad_(True)
    extra = {k: v.detach().clone().to(device).requires_grad_(True) for k, v in (unknowns or {}).items()}
    groups = [{"params": [z], "lr": lr}]
    if extra:
        groups.append({"params": list(extra.values()), "lr": lr if unknowns_lr is None else unknowns_lr})
    opt = torch.optim.Adam(groups)
    sched = torch.optim.lr_scheduler.MultiStepLR(opt, [int(m * iterations) for m in MILESTONES], gamma=0.1)
    best = decode(z).detach().clone()
    best_obj = torch.full((n,), float("inf"), device=device)
    for it in range(iterations):
        opt.zero_grad(set_to_none=True)
        x = decode(z)
        obj = match_loss(upload(x, labels, extra) if unknowns is not None else upload(x, labels), target, loss)
        if tv and image_shape is not None:
            obj = obj + tv * total_variation(x.view(n, b, *image_shape))
        with torch.no_grad():  # keep each target's best iterate (IG keeps the best of its trials)
            better = torch.isfinite(obj) & (obj < best_obj)
            best_obj = torch.where(better, obj.detach(), best_obj)
            best[better] = x.detach()[better]
        # a diverged target (NaN) must not poison the others through the shared backward pass
        torch.nan_to_num(obj, nan=0.0, posinf=0.0).sum().backward()
        for t in (z, *extra.values()):
            if t.grad is not None:
                t.grad.nan_to_num_(0.0, 0.0, 0.0)
        opt.step()
        sched.step()
        if box is not None:
            with torch.no_grad():
                z.copy_(torch.maximum(torch.minimum(z, box[1]), box[0]))
        if on_step is not None:
            with torch.no_grad():
                on_step(it, decode(z))
    return best
