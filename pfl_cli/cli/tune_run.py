"""The body of `pflx tune`: the tuning partition, the study (in-process, in worker processes, or private
under --dp), the artifact, the summary.

The ``tune`` artifact (DESIGN.md section 3):

- ``best.yaml``: the resolved train config of the best trial, which ``pflx train --config`` takes as is;
- ``trials.csv``: every trial's number, state (complete / pruned / fail, or interrupted: not counted), score,
  searched values, selected round, seconds, failure reason and validation curve (``round:accuracy;...``);
- ``study.db``: the Optuna study (SQLite), for ``optuna-dashboard`` or further analysis;
- ``metrics.json``: the objective (group, metric), the best trial, trial counts, the space, CPU time;
- with ``--plot``: ``history.png`` and ``parallel.png``.

Under ``--dp`` only the released best config, its noisy score and ``privacy.json`` are written
(``pfl_cli.tune.private``); the trials' scores go to ``nonprivate-trials.csv`` on request only.

While the study runs it lives in ``.<out>.study/study.db`` beside ``--out`` (unless ``--storage``);
the same command continues it after a kill; it moves into the artifact when the study completes.
"""

from __future__ import annotations

import dataclasses
import os
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from pfl_cli.cli.output import Reporter
from pfl_cli.errors import ConfigError, InputError, RunError


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
    log_dir: Path | None = None
    log_group: str | None = None     # the trackers' group / experiment (default: the study's name)


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


def _check_options(cfg, o: TuneOptions):
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

        check_stackable(cfg)
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


def run_tune(cfg, o: TuneOptions, *, partition: Path, out: Path, force: bool, report: Reporter,
             plot: bool = False, study=(None, None)) -> None:
    """``study``: ``(ledger, note)`` of the private study whose best.yaml is ``--config``
    (:func:`pfl_cli.cli.privacy_account.study_prior`): under --dp its ledger composes into privacy.json."""
    from pfl_cli.artifacts import ArtifactWriter
    from pfl_cli.cli.common import load_partition_dataset
    from pfl_cli.config import config_to_dict
    from pfl_cli.fl.api import validate_train_config
    from pfl_cli.tune.space import describe
    from pfl_cli.tune.study import open_storage

    validate_train_config(cfg)
    entry, params, sampler, pruner, objective = _check_options(cfg, o)
    ArtifactWriter(out, stage="tune", config={}, seed=cfg.seed, force=force)  # --out problems first
    storage = open_storage(o.storage) if o.storage is not None else None  # an unreachable URL: before any work
    part, info, part_art, ds = load_partition_dataset(partition)
    private = cfg.dp_epsilon is not None
    notice = getattr(getattr(cfg, "algorithm_class", None), "partition_notice", None)  # FLowDUP's size notice
    if not private and notice is not None and (line := notice(part)):  # under --dp the clients' number is private
        report.warn(line)
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
    unlabeled_validation = bool(new_group and part.labeled is not None and _holdout_unlabeled(part))
    trial_cfg = dataclasses.replace(cfg, evaluate_hidden_labels=True) if unlabeled_validation else cfg
    plan = Plan(cfg=cfg, trial_cfg=trial_cfg, params=params, objective=objective, sampler=sampler, pruner=pruner,
                validation_clients=val_clients, unlabeled_validation=unlabeled_validation)
    config = {"train": config_to_dict(cfg), "space": describe(params), "trials": o.trials, "sampler": sampler,
              "pruner": pruner, "validation_fraction": o.validation_fraction, "validation_clients": val_clients,
              "objective": objective}
    if private:
        config.update({"dp_shape": o.dp_shape, "dp_score_noise": o.dp_score_noise})
    if o.storage is not None:
        config["study_name"] = o.study_name or f"pflx-tune-{cfg.algorithm}"
    inputs = [part_art.input_ref(), ds.input_ref()]
    writer = ArtifactWriter(out, stage="tune", config=config, seed=cfg.seed, inputs=inputs, force=force, dp=private)
    if writer.up_to_date():
        report.note(f"{out} is up to date (same config and inputs); nothing to do.")
        report.result({"out": str(out), "up_to_date": True})
        return
    data = _tuning_data(ds, part, cfg.seed, o.validation_fraction, val_clients, unlabeled_validation,
                        noise=cfg.dp_noise if private else None)
    if private:
        from pfl_cli.cli.tune_private import run_private_study

        run_private_study(plan, o, data, writer=writer, out=out, report=report, prior=study[0])
        if study[1]:
            report.note(study[1])
        return
    from pfl_cli.tune.study import study_identity

    meta = study_identity(trial_cfg, params, objective, partition=part_art.content_hash,
                          validation={"fraction": o.validation_fraction, "clients": val_clients,
                                      "unlabeled": unlabeled_validation})
    staging = _staging_dir(out)
    if storage is None:
        if force and staging.exists():
            shutil.rmtree(staging)
            report.note(f"--force: deleted the unfinished study in {staging} and started a fresh one.")
        staging.mkdir(parents=True, exist_ok=True)
        url = f"sqlite:///{(staging / 'study.db').resolve()}"
    else:
        url = o.storage
    name = o.study_name or f"pflx-tune-{cfg.algorithm}"
    from pfl_cli.cli import interrupt

    where = f"{staging}/study.db" if storage is None else f"the study {name!r} of --storage"
    interrupt.kept(f"interrupted; nothing was written to --out, and the finished trials are kept in {where}: run "
                   "the same command again to continue the study.")
    started = time.time()
    study = _run_study(plan, o, data, url=url, name=name, meta=meta, partition=partition, report=report,
                       force=force)
    _write_artifact(writer, study, plan, o, out=out, staging=None if storage is not None else staging,
                    started=started, plot=plot, storage=o.storage)
    _print_summary(report, out, study, plan, partition)
    from pfl_cli.tune.study import still_rising

    if (last := still_rising(study)) is not None:
        report.warn(f"every trial's validation curve still rises at its last round ({last}): the --rounds budget, "
                    f"not the searched settings, may be what limits the best score; try --rounds {2 * plan.cfg.rounds}.")


