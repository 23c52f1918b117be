"""The validated public entry points of ``train`` and ``predict``.

>>> from pfl_cli.data import load_dataset
>>> from pfl_cli.partition import PartitionConfig, partition_labels
>>> from pfl_cli.rng import make_rng
>>> ds = load_dataset("builtin:digits")
>>> cfg = PartitionConfig(scheme="pathological", classes_per_client=2, num_clients=20, holdout_clients=4,
...                       test_fraction=0.3)
>>> part = partition_labels(ds.y, cfg, num_classes=10, rng=make_rng(0, "partition"))
>>> run = train_federated(ds.x, ds.y, 10, part, TrainConfig(rounds=20, eval_every=10, lr=0.05))
>>> run.outcome.best.summaries()["holdout"]["num_clients"]
4
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import numpy as np

from pfl_cli.errors import ConfigError, InputError
from pfl_cli.fl.config import (ALGORITHMS, CLIENT_ARCHS, CLIENT_SETS, EMBEDDINGS, EVAL_DESCRIPTORS, HYPER_SIZES,
                               SERVER_OPTIMIZERS, PredictConfig, TrainConfig)

MODEL_FORMAT = "pflx-model-1"


def validate_train_config(cfg: TrainConfig) -> None:
    """Every check on the options, before any data is read or drawn."""
    choices = {"algorithm": ALGORITHMS, "model_arch": CLIENT_ARCHS, "embedding": EMBEDDINGS,
               "hyper_size": HYPER_SIZES, "server_optimizer": SERVER_OPTIMIZERS, "eval_descriptor": EVAL_DESCRIPTORS}
    for name, allowed in choices.items():
        if getattr(cfg, name) not in allowed:
            raise ConfigError(f"{name} must be one of {', '.join(allowed)}; got {getattr(cfg, name)!r}.")
    for name in ("rounds",):
        _int(cfg, name, 0)
    for name in ("clients_per_round", "local_steps", "batch_size", "descriptor_batch", "eval_every", "hyper_hidden"):
        _int(cfg, name, 1)
    for name in ("embed_dim", "finetune_steps", "checkpoint_every", "seed"):
        _int(cfg, name, 0)
    if cfg.local_epochs is not None:
        _int(cfg, "local_epochs", 1)
    for name in ("lr", "momentum", "client_clip", "server_momentum", "server_clip", "lambda_h", "lambda_v",
                 "lambda_theta"):
        value = getattr(cfg, name)
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not np.isfinite(value) or value < 0:
            raise ConfigError(f"{name} must be a finite number >= 0; got {value!r}.")
    if cfg.lr <= 0:
        raise ConfigError(f"lr must be > 0; got {cfg.lr!r}.")
    if cfg.momentum >= 1 or cfg.server_momentum >= 1:
        raise ConfigError(f"momentum and server_momentum must be < 1; got {cfg.momentum}, {cfg.server_momentum}.")
    if cfg.server_lr is not None and (not np.isfinite(cfg.server_lr) or cfg.server_lr <= 0):
        raise ConfigError(f"server_lr must be a finite number > 0; got {cfg.server_lr!r}.")
    if not 0.0 <= cfg.val_fraction < 1.0:
        raise ConfigError(f"val_fraction must be in [0, 1); got {cfg.val_fraction!r}.")
    _validate_dp(cfg)
    hidden = cfg.mlp_hidden if isinstance(cfg.mlp_hidden, (list, tuple)) else [cfg.mlp_hidden]
    if not all(isinstance(h, int) and not isinstance(h, bool) and h >= 1 for h in hidden):
        raise ConfigError(f"mlp_hidden must be a list of positive layer widths; got {cfg.mlp_hidden!r}.")


def _validate_dp(cfg: TrainConfig) -> None:
    """--dp on an algorithm that has a DP variant, with its public bounds (``pfl_cli.fl.dp``)."""
    from pfl_cli.algorithms import REGISTRY
    from pfl_cli.fl.dp import check_dp_options
    from pfl_cli.privacy import ACCOUNTANTS

    cls = REGISTRY[cfg.algorithm]
    if cfg.dp_epsilon is None:
        if cls.dp_required:
            raise ConfigError(f"algorithm {cfg.algorithm!r} is a local-DP algorithm and needs --dp eps=E,clip=C "
                              "(the paper ran eps=4,delta=1e-5,clip=0.04).")
        if cfg.write_nonprivate:
            raise ConfigError("--write-nonprivate only applies with --dp (without DP every file is written).")
        return
    if cls.dp_unit is None:
        supported = ", ".join(name for name, c in REGISTRY.items() if c.dp_unit is not None)
        raise ConfigError(f"--dp is not supported by algorithm {cfg.algorithm!r}; algorithms with a DP variant: "
                          f"{supported}.")
    if cfg.dp_accountant not in ACCOUNTANTS:
        raise ConfigError(f"dp_accountant must be one of {', '.join(ACCOUNTANTS)}; got {cfg.dp_accountant!r}.")
    check_dp_options(cfg)
    cls.check_dp_config(cfg)


def _int(cfg, name: str, low: int) -> None:
    value = getattr(cfg, name)
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < low:
        raise ConfigError(f"{name} must be an integer >= {low}; got {value!r}.")


@dataclass(frozen=True)
class TrainRun:
    """A finished training run: the model payload and everything the artifact reports."""

    model: dict[str, Any]        # the model.pt payload (see :func:`model_payload`)
    outcome: Any                 # pfl_cli.fl.loop.TrainOutcome
    store: Any
    algorithm: Any
    dp: Any = None               # the calibrated DP mechanism under --dp (``ledger()``, ``info()``)


def make_algorithm(cfg: TrainConfig, store, *, arch: dict | None = None):
    from pfl_cli.algorithms import REGISTRY

    return REGISTRY[cfg.algorithm](cfg, store, arch=arch)


def train_federated(x: np.ndarray, y: np.ndarray, num_classes: int, partition, cfg: TrainConfig, *,
                    device: Any = None, resume: dict | None = None,
                    on_checkpoint: Callable[[dict], None] | None = None,
                    on_progress: Callable[[int, int, dict], None] | None = None) -> TrainRun:
    """Train ``cfg.algorithm`` on a partition's train clients and evaluate on all its clients.

    Parameters
    ----------
    x, y : ndarray
        The dataset in sample order (the partition's indices point into it).
    num_classes : int
    partition : pfl_cli.partition.Partition
        Role 0 clients train; role 1 (holdout) clients are only evaluated.
    cfg : TrainConfig
    device : torch.device, optional
        Default: ``resolve_device(cfg.device)``.
    resume, on_checkpoint, on_progress
        See :func:`pfl_cli.fl.loop.run_rounds`.
    """
    from pfl_cli.fl.device import resolve_device
    from pfl_cli.fl.loop import run_rounds
    from pfl_cli.fl.store import build_store
    from pfl_cli.rng import make_rng

    validate_train_config(cfg)
    device = device if device is not None else resolve_device(cfg.device)
    store = build_store(x, y, num_classes, partition, val_fraction=cfg.val_fraction,
                        rng=make_rng(cfg.seed, "validation-split"), device=device, normalize=cfg.normalize)
    alg = make_algorithm(cfg, store)
    if cfg.dp_epsilon is not None:
        alg.dp = plan_dp(cfg, store)  # calibrated before the first round
    outcome = run_rounds(alg, cfg, resume=resume, on_checkpoint=on_checkpoint, on_progress=on_progress)
    return TrainRun(model=model_payload(alg, outcome.weights), outcome=outcome, store=store, algorithm=alg,
                    dp=alg.dp)


def plan_dp(cfg: TrainConfig, store):
    """The calibrated mechanism of ``cfg.algorithm`` under --dp (from public inputs only)."""
    from pfl_cli.algorithms import REGISTRY

    return REGISTRY[cfg.algorithm].plan_dp(cfg, store)


def model_payload(alg, weights: dict) -> dict[str, Any]:
    """What ``model.pt`` holds: plain dicts, strings and tensors (``torch.load(weights_only=True)``)."""
    import torch

    return {
        "format": MODEL_FORMAT,
        "algorithm": alg.name,
        "arch": alg.arch,
        "normalization": {"mean": alg.store.mean.detach().cpu(), "std": alg.store.std.detach().cpu()},
        "weights": weights,
        "num_classes": torch.tensor(alg.store.num_classes),
    }


@dataclass(frozen=True)
class PredictRun:
    clients: np.ndarray          # client positions in the partition
    evaluation: Any              # GroupEval
    params: dict | None          # per-client weights when requested
    personalized: bool
    optimizer_steps: int


def predict_clients(model: dict, train_cfg: TrainConfig, x: np.ndarray, y: np.ndarray, num_classes: int, partition,
                    cfg: PredictConfig, *, device: Any = None) -> PredictRun:
    """Models for a partition's clients from a trained model (Alg. 7 for PeFLL) and their test accuracy.

    PeFLL generates each client's model from its descriptor with no optimizer step; FedAvg
    uses the global model (fine-tuned ``finetune_steps`` steps when asked); Local trains
    each client from the shared initialization. The trained weights are left untouched.
    """
    import dataclasses

    from pfl_cli.fl.device import resolve_device
    from pfl_cli.fl.evaluate import personalize_and_evaluate
    from pfl_cli.fl.store import ROLE_HOLDOUT, ROLE_TRAIN, build_store
    from pfl_cli.rng import torch_generator

    if cfg.clients not in CLIENT_SETS:
        raise ConfigError(f"clients must be one of {', '.join(CLIENT_SETS)}; got {cfg.clients!r}.")
    if model.get("format") != MODEL_FORMAT:
        raise InputError(f"model: expected a {MODEL_FORMAT} payload; got format {model.get('format')!r}.")
    overrides = {k: getattr(cfg, k) for k in ("label_mask", "finetune_steps", "eval_descriptor")
                 if getattr(cfg, k) is not None}
    train_cfg = dataclasses.replace(train_cfg, **overrides)
    validate_train_config(train_cfg)
    roles = {"holdout": [ROLE_HOLDOUT], "train": [ROLE_TRAIN], "all": [ROLE_TRAIN, ROLE_HOLDOUT]}[cfg.clients]
    clients = np.flatnonzero(np.isin(partition.role, roles))
    if len(clients) == 0:
        raise InputError(f"clients {cfg.clients!r}: the partition has no such clients "
                         f"({int(np.sum(partition.role == ROLE_TRAIN))} train, "
                         f"{int(np.sum(partition.role == ROLE_HOLDOUT))} holdout); re-partition with holdout "
                         "clients (e.g. pflx partition --holdout-clients 10) or pass --clients train|all.")
    device = device if device is not None else resolve_device(cfg.device)
    norm = model["normalization"]
    store = build_store(x, y, num_classes, partition, val_fraction=0.0, rng=None, device=device,
                        normalize=True, stats=(norm["mean"].numpy(), norm["std"].numpy()))
    alg = make_algorithm(train_cfg, store, arch=model["arch"])
    alg.load_weights(model["weights"])
    steps_before = _optimizer_steps(alg)  # server steps; local SGD steps are counted from zero
    evals, params, personalized = personalize_and_evaluate(
        alg, clients, ("test",), torch_generator(cfg.seed, "predict"), keep_params=cfg.save_models,
        max_samples=cfg.batch_size * 32)
    return PredictRun(clients=clients, evaluation=evals["test"], params=params, personalized=personalized,
                      optimizer_steps=_optimizer_steps(alg) - steps_before)


def _optimizer_steps(alg) -> int:
    """Server optimizer steps taken (per parameter, summed) plus clients' local SGD steps."""
    opt = getattr(alg, "opt", None)
    server = 0 if opt is None else sum(int(s.get("step", 0)) for s in opt.state.values())
    return server + alg.client_sgd_steps
