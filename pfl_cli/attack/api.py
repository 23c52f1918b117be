"""The validated public entry point of ``pflx attack``: an honest-but-curious server (HyperFL §5).

For each target (a batch of ``batch_size`` images of one client) the trained algorithm's own
``upload`` hook computes the message that client would send; each attack then rebuilds the
images from the message alone, every target at once, and the reconstructions are scored
against the originals with PSNR and SSIM on images scaled to [0, 1].
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np

from pfl_cli.attack.config import ATTACK_CHOICES, ATTACK_CLIENTS, ATTACKS, UPLOADS, AttackConfig
from pfl_cli.attack.protocol import attackable
from pfl_cli.errors import ConfigError, InputError

ROLES = {"train": 0, "holdout": 1}


@dataclass(frozen=True)
class AttackRun:
    """Targets, originals and reconstructions (inputs in [0, 1]), and their scores."""

    client: np.ndarray               # (n_images,) partition position of each image's client
    sample: np.ndarray               # (n_images,) dataset index
    label: np.ndarray                # (n_images,)
    original: np.ndarray             # (n_images, *input_shape) in [0, 1]
    reconstruction: dict             # attack -> (n_images, *input_shape) in [0, 1]
    psnr: dict                       # attack -> (n_images,)
    ssim: dict                       # attack -> (n_images,) or None (vector data)
    lpips: dict                      # attack -> (n_images,) or None (no --lpips-weights)
    label_accuracy: float | None     # share of labels --infer-labels got right
    image_shape: tuple | None        # (C, H, W) view of one input, None for vector data
    upload: list                     # names of the message's tensors
    upload_steps: int                # local SGD steps behind the message (0: a gradient)


# Bound on --iterations: an unbounded request would run with no end and no message (issue 25).
MAX_ITERATIONS = 100_000


def validate_attack_config(cfg: AttackConfig) -> None:
    if cfg.attack not in ATTACK_CHOICES:
        raise ConfigError(f"attack must be one of {', '.join(ATTACK_CHOICES)}; got {cfg.attack!r}.")
    if cfg.upload not in UPLOADS:
        raise ConfigError(f"upload must be one of {', '.join(UPLOADS)}; got {cfg.upload!r}.")
    if cfg.clients not in ATTACK_CLIENTS:
        raise ConfigError(f"clients must be one of {', '.join(ATTACK_CLIENTS)}; got {cfg.clients!r}.")
    for name, low in (("images", 1), ("batch_size", 1), ("iterations", 0), ("local_steps", 0), ("seed", 0)):
        value = getattr(cfg, name)
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < low:
            raise ConfigError(f"{name} must be an integer >= {low}; got {value!r}.")
    if cfg.iterations > MAX_ITERATIONS:
        raise ConfigError(f"iterations must be <= {MAX_ITERATIONS} (ten times the longest attack of the papers, IG's "
                          f"10000 Adam steps); got {cfg.iterations}.")
    for name in ("lr", "tv"):
        value = getattr(cfg, name)
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
            raise ConfigError(f"{name} must be a finite number >= 0; got {value!r}.")
    if isinstance(cfg.rog_scale, bool) or not isinstance(cfg.rog_scale, (int, np.integer)) or cfg.rog_scale < 1:
        raise ConfigError(f"rog_scale must be an integer >= 1; got {cfg.rog_scale!r}.")
    if cfg.lr <= 0:
        raise ConfigError(f"lr must be > 0; got {cfg.lr!r}.")
    u = cfg.unknowns_lr
    if u is not None and (isinstance(u, bool) or not isinstance(u, (int, float)) or not math.isfinite(u) or u <= 0):
        raise ConfigError(f"unknowns_lr must be a finite number > 0 (or unset: lr); got {u!r}.")
    if cfg.images % cfg.batch_size:
        raise ConfigError(f"images must be a multiple of batch_size ({cfg.batch_size}); got {cfg.images}.")
    if cfg.infer_labels and cfg.batch_size != 1:
        raise ConfigError(f"infer_labels: the iDLG rule needs batch_size 1; got {cfg.batch_size}.")
    if cfg.upload == "weights" and cfg.local_steps:
        raise ConfigError(f"local_steps: --upload weights sends the trained round's local update (its own steps); "
                          f"--local-steps K is for --upload gradient; got local_steps {cfg.local_steps}.")
    if cfg.attack == "analytic" and (cfg.batch_size != 1 or cfg.local_steps > 1):
        raise ConfigError("attack analytic: the closed form is exact for one image and the gradient or one local "
                          "step; got "
                          f"batch_size {cfg.batch_size}, local_steps {cfg.local_steps}.")


def attacks_of(cfg: AttackConfig, analytic_ok: bool, images: bool) -> list[str]:
    """The attacks ``cfg.attack`` runs; ``all`` includes analytic only where its closed form holds
    and rog only on images."""
    if cfg.attack != "all":
        return [cfg.attack]
    return [a for a in ATTACKS if (a != "analytic" or analytic_ok) and (a != "rog" or images)]


def image_view(input_shape: tuple[int, ...], nonnegative: bool) -> tuple[int, int, int] | None:
    """(C, H, W) of an image input, or None for vector data.

    Datasets carry no image flag, so a flat vector is taken for a one-channel square image when
    it has a square length of at least 16 and no negative value, like pixel intensities
    (digits: 64 = 8x8 values in 0..16); features that go negative (ring) stay a vector.
    """
    if len(input_shape) == 3:
        return tuple(input_shape)
    if (nonnegative and len(input_shape) == 1 and input_shape[0] >= 16
            and math.isqrt(input_shape[0]) ** 2 == input_shape[0]):
        r = math.isqrt(input_shape[0])
        return (1, r, r)
    return None


def select_targets(partition, clients: str, n_targets: int, batch: int, rng) -> tuple[np.ndarray, np.ndarray]:
    """``n_targets`` disjoint batches of ``batch`` train samples, each from one client, spread over the clients.

    Clients are visited in a random order, round robin, each giving its next unused batch;
    returns the client position (n_targets,) and the dataset indices (n_targets, batch).
    """
    positions = np.flatnonzero(np.asarray(partition.role) == ROLES[clients])
    owner, samples = partition.train_owner(), np.asarray(partition.train_indices)
    pools = []
    for c in rng.permutation(positions):
        mine = rng.permutation(samples[owner == c])
        pools.append([(c, mine[i:i + batch]) for i in range(0, len(mine) - batch + 1, batch)])
    available = sum(len(p) for p in pools)
    if available < n_targets:
        raise InputError(f"images: {n_targets * batch} images in batches of {batch} need {n_targets} batches; the "
                         f"{len(positions)} {clients} clients hold only {available} such batches "
                         f"({int(np.isin(owner, positions).sum())} train samples).")
    picked = []
    depth = 0
    while len(picked) < n_targets:
        for p in pools:
            if depth < len(p) and len(picked) < n_targets:
                picked.append(p[depth])
        depth += 1
    return np.array([c for c, _ in picked]), np.stack([s for _, s in picked])


def attack_model(model: dict, train_cfg, x: np.ndarray, y: np.ndarray, num_classes: int, partition,
                 cfg: AttackConfig, *, device: Any = None,
                 on_progress: Callable[[str, int, int, float], None] | None = None) -> AttackRun:
    """Simulate the server's attack on the uploads of a partition's clients (HyperFL §5, App. D).

    Parameters
    ----------
    model : dict
        A ``model.pt`` payload of ``pflx train``.
    train_cfg : TrainConfig
        The run's config (learning rate, clipping, ... of the clients' local SGD).
    x, y, num_classes, partition
        The dataset in sample order and a partition over it; targets are train samples of
        the ``cfg.clients`` clients.
    cfg : AttackConfig
    on_progress : callable (attack, iteration, iterations, mean PSNR)
    """
    import torch

    from pfl_cli.attack import analytic
    from pfl_cli.attack.invert import invert_gradients
    from pfl_cli.attack.metrics import psnr
    from pfl_cli.fl.device import resolve_device
    from pfl_cli.rng import make_rng, torch_generator

    validate_attack_config(cfg)
    _check_attacked_run(model, train_cfg, cfg)
    lpips_weights = _lpips_weights(cfg.lpips_weights, x)
    device = device if device is not None else resolve_device(cfg.device)
    n_targets, b = cfg.images // cfg.batch_size, cfg.batch_size
    target_client, index = select_targets(partition, cfg.clients, n_targets, b, make_rng(cfg.seed, "attack-targets"))
    store, alg = _server_model(model, train_cfg, x, y, num_classes, partition, device)

    idx = torch.as_tensor(index, device=device)
    x_true, y_true = store.inputs(idx), store.y[idx]
    # None: the round's whole local update as trained (--upload weights); its SGD steps bound the closed form
    steps = cfg.local_steps if cfg.upload == "gradient" else None
    upload_steps = cfg.local_steps if steps is not None else alg.round_upload_steps()
    # The true upload carries the client's own noise (local DP); the attacker's model of it has none.
    clients = torch.as_tensor(target_client, device=device)
    message, start = alg.upload(x_true, y_true, steps=steps, noise_gen=torch_generator(cfg.seed, "attack-dp-noise"),
                                clients=clients)
    message = {k: v.detach() for k, v in message.items()}
    start = {k: v.detach() for k, v in start.items()}
    leaked = alg.leaked_gradients(message, start)  # client-net gradients a one-step message reveals
    names = list(leaked)
    unknowns = alg.attack_private(n_targets)       # client state the server never sees (joint attack)
    labels, label_accuracy = _labels(cfg, alg, leaked, y_true)

    pixels = _Pixels(float(np.min(x)), float(np.max(x)), store.mean, store.std)
    shape = store.input_shape
    view = image_view(shape, pixels.lo >= 0)
    affine = analytic.first_affine(names, {k: v.shape[1:] for k, v in leaked.items()})
    chosen = _chosen_attacks(cfg, train_cfg, model, names, affine, upload_steps, b, view, shape)
    truth = pixels.unit(x_true)

    def score(rec):
        return psnr(rec.flatten(1), truth.flatten(1))

    def upload(xd, yd, private=None):  # the server knows the model it sent: the dummy's upload starts from it too
        return alg.upload(xd, yd, steps=steps, start=start, private=private)[0]

    results, psnrs, ssims, lpipss = {}, {}, {}, {}
    for a in chosen:
        if a == "analytic":
            w, bias = affine
            rec = analytic.recover_affine_input(leaked[w], leaked[bias]).view(n_targets, 1, *shape)
        else:
            every = max(1, cfg.iterations // 100)

            def on_step(it, xd, a=a):
                if on_progress is not None and ((it + 1) % every == 0 or it + 1 == cfg.iterations):
                    on_progress(a, it + 1, cfg.iterations, float(score(pixels.unit(xd)).mean()))

            extra = {"box": pixels.box}
            if a == "rog":
                latent = _rog_latent(view, cfg.rog_scale)
                zero = torch.zeros((), device=device)
                extra = {"decode": pixels.rog_decoder(view, (n_targets, b, *shape)), "latent_shape": latent,
                         "box": (zero, zero + 1),
                         "init": torch.rand((n_targets, b, *latent), generator=torch_generator(cfg.seed, "attack-rog"))}
            rec = invert_gradients(upload, message, labels, shape, loss="l2" if a == "dlg" else "cosine",
                                   iterations=cfg.iterations, lr=cfg.lr, tv=cfg.tv if a == "ig" else 0.0,
                                   image_shape=view, gen=torch_generator(cfg.seed, f"attack-{a}"), on_step=on_step,
                                   unknowns=unknowns or None, unknowns_lr=cfg.unknowns_lr, **extra)
            rec = _match_order(rec, x_true)
        r = pixels.unit(rec.detach())
        results[a] = r.cpu().numpy()
        psnrs[a] = score(r).cpu().numpy()
        ssims[a], lpipss[a] = _image_scores(r, truth, view, lpips_weights)
    return AttackRun(client=np.repeat(target_client, b), sample=index.reshape(-1),
                     label=y_true.flatten().cpu().numpy(), original=truth.cpu().numpy(), reconstruction=results,
                     psnr=psnrs, ssim=ssims, lpips=lpipss, label_accuracy=label_accuracy, image_shape=view,
                     upload=list(message), upload_steps=upload_steps)


def _check_attacked_run(model: dict, train_cfg, cfg: AttackConfig) -> None:
    """Refuse a model payload, an algorithm or a run whose uploads the attack does not model."""
    from pfl_cli.fl.api import MODEL_FORMAT, validate_train_config

    if model.get("format") != MODEL_FORMAT:
        raise InputError(f"model: expected a {MODEL_FORMAT} payload; got format {model.get('format')!r}.")
    validate_train_config(train_cfg)
    cls = train_cfg.algorithm_class
    if not attackable(cls):  # the command names the attacked algorithms first (pfl_cli.cli.attack_run)
        raise InputError(f"--model: algorithm {train_cfg.algorithm!r} is not attacked: pflx attack models the "
                         f"uploads of algorithms that implement pfl_cli.attack.protocol.Attackable.")
    dp = train_cfg.dp_epsilon is not None
    if dp and not cls.upload_under_dp:
        raise InputError(f"--model: a --dp {train_cfg.algorithm!r} run's uploads are not modelled by pflx attack.")
    if dp and cfg.upload == "gradient" and cfg.local_steps == 0:
        raise InputError(f"local_steps 0: a client of a --dp run never uploads a raw gradient; attack the delta it "
                         f"sends with --upload weights or --local-steps K (the run's local_steps: "
                         f"{getattr(train_cfg, 'local_steps', None)}).")
    if cfg.upload == "weights" and cfg.batch_size > train_cfg.batch_size:
        raise InputError(f"batch_size: --upload weights replays the trained round on the client's batch as one "
                         f"minibatch, so it must not exceed the run's batch_size {train_cfg.batch_size}; got "
                         f"{cfg.batch_size}.")


def _lpips_weights(path, x: np.ndarray):
    """LPIPS's weights from ``--lpips-weights`` (None: no LPIPS), refused for inputs too small for it."""
    if path is None:
        return None
    from pfl_cli.attack.lpips import MIN_SIZE, load_lpips_weights

    weights = load_lpips_weights(path)
    view = image_view(tuple(x.shape[1:]), bool(np.min(x) >= 0))
    if view is None or min(view[1:]) < MIN_SIZE:
        raise InputError(f"--lpips-weights: LPIPS needs images of at least {MIN_SIZE}x{MIN_SIZE}; the data's "
                         f"inputs have shape {tuple(x.shape[1:])}.")
    return weights


