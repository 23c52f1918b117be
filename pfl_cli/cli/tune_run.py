"""The body of `pflx tune`: the partition loaded, the study run by the core (:mod:`pfl_cli.tune.run`, in-process,
in worker processes, or private under --dp: :mod:`pfl_cli.tune.private_study`), the artifact written, the summary
printed.

The ``tune`` artifact (DESIGN.md section 3):

- ``best.yaml``: the resolved train config of the best trial, which ``pflx train --config`` takes as is;
- ``trials.csv``: every trial's number, state (complete / pruned / fail, or interrupted: not counted), score,
  searched values, selected round, seconds, failure reason and validation curve (``round:accuracy;...``);
- ``study.db``: the Optuna study (SQLite), for ``optuna-dashboard`` or further analysis;
- ``metrics.json``: the objective (group, metric), the best trial, trial counts, the space, CPU time;
- with ``--plot``: ``history.png`` and ``parallel.png``.

Under ``--dp`` only the released best config, its noisy score and ``privacy.json`` are written; the trials'
scores go to ``nonprivate-trials.csv`` on request only.

While the study runs it lives in ``.<out>.study/study.db`` beside ``--out`` (unless ``--storage``);
the same command continues it after a kill; it moves into the artifact when the study completes.
"""

from __future__ import annotations

import shutil
import time
from pathlib import Path
from typing import Any

from pfl_cli.cli.output import Reporter
from pfl_cli.tune.plan import Plan, TuneOptions


def run_tune(cfg, o: TuneOptions, *, partition: Path, out: Path, force: bool, report: Reporter,
             plot: bool = False, study=(None, None)) -> None:
    """``study``: ``(ledger, note)`` of the private study whose best.yaml is ``--config``
    (:func:`pfl_cli.privacy.study.study_prior`): under --dp its ledger composes into privacy.json."""
    from pfl_cli.artifacts import ArtifactWriter
    from pfl_cli.cli.common import load_partition_dataset
    from pfl_cli.fl.api import validate_train_config
    from pfl_cli.tune.plan import artifact_config, check_options, plan_data, plan_study
    from pfl_cli.tune.study import open_storage

    validate_train_config(cfg)
    checked = check_options(cfg, o)
    ArtifactWriter(out, stage="tune", config={}, seed=cfg.seed, force=force)  # --out problems first
    storage = open_storage(o.storage) if o.storage is not None else None  # an unreachable URL: before any work
    part, _info, part_art, ds = load_partition_dataset(partition)
    plan, o = plan_study(cfg, o, part, checked=checked, warn=report.warn)
    private = cfg.dp_epsilon is not None
    inputs = [part_art.input_ref(), ds.input_ref()]
    writer = ArtifactWriter(out, stage="tune", config=artifact_config(plan, o), seed=cfg.seed, inputs=inputs,
                            force=force, dp=private)
    if writer.up_to_date():
        report.note(f"{out} is up to date (same config and inputs); nothing to do.")
        report.result({"out": str(out), "up_to_date": True})
        return
    data = plan_data(plan, o, ds, part)
    if private:
        from pfl_cli.tune.private_study import run_private_study

        _write_private(writer, run_private_study(plan, o, data, prior=study[0], note=report.note), plan, o,
                       out=out, report=report, part_art=part_art)
        if study[1]:
            report.note(study[1])
        return
    from pfl_cli.cli import interrupt
    from pfl_cli.tune.run import run_study, study_location
    from pfl_cli.tune.study import still_rising, study_identity

    meta = study_identity(plan.trial_cfg, plan.params, plan.objective, partition=part_art.content_hash,
                          validation={"fraction": o.validation_fraction, "clients": plan.validation_clients,
                                      "unlabeled": plan.unlabeled_validation})
    url, staging = study_location(out, o, force=force, note=report.note)
    name = o.name(cfg.algorithm)
    where = f"{staging}/study.db" if storage is None else f"the study {name!r} of --storage"
    interrupt.kept(f"interrupted; nothing was written to --out, and the finished trials are kept in {where}: run "
                   "the same command again to continue the study.")
    started = time.time()
    study = run_study(plan, o, data, url=url, name=name, meta=meta, partition=partition, force=force,
                      note=report.note, progress=report.progress, track=_tracker(o))
    _write_artifact(writer, study, plan, o, out=out, staging=staging, started=started, plot=plot, part_art=part_art)
    _print_summary(report, out, study, plan, partition)
    if (last := still_rising(study)) is not None:
        report.warn(f"every trial's validation curve still rises at its last round ({last}): the --rounds budget, "
                    f"not the searched settings, may be what limits the best score; try --rounds {2 * plan.cfg.rounds}.")


def _tracker(o: TuneOptions):
    """``--log wandb|mlflow``: each trial a run of the study's group / experiment; None without --log."""
    if not o.logs:
        return None
    from pfl_cli.cli.loggers import StudyLoggers

    return lambda study: StudyLoggers(o.logs, o.log_dir, study, group=o.log_group)