def _holdout_unlabeled(part) -> bool:
    holdout = np.flatnonzero(np.asarray(part.role) == 1)
    return len(holdout) > 0 and not np.asarray(part.labeled)[holdout].any()


def _staging_dir(out: Path) -> Path:
    out = Path(out)
    return out.parent / f".{out.name}.study"


def _tuning_data(ds, part, seed: int, fraction: float, val_clients: float, unlabeled: bool, noise: str | None = None):
    """``noise``: ``--dp``'s noise mode (the carve's salt from OS entropy unless seeded, the carve neighbour-stable)."""
    from pfl_cli.privacy.randomness import noise_source
    from pfl_cli.tune.split import validation_partition
    from pfl_cli.tune.study import TuningData

    rng = noise_source("seeded" if noise is None else noise, seed).numpy("tune-validation")
    vpart = validation_partition(part, val_fraction=fraction, val_clients=val_clients, rng=rng,
                                 unlabeled_validation_clients=unlabeled, x=ds.x, y=ds.y, stable=noise is not None)
    return TuningData(ds.x, ds.y, ds.num_classes, vpart, labeled=ds.labeled, vocab_size=ds.extra.get("vocab_size"))


def _run_study(plan: Plan, o: TuneOptions, data, *, url: str, name: str, meta: dict, partition: Path,
               report: Reporter, force: bool = False):
    from pfl_cli.tune.study import (Objective, Proposals, best_trial, counted, identity_digest, make_pruner,
                                    make_sampler, open_storage, open_study, optimize, rounds_done)

    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)  # the progress line says what its INFO lines say
    storage = open_storage(url)
    if o.storage is None:  # the staging study beside --out: one unfinished study, whatever its (algorithm's) name
        from pfl_cli.tune.study import identity_differences, refusal

        for other in optuna.get_all_study_names(storage):
            if other != name:
                attrs = optuna.load_study(study_name=other, storage=storage).user_attrs
                raise refusal(other, identity_differences(attrs, meta) or ["algorithm (--algorithm)"])
    study = open_study(storage, name, sampler=make_sampler(plan.sampler, plan.params, seed=plan.cfg.seed),
                       pruner=make_pruner(plan.pruner, rounds=plan.cfg.rounds), meta=meta, force=force,
                       on_replaced=report.note)
    identity = identity_digest(meta)
    from pfl_cli.cli.loggers import StudyLoggers

    tracked = StudyLoggers(o.logs, o.log_dir, study, group=o.log_group)
    before = counted(study)
    if before:
        report.note(f"continuing the study {name!r}: {before} of {o.trials} trials already there.")
    # Progress in rounds (every trial trains --rounds): a line at least every 10 s in a log and a time left from
    # the first round on, where a count of trials stays at "left -:--:--" until a whole trial is done (issue 41).
    rounds = plan.cfg.rounds if plan.cfg.algorithm_class.federated else 0
    per = max(rounds, 1)
    with report.progress("tune", o.trials * per, unit="round" if rounds else "trial") as bar:
        seen = [min(before, o.trials) * per]
        finished = [min(before, o.trials)]
        best = [""]
        if seen[0]:
            bar.advance(seen[0], status="resumed")

        def status() -> str:
            trial = f"trial {min(finished[0] + 1, o.trials)}/{o.trials}" if rounds else ""
            return ", ".join(p for p in (trial, best[0]) if p)

        def move_to(units: int) -> None:
            units = min(units, o.trials * per)
            if units > seen[0]:
                bar.advance(units - seen[0], status=status())
                seen[0] = units

        def on_done(study_, trial) -> None:
            tracked.trial(trial)  # None from the --jobs poll: the workers' trials are logged at the end
            top = best_trial(study_)
            best[0] = "" if top is None else f"best {100 * top.value:.1f}% (trial {top.number})"
            units = rounds_done(study_, per, o.trials)  # also the running trials' rounds (--jobs' workers)
            finished[0] = units // per
            move_to(units)

        if o.jobs == 1:
            objective = Objective(data, plan.trial_cfg, plan.params, group=plan.objective["group"],
                                  metric=plan.objective["metric"], identity=identity,
                                  on_round=lambda done: move_to(finished[0] * per + done))
            optimize(study, objective, o.trials, proposals=Proposals(plan.sampler, plan.params, plan.cfg.seed),
                     callbacks=[on_done], stack=o.stack)
        else:
            _run_workers(plan, o, url=url, name=name, identity=identity, partition=partition,
                         poll=lambda: on_done(storage_study(storage, name), None))
    tracked.finish(storage_study(storage, name))
    return storage_study(storage, name)