def _server_model(model: dict, train_cfg, x, y, num_classes: int, partition, device):
    """``(store, algorithm)``: the trained algorithm as the server holds it, inputs standardized as in training."""
    import torch

    from pfl_cli.fl.api import make_algorithm
    from pfl_cli.fl.store import build_store
    from pfl_cli.readers.model import restore

    norm = model["normalization"]
    store = build_store(x, y, num_classes, partition, val_fraction=0.0, rng=None, device=device, normalize=True,
                        stats=(norm["mean"].numpy(), norm["std"].numpy()))
    alg = make_algorithm(train_cfg, store, arch=model["arch"])
    restore(alg.load_weights, model["weights"], "model.pt: the weights tree", fix="Re-create it with pflx train.",
            like=alg.weights())
    if train_cfg.dp_epsilon is not None:
        from pfl_cli.fl.api import plan_dp

        alg.dp = plan_dp(train_cfg, store)  # the run's calibrated mechanism (public inputs only)
    for module in (m for m in vars(alg).values() if isinstance(m, torch.nn.Module)):
        module.requires_grad_(False)  # the attacker differentiates in the dummy data only
    return store, alg


def _labels(cfg: AttackConfig, alg, leaked: dict, y_true):
    """``(labels, label_accuracy)``: the true labels, or with ``infer_labels`` the iDLG rule's (and their accuracy)."""
    import torch

    from pfl_cli.attack import analytic

    if not cfg.infer_labels:
        return y_true, None
    lb = analytic.last_bias(list(leaked))
    if lb is None or lb != list(dict(alg.net.named_parameters()))[-1]:
        raise InputError("infer_labels: the upload reveals no gradient of the model's output bias for the "
                         "iDLG rule.")
    labels = analytic.infer_labels(leaked[lb])[:, None]
    return labels, float((labels == y_true).to(torch.float64).mean())


