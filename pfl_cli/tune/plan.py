"""What a study resolves before its first trial: the options checked, the plan every trial (and every worker
process) shares, the validation carve it trains and scores on, the config its artifact records.

The command (``pfl_cli.cli.tune_run``) parses, loads the partition and writes; everything here takes plain
values and returns them (one-line :class:`~pfl_cli.errors.ConfigError` on a bad option).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import numpy as np

from pfl_cli.errors import ConfigError


@dataclass(frozen=True)
class TuneOptions:
    space: tuple = ()
    trials: int = 20
    jobs: int = 1
    stack: int = 1
    sampler: str | None = None
    pruner: str | None = None
    storage: str | None = None
    study_name: str | None = None
    validation_fraction: float = 0.2
    validation_clients: float | None = None
    dp_shape: float = 1.0
    dp_score_noise: float = 3.0
    explicit: frozenset = frozenset()
    logs: tuple = ()                 # --log wandb|mlflow: each trial a run (pfl_cli.cli.loggers.StudyLoggers)
    log_dir: Path | None = None      # where --log writes; None without --log
    log_group: str | None = None     # the trackers' group / experiment (default: the study's name)

    def name(self, algorithm: str) -> str:
        """The study's name in its storage (``--study-name``, default ``pflx-tune-ALGORITHM``)."""
        return self.study_name or f"pflx-tune-{algorithm}"


@dataclass(frozen=True)
class Plan:
    """Everything the command resolved before any trial: checked once, shared with worker processes."""

    cfg: Any                 # the base TrainConfig (the user's; best.yaml is it with the best values)
    trial_cfg: Any           # what trials train with (hidden validation-client labels scored when needed)
    params: tuple
    objective: dict
    sampler: str
    pruner: str
    validation_clients: float
    unlabeled_validation: bool


def check_options(cfg, o: TuneOptions):
    """The options checked against the base config, before any work; returns ``(entry, params, sampler, pruner,
    objective)``: the registry entry, the resolved search space, the sampler and pruner names, the objective."""
    from pfl_cli import registry
    from pfl_cli.tune.private import check_private_space
    from pfl_cli.tune.space import parse_space_args, resolve_space
    from pfl_cli.tune.study import PRUNERS, SAMPLERS, objective_of

    if o.trials < 1:
        raise ConfigError(f"--trials must be an integer >= 1; got {o.trials}.")
    if o.jobs < 1:
        raise ConfigError(f"--jobs must be an integer >= 1; got {o.jobs}.")
    if o.stack < 1:
        raise ConfigError(f"--stack must be an integer >= 1; got {o.stack}.")
    if o.stack > 1:
        from pfl_cli.fl.stack import check_stackable

        check_stackable(cfg, registry.stackable_names)
        if o.jobs != 1 or cfg.dp_epsilon is not None:
            raise ConfigError(f"--stack {o.stack} trains trials stacked in this one process; it does not combine with "
                              f"{'--dp' if cfg.dp_epsilon is not None else f'--jobs {o.jobs}'} yet. Drop one of them.")
    if not 0.0 < o.validation_fraction < 1.0:
        raise ConfigError(f"--validation-fraction must be in (0, 1); got {o.validation_fraction!r}.")
    if o.validation_clients is not None and not 0.0 <= o.validation_clients < 1.0:
        raise ConfigError(f"--validation-clients must be in [0, 1); got {o.validation_clients!r}.")
    entry = registry.get(cfg.algorithm)
    params = resolve_space(entry, parse_space_args(o.space))
    private = cfg.dp_epsilon is not None
    sampler = o.sampler or ("random" if private else "tpe")
    pruner = o.pruner or ("none" if private else "median")
    if sampler not in SAMPLERS:
        raise ConfigError(f"--sampler must be one of {', '.join(SAMPLERS)}; got {sampler!r}.")
    if pruner not in PRUNERS:
        raise ConfigError(f"--pruner must be one of {', '.join(PRUNERS)}; got {pruner!r}.")
    if sampler == "grid":
        for p in params:
            if p.kind != "choice":
                p.grid()  # refuses a continuous range in one line
    if private:
        if sampler != "random":
            raise ConfigError(f"--sampler {sampler} under --dp: private selection needs trials drawn independently of "
                              "each other's private scores (Papernot & Steinke 2022); use --sampler random.")
        if pruner != "none":
            raise ConfigError(f"--pruner {pruner} under --dp: pruning reads every trial's private validation curve, "
                              "which no mechanism releases; use --pruner none.")
        if o.storage is not None:
            raise ConfigError("--storage under --dp: a private study keeps its trials in memory (the scores of the "
                              "trials that are not released must not be stored); drop --storage.")
        if o.jobs != 1:
            raise ConfigError(f"--jobs {o.jobs} under --dp: private studies run their trials in one process; use "
                              "--jobs 1.")
        if cfg.dp_accountant != "rdp":
            raise ConfigError(f"dp_accountant {cfg.dp_accountant!r} under pflx tune --dp: the repeat-and-select "
                              "bound (Papernot & Steinke 2022, Thm. 2) is a Renyi-DP bound; use dp_accountant=rdp.")
        if o.trials < 2:
            raise ConfigError(f"--trials under --dp is the mean number of trials and must be >= 2; got {o.trials}.")
        if not (np.isfinite(o.dp_score_noise) and o.dp_score_noise > 0):
            raise ConfigError(f"--dp-score-noise must be a finite number > 0; got {o.dp_score_noise!r}.")
        check_private_space(params)
        from pfl_cli.tune.private import tnb_gamma

        tnb_gamma(float(o.trials), o.dp_shape)  # checks --dp-shape
    elif "dp_shape" in o.explicit or "dp_score_noise" in o.explicit:
        raise ConfigError("--dp-shape / --dp-score-noise apply only with --dp.")
    objective = objective_of(entry.algorithm, cfg.label_mask)
    return entry, params, sampler, pruner, objective


