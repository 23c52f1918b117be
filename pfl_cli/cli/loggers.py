"""Experiment loggers of `pflx train --log tensorboard|csv|jsonl|wandb|mlflow`: per-round metrics where those
tools read them.

They write while training runs (a dashboard follows the run), into ``--log-dir`` (default: ``OUT.logs``
beside ``--out``), never into the artifact, which is written atomically at the end:

- ``tensorboard``: event files under ``LOG_DIR/tensorboard`` (``tensorboard --logdir LOG_DIR``), through
  the ``tensorboard`` package (optional extra ``pflx[tensorboard]``);
- ``csv``: ``LOG_DIR/metrics.csv`` with columns round, metric, value (pandas, spreadsheets);
- ``jsonl``: ``LOG_DIR/metrics.jsonl``, one JSON object per round (round, elapsed_s, the metrics);
- ``wandb``: a Weights & Biases run under ``LOG_DIR/wandb/offline-run-*`` through the ``wandb`` package
  (``pflx[wandb]``), offline unless ``WANDB_MODE`` says otherwise: no account, no network, no login prompt;
  ``wandb sync LOG_DIR/wandb/offline-run-*`` uploads it later. Project ``WANDB_PROJECT`` (default ``pflx``);
- ``mlflow``: an MLflow run in the tracking store ``MLFLOW_TRACKING_URI`` when set, else the SQLite store
  ``LOG_DIR/mlflow.db`` (``mlflow ui --backend-store-uri sqlite:///LOG_DIR/mlflow.db``), through
  ``mlflow-skinny`` (``pflx[mlflow]``); experiment ``MLFLOW_EXPERIMENT_NAME`` (default ``pflx``).

The two trackers also get the run's name and parameters (train: its config; a tune trial: the searched keys,
its study the W&B group / the MLflow experiment).

Metric names are ``GROUP/METRIC``: ``train/cohort_loss`` every round (the mean training loss of the
round's cohort), ``train|holdout|val/accuracy`` at every evaluation (the headline: label-masked when
``label_mask``). Under ``--dp`` nothing computed from private data is logged -- the DP artifact
releases no per-round value -- so a DP run logs ``time/elapsed_s`` per round and nothing else (no
parameters either: a private study's proposals are steered by its private scores).
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Sequence

from pfl_cli.errors import ConfigError, InputError

KINDS = ("tensorboard", "csv", "jsonl", "wandb", "mlflow")
# The logger -> (the module it imports, the extra that installs it).
_PACKAGES = {"tensorboard": ("tensorboard", "tensorboard"), "wandb": ("wandb", "wandb"), "mlflow": ("mlflow", "mlflow")}


def check_loggers(kinds: Sequence[str]) -> tuple[str, ...]:
    """The requested loggers, each once; refused before any work when unknown or not installed (exit 2)."""
    chosen = tuple(dict.fromkeys(kinds))
    for kind in chosen:
        if kind not in KINDS:
            raise ConfigError(f"--log must be one of {', '.join(KINDS)} (repeat it for several); got {kind!r}.")
    missing = [kind for kind in chosen if kind in _PACKAGES and _find(_PACKAGES[kind][0]) is None]
    if missing:
        what = ", ".join(f"--log {kind}" for kind in missing)
        packages = " and ".join(f"the {_PACKAGES[kind][0]} package" for kind in missing)
        extras = ",".join(_PACKAGES[kind][1] for kind in missing)
        raise InputError(f"{what} writes through {packages}, which is not installed; "
                         f"install the extra: pip install 'pflx[{extras}]'.")
    return chosen


def _find(module: str):
    import importlib.util

    try:
        return importlib.util.find_spec(module)
    except (ImportError, ValueError):  # a module set to None in sys.modules (hidden), or a broken install
        return None


def default_log_dir(out: Path) -> Path:
    return out.parent / f"{out.name}.logs"


class RunLoggers:
    """The loggers of one train run; ``log(round, values)`` after every round, ``close()`` at the end."""

    def __init__(self, kinds: Sequence[str], log_dir: Path, *, private: bool, resume: bool = False,
                 name: str | None = None, group: str | None = None, params: dict | None = None) -> None:
        self.kinds, self.log_dir, self.private = tuple(kinds), Path(log_dir), private
        self.start = time.monotonic()
        self._csv = self._jsonl = self._tb = self._wandb = self._mlflow = None
        if not self.kinds:
            return
        self.log_dir.mkdir(parents=True, exist_ok=True)
        mode = "a" if resume else "w"  # a resumed run continues its logs; a fresh one starts them over
        if "csv" in self.kinds:
            path = self.log_dir / "metrics.csv"
            fresh = mode == "w" or not path.is_file()
            self._csv = open(path, mode, newline="")
            if fresh:
                self._csv.write("round,metric,value\n")
        if "jsonl" in self.kinds:
            self._jsonl = open(self.log_dir / "metrics.jsonl", mode)
        if "tensorboard" in self.kinds:
            from torch.utils.tensorboard import SummaryWriter  # needs the tensorboard package

            self._tb = SummaryWriter(log_dir=str(self.log_dir / "tensorboard"))
        params = {} if private or not params else _flat(params)  # under --dp: nothing but the elapsed time
        if "wandb" in self.kinds:
            self._wandb = _WandbRun(self.log_dir, name, group, params)
        if "mlflow" in self.kinds:
            self._mlflow = _MlflowRun(self.log_dir, name, group, params)

    def log(self, round_: int, values: dict[str, float]) -> None:
        if not self.kinds:
            return
        elapsed = time.monotonic() - self.start
        # Under --dp only what the ledger released may leave the run: no per-round value is released.
        values = {"time/elapsed_s": elapsed} if self.private else {**values, "time/elapsed_s": elapsed}
        if self._csv is not None:
            self._csv.writelines(f"{round_},{name},{value!r}\n" for name, value in values.items())
            self._csv.flush()
        if self._jsonl is not None:
            self._jsonl.write(json.dumps({"round": round_, **values}, allow_nan=True) + "\n")
            self._jsonl.flush()
        if self._tb is not None:
            for name, value in values.items():
                self._tb.add_scalar(name, value, round_)
            self._tb.flush()
        for tracker in (self._wandb, self._mlflow):
            if tracker is not None:
                tracker.log(round_, values)

    def close(self) -> None:
        for handle in (self._csv, self._jsonl, self._tb, self._wandb, self._mlflow):
            if handle is not None:
                handle.close()
        self._csv = self._jsonl = self._tb = self._wandb = self._mlflow = None


def _flat(params: dict, prefix: str = "") -> dict[str, object]:
    """Nested config sections as ``section.key`` (MLflow parameters are flat)."""
    flat: dict[str, object] = {}
    for key, value in params.items():
        if isinstance(value, dict):
            flat.update(_flat(value, f"{prefix}{key}."))
        else:
            flat[f"{prefix}{key}"] = value
    return flat


class _WandbRun:
    """One W&B run, offline by default: its files under LOG_DIR/wandb, for a later `wandb sync`."""

    def __init__(self, log_dir: Path, name: str | None, group: str | None, params: dict, *,
                 state: str | None = None) -> None:
        os.environ.setdefault("WANDB_SILENT", "true")  # its banner would interleave with pflx's progress lines
        import wandb

        settings = wandb.Settings(silent=True, console="off", x_disable_stats=True)  # no system-metrics sampler
        self.run = wandb.init(dir=str(log_dir), project=os.environ.get("WANDB_PROJECT") or "pflx", name=name,
                              group=group, config=params, mode=os.environ.get("WANDB_MODE") or "offline",
                              settings=settings, reinit="create_new", tags=[state] if state else None)

    def log(self, round_: int, values: dict[str, float]) -> None:
        self.run.log(dict(values), step=round_)

    def close(self) -> None:
        self.run.finish()


class _MlflowRun:
    """One MLflow run in MLFLOW_TRACKING_URI, else the SQLite store LOG_DIR/mlflow.db (MLflow's file store is
    in maintenance mode); the experiment is the study (tune) or MLFLOW_EXPERIMENT_NAME / ``pflx``."""

    def __init__(self, log_dir: Path, name: str | None, group: str | None, params: dict, *,
                 state: str | None = None) -> None:
        import logging

        from mlflow import MlflowClient
        from mlflow.entities import Param

        logging.getLogger("mlflow").setLevel(logging.WARNING)  # its schema-creation INFO lines (set on its import)

        uri = os.environ.get("MLFLOW_TRACKING_URI") or f"sqlite:///{(log_dir / 'mlflow.db').resolve()}"
        self.client = client = MlflowClient(tracking_uri=uri)
        experiment = group or os.environ.get("MLFLOW_EXPERIMENT_NAME") or "pflx"
        found = client.get_experiment_by_name(experiment)
        if found is not None:
            experiment_id = found.experiment_id
        else:
            artifacts = None if os.environ.get("MLFLOW_TRACKING_URI") else (log_dir / "mlartifacts").resolve().as_uri()
            experiment_id = client.create_experiment(experiment, artifact_location=artifacts)
        tags = {"pflx.state": state} if state else None
        self.run_id = client.create_run(experiment_id, run_name=name, tags=tags).info.run_id
        items = [Param(key, str(value)) for key, value in params.items()]
        for i in range(0, len(items), 100):  # MLflow takes at most 100 parameters per batch
            client.log_batch(self.run_id, params=items[i:i + 100])

    def log(self, round_: int, values: dict[str, float]) -> None:
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        self.client.log_batch(self.run_id, metrics=[Metric(k, float(v), now, round_) for k, v in values.items()])

    def close(self) -> None:
        self.client.set_terminated(self.run_id)


def round_values(status: dict, evaluated: bool) -> dict[str, float]:
    """The metrics of a round from the round loop's progress status (loss; latest headline accuracies)."""
    values = {"train/cohort_loss": float(status["loss"])} if "loss" in status else {}
    if evaluated:
        values.update({f"{group}/accuracy": float(status[group]) for group in ("train", "holdout", "val")
                       if group in status})
    return values