def _chosen_attacks(cfg: AttackConfig, train_cfg, model: dict, names: list, affine, upload_steps: int, b: int,
                    view, shape) -> list[str]:
    """The attacks to run (:func:`attacks_of`), refusing one whose premise the upload or the data breaks."""
    chosen = attacks_of(cfg, affine is not None and b == 1 and upload_steps <= 1, view is not None)
    if "analytic" in chosen and upload_steps > 1:
        raise InputError(f"attack analytic: the closed form is exact for the gradient or one local step; the "
                         f"{train_cfg.algorithm!r} run's round takes {upload_steps} steps (--upload weights).")
    if "analytic" in chosen and affine is None:
        raise InputError(f"attack analytic: needs a first fully connected layer with bias; the "
                         f"{model['arch']['client'].get('arch')} model's first layer is {names[0]!r}.")
    if "rog" in chosen and view is None:
        raise InputError(f"attack rog: needs image inputs (its unknown is a low-resolution image); the data's "
                         f"inputs have shape {shape}.")
    return chosen


@dataclass(frozen=True)
class _Pixels:
    """Standardized inputs -> pixels in [0, 1] by the dataset's value range (public: the data format)."""

    lo: float      # the raw data's minimum and maximum
    hi: float
    mean: Any      # the store's standardization
    std: Any

    @property
    def span(self) -> float:
        return max(self.hi - self.lo, 1e-12)

    @property
    def box(self) -> tuple:
        """The standardized values of the raw range: where a reconstruction is kept."""
        return ((self.lo - self.mean) / self.std, (self.hi - self.mean) / self.std)

    def unit(self, t):
        """(n, b, *shape) standardized -> (n * b, *shape) in [0, 1]."""
        return ((t * self.std + self.mean - self.lo) / self.span).clamp(0.0, 1.0).flatten(0, 1)

    def rog_decoder(self, view, batch_shape: tuple):
        """ROG's z, a low-resolution image in [0, 1] -> the standardized full-size input (bilinear upsampling)."""
        import torch

        _, h, w = view

        def decode(z):
            up = torch.nn.functional.interpolate(z.flatten(0, 1), size=(h, w), mode="bilinear", align_corners=False)
            return ((up * self.span + self.lo).view(*batch_shape) - self.mean) / self.std

        return decode


