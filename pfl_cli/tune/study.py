"""The study of `pflx tune`: Optuna trials that each train a config on validation data and score it there.

>>> # a sketch of the library use (the CLI adds the artifact, resumption and processes):
>>> # study = open_study("sqlite:///t/study.db", "s", sampler=make_sampler("tpe", params, seed=0),
>>> #                    pruner=make_pruner("median"), meta={"algorithm": "fedavg", "partition": sha})
>>> # study.optimize(Objective(data, cfg, params), n_trials=12, catch=(TrialFailed,))

Each trial draws the searched keys (:func:`pfl_cli.tune.space.suggest`), trains with
:func:`pfl_cli.fl.api.train_federated` on the tuning partition (:mod:`pfl_cli.tune.split`) and
returns the headline accuracy on the group the method is for (the train clients' validation split,
or the validation clients). Every evaluation is reported to the pruner, which stops a trial whose
curve trails the others (median rule, Optuna's MedianPruner; or successive halving, Li et al. 2018).
A trial that diverges or whose drawn config is invalid is recorded as failed with its reason and the
study goes on.
"""

from __future__ import annotations

import dataclasses
import math
import os
from dataclasses import dataclass
from typing import Any, Callable, Mapping, Sequence

import numpy as np

from pfl_cli.errors import ConfigError, InputError, PflxError

SAMPLERS = ("tpe", "random", "grid")
PRUNERS = ("median", "halving", "none")
META_KEYS = ("algorithm", "partition", "objective")  # what a resumed study must share with the command


class TrialFailed(Exception):
    """A trial that could not finish (diverged, invalid drawn config): recorded as failed, never fatal."""


@dataclass(frozen=True)
class TuningData:
    """What every trial trains and scores on: the dataset and the tuning partition (validation data only)."""

    x: np.ndarray
    y: np.ndarray
    num_classes: int
    partition: Any          # pfl_cli.tune.split.validation_partition(...)
    labeled: np.ndarray | None = None
    vocab_size: int | None = None  # text data (token codes): the dataset's vocabulary


def objective_of(algorithm_class: type, label_mask: bool) -> dict[str, str]:
    """The group and metric a study maximizes: the method's own clients, its headline metric."""
    group = "holdout" if getattr(algorithm_class, "tune_group", "train") == "new" else "train"
    return {"group": group, "scored_on": "validation clients" if group == "holdout" else
            "train clients' validation samples",
            "metric": "mean_accuracy_lm" if label_mask else "mean_accuracy"}


def make_sampler(kind: str, params: Sequence, *, seed: int | None):
    import optuna

    if kind not in SAMPLERS:
        raise ConfigError(f"--sampler must be one of {', '.join(SAMPLERS)}; got {kind!r}.")
    if kind == "grid":
        return optuna.samplers.GridSampler({p.key: p.stored_values() for p in params}, seed=seed)
    if kind == "random":
        return optuna.samplers.RandomSampler(seed=seed)
    # a few random trials first, as TPE needs (Bergstra et al. 2011); fewer than Optuna's 10 so that a
    # 12-trial study still models the space
    return optuna.samplers.TPESampler(seed=seed, n_startup_trials=4)


def grid_size(params: Sequence) -> int:
    return int(np.prod([len(p.stored_values()) for p in params]))