def plan_study(cfg, o: TuneOptions, part, *, checked: tuple | None = None,
               warn: Callable[[str], None] | None = None) -> tuple[Plan, TuneOptions]:
    """The plan of the study of ``cfg`` on the partition ``part``, and the options with the score noise resolved
    under --dp. ``checked``: what :func:`check_options` returned for them (checked here without it). ``warn``: a
    notice about the partition (FLowDUP's size notice; none under --dp, where the number of clients is private)."""
    _entry, params, sampler, pruner, objective = check_options(cfg, o) if checked is None else checked
    private = cfg.dp_epsilon is not None
    notice = getattr(getattr(cfg, "algorithm_class", None), "partition_notice", None)
    if not private and notice is not None and warn is not None and (line := notice(part)):
        warn(line)
    new_group = objective["group"] == "holdout"
    val_clients = o.validation_clients if o.validation_clients is not None else (0.2 if new_group else 0.0)
    if new_group and val_clients == 0:
        raise ConfigError(f"--validation-clients 0: {cfg.algorithm} is scored on clients unseen in training, so the "
                          "study needs validation clients; give a share in (0, 1), e.g. 0.2.")
    if private:  # the score noise from the public federation size, or refused when it cannot select (issue 39)
        from pfl_cli.tune.private import resolve_score_noise

        o = dataclasses.replace(o, dp_score_noise=resolve_score_noise(
            o.dp_score_noise, "dp_score_noise" in o.explicit, population=cfg.dp_population,
            group=objective["group"], validation_clients=val_clients))
    # New clients without labels (FLowDUP's setting): validation clients take part unlabeled, as the real ones
    # will, and their hidden labels only score them.
    unlabeled_validation = bool(new_group and part.labeled is not None and holdout_unlabeled(part))
    trial_cfg = dataclasses.replace(cfg, evaluate_hidden_labels=True) if unlabeled_validation else cfg
    plan = Plan(cfg=cfg, trial_cfg=trial_cfg, params=params, objective=objective, sampler=sampler, pruner=pruner,
                validation_clients=val_clients, unlabeled_validation=unlabeled_validation)
    return plan, o


def artifact_config(plan: Plan, o: TuneOptions) -> dict:
    """The tune artifact's config (what makes a rerun up to date)."""
    from pfl_cli.config import config_to_dict
    from pfl_cli.tune.space import describe

    config = {"train": config_to_dict(plan.cfg), "space": describe(plan.params), "trials": o.trials,
              "sampler": plan.sampler, "pruner": plan.pruner, "validation_fraction": o.validation_fraction,
              "validation_clients": plan.validation_clients, "objective": plan.objective}
    if plan.cfg.dp_epsilon is not None:
        config.update({"dp_shape": o.dp_shape, "dp_score_noise": o.dp_score_noise})
    if o.storage is not None:
        config["study_name"] = o.name(plan.cfg.algorithm)
    return config


def holdout_unlabeled(part) -> bool:
    holdout = np.flatnonzero(np.asarray(part.role) == 1)
    return len(holdout) > 0 and not np.asarray(part.labeled)[holdout].any()


def tuning_data(ds, part, seed: int, fraction: float, val_clients: float, unlabeled: bool, noise: str | None = None):
    """The data every trial trains and scores on: the dataset and its validation carve
    (:func:`pfl_cli.tune.split.validation_partition`). ``noise``: ``--dp``'s noise mode (the carve's salt from OS
    entropy unless seeded, the carve neighbour-stable)."""
    from pfl_cli.privacy.randomness import noise_source
    from pfl_cli.tune.split import validation_partition
    from pfl_cli.tune.trial import TuningData

    rng = noise_source("seeded" if noise is None else noise, seed).numpy("tune-validation")
    vpart = validation_partition(part, val_fraction=fraction, val_clients=val_clients, rng=rng,
                                 unlabeled_validation_clients=unlabeled, x=ds.x, y=ds.y, stable=noise is not None)
    return TuningData(ds.x, ds.y, ds.num_classes, vpart, labeled=ds.labeled, vocab_size=ds.extra.get("vocab_size"))


def plan_data(plan: Plan, o: TuneOptions, ds, part):
    """:func:`tuning_data` of ``plan`` (under --dp with its noise mode)."""
    private = plan.cfg.dp_epsilon is not None
    return tuning_data(ds, part, plan.cfg.seed, o.validation_fraction, plan.validation_clients,
                       plan.unlabeled_validation, noise=plan.cfg.dp_noise if private else None)