def storage_study(storage, name: str):
    import optuna

    return optuna.load_study(study_name=name, storage=storage)


# ---------------------------------------------------------------------------- worker processes
def _run_workers(plan: Plan, o: TuneOptions, *, url: str, name: str, identity: str, partition: Path, poll) -> None:
    """``o.jobs`` processes run trials of the one study (its storage coordinates them), one torch thread each."""
    import multiprocessing
    import signal

    ctx = multiprocessing.get_context("spawn")  # a fresh interpreter: no forked torch thread pools
    procs = [ctx.Process(target=_worker, args=(plan, o, url, name, identity, str(partition), rank), daemon=True)
             for rank in range(o.jobs)]
    # a worker ignores Ctrl-C until its own handler is in place (the first line of _worker): a fresh interpreter
    # still importing (spawn's bootstrap) would print a traceback; the parent, which has the one line to say,
    # ends a worker that did not stop by itself
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        for p in procs:
            p.start()
    finally:
        signal.signal(signal.SIGINT, previous)
    try:
        while any(p.is_alive() for p in procs):
            time.sleep(0.5)
            poll()
    finally:
        for p in procs:
            if p.is_alive():
                p.terminate()
            p.join()
    poll()
    failed = [p.exitcode for p in procs if p.exitcode not in (0, None)]
    if failed:
        raise RunError(f"--jobs: {len(failed)} of {o.jobs} worker processes failed (exit codes {failed}); the study "
                       "so far is kept: run the same command again to continue it (PFLX_DEBUG=1 shows the "
                       "workers' tracebacks).")


def _worker(plan: Plan, o: TuneOptions, url: str, name: str, identity: str, partition: str, rank: int) -> None:
    import signal
    import sys

    try:
        signal.signal(signal.SIGINT, signal.default_int_handler)  # started with Ctrl-C ignored (_run_workers)
        import torch

        from pfl_cli.cli.common import load_partition_dataset
        from pfl_cli.tune.study import (Objective, Proposals, make_pruner, make_sampler, open_storage, open_study,
                                        optimize)

        torch.set_num_threads(1)
        import optuna

        optuna.logging.set_verbosity(optuna.logging.WARNING)  # (its own level is reset when optuna configures it)
        part, _info, _art, ds = load_partition_dataset(Path(partition))
        data = _tuning_data(ds, part, plan.cfg.seed, o.validation_fraction, plan.validation_clients,
                            plan.unlabeled_validation)
        seed = plan.cfg.seed * 1000 + rank + 1  # each worker its own draws
        study = open_study(open_storage(url), name, sampler=make_sampler(plan.sampler, plan.params, seed=seed),
                           pruner=make_pruner(plan.pruner, rounds=plan.cfg.rounds), meta={})
        objective = Objective(data, plan.trial_cfg, plan.params, group=plan.objective["group"],
                              metric=plan.objective["metric"], identity=identity)
        optimize(study, objective, o.trials, proposals=Proposals(plan.sampler, plan.params, seed))
    except KeyboardInterrupt:  # Ctrl-C reaches every process of the group: the parent says the one line
        raise SystemExit(130) from None
    except Exception as err:  # noqa: BLE001 - one line per worker, the parent says what to do
        if os.environ.get("PFLX_DEBUG", "") not in ("", "0"):
            raise
        sys.stderr.write(f"pflx: tune worker {rank}: {type(err).__name__}: {err}\n")
        raise SystemExit(1)