def _rog_latent(view, scale: int) -> tuple:
    """ROG's unknown: the image at 1/``scale`` of its resolution, (C, h, w)."""
    c, h, w = view
    return (c, max(1, h // scale), max(1, w // scale))


def _image_scores(r, truth, view, lpips_weights) -> tuple:
    """``(SSIM, LPIPS)`` per image of reconstruction ``r`` against ``truth``: None for vector data / no weights."""
    import torch

    from pfl_cli.attack.metrics import ssim

    s = None if view is None else ssim(r.view(-1, *view), truth.view(-1, *view)).cpu().numpy()
    if lpips_weights is None:
        return s, None
    from pfl_cli.attack.lpips import lpips

    with torch.no_grad():
        return s, lpips(r.view(-1, *view), truth.view(-1, *view), lpips_weights).cpu().numpy()


def _match_order(rec, truth):
    """Reorder each target's reconstructed batch to the originals (a batch's order is not recoverable)."""
    import torch
    from scipy.optimize import linear_sum_assignment

    if rec.shape[1] == 1:
        return rec
    cost = torch.cdist(rec.flatten(2), truth.flatten(2)).cpu().numpy()  # (n, b, b)
    out = rec.clone()
    for i in range(rec.shape[0]):  # scipy's assignment per target: b is small
        r, c = linear_sum_assignment(cost[i])
        out[i, c] = rec[i, r]
    return out