TRACKERS = ("wandb", "mlflow")


def check_study_loggers(kinds: Sequence[str], *, private: bool, command: str = "tune") -> tuple[str, ...]:
    """`tune --log`, `compare --spec --log`: the trackers only (each trial a run); refused under --dp (a private study releases its best
    config alone, no trial's curve)."""
    chosen = tuple(dict.fromkeys(kinds))
    for kind in chosen:
        if kind not in TRACKERS:
            raise ConfigError(f"--log for {command} must be one of {', '.join(TRACKERS)} (each trial a run; repeat it for "
                              f"both); got {kind!r}. `pflx train --log {kind}` logs one training.")
    if chosen and private:
        raise ConfigError("--log with --dp: a private study releases its best config only, never a trial's "
                          "validation curve or its drawn values; drop --log (train --dp --log logs the elapsed time).")
    return check_loggers(chosen)


class StudyLoggers:
    """`tune --log wandb|mlflow`: each trial this command finishes becomes a run named ``trial-N`` in the study's
    W&B group / MLflow experiment (the study's name), with the searched keys as its parameters, its validation
    curve as ``validation/accuracy`` per evaluated round (the objective's metric on its validation group), its score as ``objective`` and its state (complete, pruned, fail) as a
    W&B tag / the MLflow tag ``pflx.state``. A trial is logged once it ends (the trackers' runs are written from
    the study, so --jobs workers and --stack are logged alike); trials of an earlier, resumed command are not
    logged again."""

    def __init__(self, kinds: Sequence[str], log_dir: Path | None, study, *, group: str | None = None) -> None:
        # In a protocol (compare --spec, ``group``: its experiment) a trial's run is STUDY-trial-N. No tracker, no
        # directory: ``log_dir`` None logs nothing; a tracker needs one (the caller's default, e.g. OUT.logs).
        if kinds and log_dir is None:
            raise ValueError(f"StudyLoggers({', '.join(kinds)}): a tracker needs a log directory; got None.")
        self.kinds, self.name, self.group = tuple(kinds), study.study_name, group
        self.log_dir = None if log_dir is None else Path(log_dir)
        self.prefix = f"{study.study_name}-" if group else ""
        self.done = {t.number for t in study.get_trials(deepcopy=False) if t.state.is_finished()}

    def trial(self, trial) -> None:
        if not self.kinds or trial is None or trial.number in self.done or not trial.state.is_finished():
            return
        self.done.add(trial.number)
        self.log_dir.mkdir(parents=True, exist_ok=True)
        state = trial.state.name.lower()
        curve = sorted(trial.intermediate_values.items())
        final = {} if trial.value is None else {"objective": float(trial.value)}
        last = int(trial.user_attrs.get("selected_round", curve[-1][0] if curve else 0))
        for kind in self.kinds:
            tracker = (_WandbRun if kind == "wandb" else _MlflowRun)(
                self.log_dir, f"{self.prefix}trial-{trial.number}", self.group or self.name, dict(trial.params),
                state=state)
            for step, value in curve:
                tracker.log(int(step), {"validation/accuracy": float(value)})
            if final:
                tracker.log(last, final)
            tracker.close()

    def finish(self, study) -> None:
        """The trials that ended in other processes (--jobs workers, other machines on --storage)."""
        for trial in study.get_trials(deepcopy=False):
            self.trial(trial)