def make_pruner(kind: str, *, rounds: int = 0):
    """The pruner; no trial is judged before a quarter of its ``rounds`` (hypernetwork methods such as PeFLL
    rise late, and a first evaluation says little about where a curve ends)."""
    import optuna

    if kind not in PRUNERS:
        raise ConfigError(f"--pruner must be one of {', '.join(PRUNERS)}; got {kind!r}.")
    warmup = max(int(rounds) // 4, 0)
    if kind == "median":
        # a trial is stopped once its curve is below the median of earlier trials at the same round; the
        # first four trials (the sampler's random start) run whole so the median means something
        return optuna.pruners.MedianPruner(n_startup_trials=4, n_warmup_steps=warmup)
    if kind == "halving":
        return optuna.pruners.SuccessiveHalvingPruner(min_resource=max(warmup, 1), reduction_factor=3)
    return optuna.pruners.NopPruner()


def open_storage(url: str):
    """An Optuna RDB storage at ``url`` (``sqlite:///PATH``, ``postgresql://...``); InputError if it cannot open."""
    import optuna

    try:
        kwargs = {"connect_args": {"timeout": 120}} if url.startswith("sqlite") else {}
        return optuna.storages.RDBStorage(url, engine_kwargs=kwargs)
    except Exception as err:  # noqa: BLE001 - a driver missing, a host down, a bad URL: all one answer
        shown = url.split("@")[-1] if "@" in url else url  # never echo a password
        reason = " ".join(str(err).split())[:200]
        raise InputError(f"--storage {shown}: cannot open the study storage ({type(err).__name__}: {reason}); give "
                         "a URL Optuna can open (sqlite:///PATH, or postgresql://USER@HOST/DB with its driver "
                         "installed).") from None


def open_study(storage, name: str, *, sampler, pruner, meta: Mapping[str, Any]):
    """Create the study, or load it when it exists and was made by the same command (``meta`` matches)."""
    import optuna

    study = optuna.create_study(storage=storage, study_name=name, sampler=sampler, pruner=pruner,
                                direction="maximize", load_if_exists=True)
    have = study.user_attrs
    if have:
        for key in META_KEYS:
            if key in meta and key in have and have[key] != meta[key]:
                raise InputError(f"--storage / --out: the existing study {name!r} has {key} {have[key]!r}, this "
                                 f"command {meta[key]!r}; a study resumes only the same search. Use another "
                                 "--study-name or --out, or --force to start over.")
    else:
        for key, value in meta.items():
            study.set_user_attr(key, value)
    return study


class Objective:
    """One trial: draw, train on validation data, report every evaluation, return the selected score."""

    def __init__(self, data: TuningData, base_cfg, params: Sequence, *, group: str, metric: str,
                 on_trial: Callable[[int, int], None] | None = None) -> None:
        self.data, self.base_cfg, self.params = data, base_cfg, tuple(params)
        self.group, self.metric = group, metric
        self.on_trial = on_trial

    def config(self, values: Mapping[str, Any]):
        from pfl_cli.fl.api import validate_train_config

        cfg = dataclasses.replace(self.base_cfg, **values)
        validate_train_config(cfg)
        return cfg

    def __call__(self, trial) -> float:
        import optuna

        from pfl_cli.fl.api import train_federated
        from pfl_cli.fl.loop import TrainingDiverged
        from pfl_cli.tune.space import suggest

        import socket

        trial.storage.set_trial_system_attr(trial._trial_id, "pflx_pid", os.getpid())
        trial.storage.set_trial_system_attr(trial._trial_id, "pflx_host", socket.gethostname())
        values = suggest(trial, self.params)
        done = _same_config(trial)
        if done is not None:  # a finite space's sampler drew a config again: its result, without training again
            trial.set_user_attr("duplicate_of", done.number)
            for step, value in sorted(done.intermediate_values.items()):
                trial.report(value, step)
            if done.state == optuna.trial.TrialState.PRUNED:
                raise optuna.TrialPruned(f"the same config as trial {done.number}, which was pruned")
            if "selected_round" in done.user_attrs:
                trial.set_user_attr("selected_round", done.user_attrs["selected_round"])
            return float(done.value)
        try:
            cfg = self.config(values)
        except PflxError as err:
            trial.set_user_attr("error", f"invalid config: {err}")
            raise TrialFailed(str(err)) from None
        total = cfg.rounds if cfg.algorithm_class.federated else 0

        def on_progress(done: int, _total: int, status: dict) -> None:
            if (done % cfg.eval_every == 0 or done == total) and self.group in status:
                value = float(status[self.group])
                if math.isfinite(value):
                    trial.report(value, done)
                if trial.should_prune():
                    raise optuna.TrialPruned(f"pruned at round {done} (validation accuracy {value:.4f})")

        d = self.data
        try:
            run = train_federated(d.x, d.y, d.num_classes, d.partition, cfg, labeled=d.labeled,
                                  vocab_size=d.vocab_size, on_progress=on_progress)
        except TrainingDiverged as err:
            trial.set_user_attr("error", f"diverged at round {err.round}")
            raise TrialFailed(f"diverged at round {err.round}") from None
        summary = run.outcome.best.summaries().get(self.group)
        value = float("nan") if summary is None else float(summary[self.metric])
        if not math.isfinite(value):
            trial.set_user_attr("error", f"no finite {self.metric} on the {self.group} group")
            raise TrialFailed("no finite score")
        trial.set_user_attr("selected_round", int(run.outcome.best.round))
        if not total:  # no rounds, no curve: the one evaluation is the curve
            trial.report(value, 0)
        return value


def _same_config(trial):
    """An earlier finished (complete or pruned) trial with exactly ``trial``'s values, or None.

    Every trial trains with the same seed, so the same config gives the same curve: TPE and random search
    over ``choice``/``int`` keys draw configs again, and those cost nothing (Optuna's FAQ recipe).
    """
    import optuna

    finished = (optuna.trial.TrialState.COMPLETE, optuna.trial.TrialState.PRUNED)
    for t in trial.study.get_trials(deepcopy=False, states=finished):
        if t.params == trial.params:
            return t
    return None


def optimize(study, objective: Objective, trials: int, *, callbacks: Sequence[Callable] = ()) -> None:
    """Run trials until the study holds ``trials`` trials in all (finished, pruned, failed or running).

    A trial left RUNNING by a killed process is marked failed first, so that the count is of real trials
    and a resumed study runs the missing ones.
    """
    import optuna

    for t in study.trials:
        if t.state == optuna.trial.TrialState.RUNNING and _orphaned(t):
            study._storage.set_trial_user_attr(t._trial_id, "error", "interrupted (the process running it stopped)")
            study._storage.set_trial_state_values(t._trial_id, optuna.trial.TrialState.FAIL)
    cap = optuna.study.MaxTrialsCallback(trials, states=None)
    remaining = trials - len(study.trials)
    if remaining > 0:
        study.optimize(objective, n_trials=remaining, catch=(TrialFailed,), callbacks=[cap, *callbacks],
                       gc_after_trial=False, show_progress_bar=False)


def _orphaned(trial) -> bool:
    """A RUNNING trial whose process is gone: it carries the pid and host that started it."""
    import socket

    pid, host = trial.system_attrs.get("pflx_pid"), trial.system_attrs.get("pflx_host")
    if pid is None or host != socket.gethostname():
        return pid is not None and host is None
    try:
        os.kill(int(pid), 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        return False
    return False


def trial_rows(study, params: Sequence) -> tuple[list[str], list[list]]:
    """trials.csv: number, state, value, each searched key, selected round, seconds, error, the validation curve."""
    keys = [p.key for p in params]
    header = ["number", "state", "value", *keys, "selected_round", "seconds", "error", "curve"]
    rows = []
    for t in study.trials:
        seconds = (t.datetime_complete - t.datetime_start).total_seconds() if t.datetime_complete and \
            t.datetime_start else None
        curve = ";".join(f"{step}:{v:.6g}" for step, v in sorted(t.intermediate_values.items()))
        rows.append([t.number, t.state.name.lower(), t.value,
                     *(p.label(t.params[p.key]) if p.key in t.params else None for p in params),
                     t.user_attrs.get("selected_round"), None if seconds is None else round(seconds, 3),
                     t.user_attrs.get("error", ""), curve])
    return header, rows


def best_trial(study):
    """The completed trial of the highest value; InputError-free None when no trial completed."""
    import optuna

    done = [t for t in study.trials if t.state == optuna.trial.TrialState.COMPLETE and t.value is not None]
    return max(done, key=lambda t: (t.value, -t.number)) if done else None


def best_values(trial, params: Sequence) -> dict[str, Any]:
    """The typed config values of ``trial`` (choices mapped back from the ranks or labels the study stores)."""
    out = {}
    for p in params:
        v = trial.params[p.key]
        out[p.key] = p.decode(v)
    return out


def state_counts(study) -> dict[str, int]:
    counts: dict[str, int] = {}
    for t in study.trials:
        counts[t.state.name.lower()] = counts.get(t.state.name.lower(), 0) + 1
    return counts
