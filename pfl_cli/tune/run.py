"""The study of `pflx tune` run to its end: where it lives, its trials in this process (one at a time or stacked
on a run axis) or in worker processes (:mod:`pfl_cli.tune.workers`), its progress, and what its artifact
reports (:func:`study_metrics`). The command (``pfl_cli.cli.tune_run``) writes the artifact and prints.

While the study runs it lives in ``.<out>.study/study.db`` beside ``--out`` (unless ``--storage``): the same
command continues it after a kill; the command moves it into the artifact when the study completes.
"""

from __future__ import annotations

import dataclasses
import shutil
import time
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any, Callable

from pfl_cli.tune.plan import Plan, TuneOptions


def staging_dir(out: Path) -> Path:
    out = Path(out)
    return out.parent / f".{out.name}.study"


def study_location(out: Path, o: TuneOptions, *, force: bool,
                   note: Callable[[str], None] = lambda _m: None) -> tuple[str, Path | None]:
    """The study's storage URL and its staging directory (None with ``--storage``): ``.<out>.study/study.db``
    beside ``--out``, made here (``force``: an unfinished one there deleted first, said by ``note``)."""
    if o.storage is not None:
        return o.storage, None
    staging = staging_dir(out)
    if force and staging.exists():
        shutil.rmtree(staging)
        note(f"--force: deleted the unfinished study in {staging} and started a fresh one.")
    staging.mkdir(parents=True, exist_ok=True)
    return f"sqlite:///{(staging / 'study.db').resolve()}", staging


class _Silent:
    def advance(self, n: int = 1, status: str = "", total: int | None = None) -> None:
        pass


class _NoProgress(AbstractContextManager):
    def __enter__(self):
        return _Silent()

    def __exit__(self, *exc) -> None:
        return None


def run_study(plan: Plan, o: TuneOptions, data, *, url: str, name: str, meta: dict, partition: Path,
              force: bool = False, note: Callable[[str], None] = lambda _m: None,
              progress: Callable[..., AbstractContextManager] | None = None,
              track: Callable[[Any], Any] | None = None):
    """Run (or continue) the study ``name`` in ``url`` until ``o.trials`` trials count; returns the study.

    ``meta``: the study's identity (:func:`pfl_cli.tune.study.study_identity`), refused when a stored study
    differs (``force``: replaced). ``note(line)``: a status line. ``progress(description, total, unit=)``: a
    context manager yielding a bar with ``advance(n, status=)`` (the command's progress display), counted in
    rounds of every trial. ``track(study)``: an experiment tracker for the study (``.trial(frozen_trial)`` as each
    trial of this process ends, ``.finish(study)`` at the end, for the trials of other processes), or None.
    ``partition``: the partition artifact, which ``--jobs`` workers load again.
    """
    from pfl_cli.tune.loop import Proposals, optimize
    from pfl_cli.tune.study import (best_trial, counted, identity_digest, make_pruner, make_sampler, open_storage,
                                    open_study, rounds_done)
    from pfl_cli.tune.trial import Objective

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
                       on_replaced=note)
    identity = identity_digest(meta)
    tracked = track(study) if track is not None else None
    before = counted(study)
    if before:
        note(f"continuing the study {name!r}: {before} of {o.trials} trials already there.")
    # Progress in rounds (every trial trains --rounds): a line at least every 10 s in a log and a time left from
    # the first round on, where a count of trials stays at "left -:--:--" until a whole trial is done (issue 41).
    rounds = plan.cfg.rounds if plan.cfg.algorithm_class.federated else 0
    per = max(rounds, 1)
    display = progress("tune", o.trials * per, unit="round" if rounds else "trial") if progress else _NoProgress()
    with display as bar:
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
            if tracked is not None:
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
            from pfl_cli.tune.workers import run_workers

            run_workers(plan, o, url=url, name=name, identity=identity, partition=partition,
                        poll=lambda: on_done(load_study(storage, name), None))
    if tracked is not None:
        tracked.finish(load_study(storage, name))
    return load_study(storage, name)


def load_study(storage, name: str):
    import optuna

    return optuna.load_study(study_name=name, storage=storage)


def best_config(study, plan: Plan, *, out: Path):
    """The base config with the best trial's values (best.yaml), and that trial; RunError (naming ``out``, the
    artifact not written) when no trial completed."""
    from pfl_cli.errors import RunError
    from pfl_cli.tune.study import best_trial, best_values, state_counts, trial_rows

    best = best_trial(study)
    if best is None:
        header, rows = trial_rows(study, plan.params)
        reasons = sorted({r[header.index("error")] for r in rows if r[header.index("error")]})
        raise RunError(f"no trial of the study completed ({state_counts(study)}); nothing was written to --out {out}"
                       + (f"; failures: {'; '.join(reasons)[:300]}" if reasons else "")
                       + ". Widen or move the search space (--space), or raise --rounds.")
    return dataclasses.replace(plan.cfg, **best_values(best, plan.params)), best


def study_metrics(study, plan: Plan, o: TuneOptions, *, started: float) -> dict:
    """The tune artifact's metrics.json: the objective, the best trial, the trial counts, the space, the times."""
    from pfl_cli.tune.space import describe
    from pfl_cli.tune.study import best_trial, best_values, state_counts, trial_rows

    best = best_trial(study)
    header, rows = trial_rows(study, plan.params)
    seconds = [r[header.index("seconds")] for r in rows if r[header.index("seconds")] is not None]
    return {
        "algorithm": plan.cfg.algorithm,
        "objective": plan.objective,
        "best": {"trial": best.number, "value": best.value, "params": best_values(best, plan.params),
                 "selected_round": best.user_attrs.get("selected_round")},
        "trials": state_counts(study),
        "space": describe(plan.params),
        "sampler": plan.sampler,
        "pruner": plan.pruner,
        # each trial's own duration, summed: stacked (--stack) or parallel (--jobs) trials overlap, so this can
        # exceed wall_seconds; cpu_seconds is what the study cost the machine
        "trial_seconds": round(float(sum(seconds)), 3),
        "wall_seconds": round(time.time() - started, 3),
        "cpu_seconds": _cpu_seconds(),
        "validation": {"fraction": o.validation_fraction, "clients": plan.validation_clients,
                       "validation_clients_unlabeled": plan.unlabeled_validation},
        "storage": "study.db" if o.storage is None else redacted(o.storage),
    }


def _cpu_seconds() -> float | None:
    """CPU time (user + system) of this process and its finished workers (``--jobs``), start-up included; None
    where the platform does not say (no ``resource`` module: Windows). A resumed study's earlier processes are
    not in it."""
    try:
        import resource
    except ImportError:
        return None
    total = 0.0
    for who in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN):
        usage = resource.getrusage(who)
        total += usage.ru_utime + usage.ru_stime
    return round(total, 3)


def redacted(url: str) -> str:
    """A storage URL without its credentials (``user:password@``)."""
    if "@" not in url or "://" not in url:
        return url
    scheme, rest = url.split("://", 1)
    return f"{scheme}://{rest.split('@', 1)[1]}"