# ---------------------------------------------------------------------------- the artifact
def _write_artifact(writer, study, plan: Plan, o: TuneOptions, *, out: Path, staging: Path | None, started: float,
                    plot: bool, storage: str | None) -> None:
    import yaml

    from pfl_cli.cli import interrupt
    from pfl_cli.config import config_to_dict
    from pfl_cli.tune.space import describe
    from pfl_cli.tune.study import best_trial, best_values, state_counts, trial_rows

    best = best_trial(study)
    header, rows = trial_rows(study, plan.params)
    if best is None:
        reasons = sorted({r[header.index("error")] for r in rows if r[header.index("error")]})
        raise RunError(f"no trial of the study completed ({state_counts(study)}); nothing was written to --out {out}"
                       + (f"; failures: {'; '.join(reasons)[:300]}" if reasons else "")
                       + ". Widen or move the search space (--space), or raise --rounds.")
    values = best_values(best, plan.params)
    best_cfg = dataclasses.replace(plan.cfg, **values)
    seconds = [r[header.index("seconds")] for r in rows if r[header.index("seconds")] is not None]
    metrics = {
        "algorithm": plan.cfg.algorithm,
        "objective": plan.objective,
        "best": {"trial": best.number, "value": best.value, "params": values,
                 "selected_round": best.user_attrs.get("selected_round")},
        "trials": state_counts(study),
        "space": describe(plan.params),
        "sampler": plan.sampler,
        "pruner": plan.pruner,
        "trial_seconds": round(float(sum(seconds)), 3),
        "wall_seconds": round(time.time() - started, 3),
        "validation": {"fraction": o.validation_fraction, "clients": plan.validation_clients,
                       "validation_clients_unlabeled": plan.unlabeled_validation},
        "storage": "study.db" if storage is None else _redacted(storage),
    }
    with writer:
        # from the swap on, --out holds the whole artifact: a Ctrl-C in the cleanup or the summary says so
        writer.after_swap(lambda: interrupt.kept(f"interrupted after {out} was written; it is complete (the same "
                                                 "command again finds it up to date)."))
        writer.save_text("best.yaml", _best_yaml(config_to_dict(best_cfg), plan, best))
        writer.save_csv("trials.csv", header, rows)
        writer.save_json("metrics.json", metrics)
        if staging is not None:
            _copy_sqlite(staging / "study.db", writer.path("study.db"))
            writer.after_swap(lambda: shutil.rmtree(staging, ignore_errors=True))
        if plot:
            from pfl_cli.cli.tune_figures import tune_figures

            tune_figures(header, rows, plan.params, writer.path("history.png"), writer.path("parallel.png"),
                         title=f"pflx tune {plan.cfg.algorithm}: {plan.objective['metric']} on "
                               f"{plan.objective['scored_on']}")


def _best_yaml(config: dict, plan: Plan, best) -> str:
    import yaml

    head = (f"# pflx tune: the best of the study's trials (trial {best.number}, validation "
            f"{plan.objective['metric']} {best.value:.4f} on {plan.objective['scored_on']}).\n"
            "# Train with it: pflx train --partition PART --config best.yaml --out RUN (add --seed S for more seeds).\n")
    return head + yaml.safe_dump(config, sort_keys=False)


def _redacted(url: str) -> str:
    if "@" not in url or "://" not in url:
        return url
    scheme, rest = url.split("://", 1)
    return f"{scheme}://{rest.split('@', 1)[1]}"


def _copy_sqlite(src: Path, dst: Path) -> None:
    """A consistent copy of a live SQLite database (its backup API, not a byte copy of a file in use)."""
    import sqlite3

    with sqlite3.connect(str(src)) as a, sqlite3.connect(str(dst)) as b:
        a.backup(b)
    b.close()
    a.close()


def _print_summary(report: Reporter, out: Path, study, plan: Plan, partition: Path) -> None:
    from rich.table import Table

    from pfl_cli.tune.study import best_trial, best_values, state_counts

    best = best_trial(study)
    values = best_values(best, plan.params)
    counts = state_counts(study)
    table = Table(title=f"tune -> {out}: {plan.cfg.algorithm}, best of {sum(counts.values())} trials "
                  f"({', '.join(f'{v} {k}' for k, v in counts.items())})", title_justify="left",
                  caption=f"validation {plan.objective['metric']} on {plan.objective['scored_on']}; next: pflx train "
                  f"--partition {partition} --config {out}/best.yaml --out RUN", caption_justify="left")
    table.add_column("trial", justify="right")
    table.add_column("validation", justify="right")
    for p in plan.params:
        table.add_column(p.key, justify="right")
    table.add_row(str(best.number), f"{100 * best.value:.2f}%", *(_show(values[p.key]) for p in plan.params))
    report.result({"out": str(out), "up_to_date": False, "algorithm": plan.cfg.algorithm,
                   "objective": plan.objective, "best": {"trial": best.number, "value": best.value, "params": values},
                   "trials": counts}, table)


def _show(v: Any) -> str:
    return f"{v:.4g}" if isinstance(v, float) else str(v)