# ---------------------------------------------------------------------------- the artifact
def _write_artifact(writer, study, plan: Plan, o: TuneOptions, *, out: Path, staging: Path | None, started: float,
                    plot: bool, part_art) -> None:
    from pfl_cli.cli import interrupt
    from pfl_cli.config import config_to_dict
    from pfl_cli.tune.run import best_config, study_metrics
    from pfl_cli.tune.study import trial_rows

    best_cfg, best = best_config(study, plan, out=out)
    header, rows = trial_rows(study, plan.params)
    metrics = study_metrics(study, plan, o, started=started)
    with writer:
        # from the swap on, --out holds the whole artifact: a Ctrl-C in the cleanup or the summary says so
        writer.after_swap(lambda: interrupt.kept(f"interrupted after {out} was written; it is complete (the same "
                                                 "command again finds it up to date)."))
        writer.save_text("best.yaml", _best_yaml(config_to_dict(best_cfg), plan, best, part_art))
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


def _best_yaml(config: dict, plan: Plan, best, part_art) -> str:
    import yaml

    from pfl_cli.privacy.study import provenance_block

    head = (f"# pflx tune: the best of the study's trials (trial {best.number}, validation "
            f"{plan.objective['metric']} {best.value:.4f} on {plan.objective['scored_on']}).\n"
            "# Train with it: pflx train --partition PART --config best.yaml --out RUN (add --seed S for more seeds).\n")
    # what chose it travels with the file (pfl_cli.privacy.study): train --dp with it on this partition is refused
    return head + provenance_block(part_art, ledger_doc=None) + yaml.safe_dump(config, sort_keys=False)


def _copy_sqlite(src: Path, dst: Path) -> None:
    """A consistent copy of a live SQLite database (its backup API, not a byte copy of a file in use)."""
    import sqlite3

    with sqlite3.connect(str(src)) as a, sqlite3.connect(str(dst)) as b:
        a.backup(b)
    b.close()
    a.close()


def _write_private(writer, result, plan: Plan, o: TuneOptions, *, out: Path, report: Reporter, part_art) -> None:
    """The released best config, its noisy score and privacy.json (the whole study); nonprivate-trials.csv on
    request only."""
    import yaml

    from pfl_cli.artifacts import MECHANISM, NONPRIVATE, POST_PROCESSING
    from pfl_cli.config import config_to_dict
    from pfl_cli.privacy.study import provenance_block
    from pfl_cli.tune.private_study import SELECTION_NOTE_SE

    with writer:
        head = ("# pflx tune --dp: the released best config of a private study (Papernot & Steinke 2022); "
                "privacy.json covers the whole study.\n")
        # the study's ledger (released) and its partition's keyed fingerprint travel with the file, so a copy of it
        # still composes (pfl_cli.privacy.study)
        writer.save_text("best.yaml", head + provenance_block(part_art, ledger_doc=result.privacy)
                         + yaml.safe_dump(config_to_dict(result.best_cfg), sort_keys=False), release=MECHANISM)
        writer.save_json("privacy.json", result.privacy, release=POST_PROCESSING)
        writer.save_json("metrics.json", result.metrics, release=MECHANISM)
        if plan.cfg.write_nonprivate:
            writer.save_csv("nonprivate-trials.csv", ["trial", "state", "noisy_score", *(p.key for p in plan.params)],
                            result.rows, release=NONPRIVATE)
    _print_private(report, out, result.metrics)
    se = result.score_standard_error
    if se > SELECTION_NOTE_SE:
        report.note(f"the released score's standard error is about {100 * se:.1f} points (score noise "
                    f"{o.dp_score_noise:g} over the scored clients): trials closer than about {200 * se:.0f} points "
                    "were told apart by noise, not by the data.")


# ---------------------------------------------------------------------------- the summary
WITH_PRIOR = " with the one that chose --config"


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


def _print_private(report: Reporter, out: Path, m: dict) -> None:
    from rich.table import Table

    dp = m["dp"]
    table = Table(title=f"tune --dp -> {out}: {m['algorithm']}, released best of a private study", title_justify="left",
                  caption=f"whole study{WITH_PRIOR if dp.get('composes_config_study') else ''}: "
                          f"epsilon {dp['epsilon']:.4g} at delta {dp['delta']:g} ({dp['unit']}-level; "
                          f"each trial {dp['trial_epsilon']:g}); the score is a noisy release, standard error "
                          f"about {100 * dp['score_standard_error']:.1f} points", caption_justify="left")
    table.add_column("noisy validation score", justify="right")
    for key in m["best"]["params"]:
        table.add_column(key, justify="right")
    table.add_row(f"{100 * m['best']['noisy_score']:.1f}%",
                  *(_show(v) for v in m["best"]["params"].values()))
    report.result({"out": str(out), "up_to_date": False, **m}, table)


def _show(v: Any) -> str:
    return f"{v:.4g}" if isinstance(v, float) else str(v)
