"""``pflx train --seeds`` and ``compare --spec``'s seeds: runs of one stackable algorithm trained stacked on a run
axis in this process (:func:`pfl_cli.fl.stack.train_stacked`, DESIGN.md section 8), each written where and as
:func:`pfl_cli.train.run.run_train` writes it.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np

from pfl_cli.errors import InputError, RunError
from pfl_cli.fl.checkpoint import CHECKPOINT_FILE, Checkpointer, fingerprint
from pfl_cli.train.events import TrainEvents
from pfl_cli.train.files import train_metrics, write_dp_artifact, write_train_files
from pfl_cli.train.run import Plot, _diverged_message, _resume, _status, _warn_clamped, with_model_files


class StackMember:
    """One run of a stack: its config, its artifact, the private study whose ledger composes into it
    (``study``, as :func:`run_train` takes it), its tracker run's name and group and its loggers' folder."""

    def __init__(self, cfg, out: Path, *, study=(None, None), log_as: tuple[str | None, str | None] = (None, None),
                 log_dir: Path | None = None) -> None:
        self.cfg, self.out, self.study, self.log_as, self.log_dir = cfg, Path(out), study, log_as, log_dir


def run_train_seeds(cfg, seeds: list[int], *, partition: Path, out: Path, resume: bool = False, force: bool = False,
                    events: TrainEvents | None = None, plot: Plot | None = None, logs: tuple[str, ...] = (),
                    log_dir: Path | None = None, study=(None, None), config_file: Path | None = None,
                    allow_nonprivate_config: bool = False) -> list[Path]:
    """``pflx train --seeds S1,S2,... --out DIR``: the runs of ``cfg`` with those seeds trained stacked in this
    process (:mod:`pfl_cli.fl.stack`), each written to ``DIR/seed-<s>`` exactly as ``train --seed s --out
    DIR/seed-<s>`` writes it (its manifest adds ``stacked``); a finished run's artifact is left as it is. ``--log``:
    each seed its own loggers' folder (``LOG_DIR/seed-<s>``; default ``DIR/seed-<s>.logs``, where the separate
    run's default is) and its own W&B / MLflow run ``seed-<s>``. Returns the runs trained now (none: all were up
    to date). Refused: seeds that are not distinct integers >= 0, and a run under torchrun (one process)."""
    import dataclasses

    from pfl_cli.train.events import default_log_dir

    from pfl_cli.train.run import study_of

    check_seeds(seeds)
    study = study_of(cfg, Path(partition), study, config_file, allow_nonprivate_config)  # as run_train's
    out = Path(out)
    members = []
    for s in seeds:
        o = out / f"seed-{s}"
        members.append(StackMember(dataclasses.replace(cfg, seed=s), o, study=study,
                                   log_dir=default_log_dir(o) if log_dir is None else log_dir / f"seed-{s}"))
    return train_stack(members, partition=partition, resume=resume, force=force, events=events, plot=plot, logs=logs)


def check_seeds(seeds, text: str | None = None) -> None:
    """The seeds of a stack: distinct integers >= 0, at least one (``text``: as the user wrote them)."""
    seeds = list(seeds)
    if not seeds or not all(isinstance(s, int) and not isinstance(s, bool) for s in seeds) \
            or len(set(seeds)) != len(seeds) or min(seeds) < 0:
        text = ",".join(str(s) for s in seeds) if text is None else text
        raise InputError(f"--seeds must name distinct integers >= 0, e.g. 0,1,2; got {text!r}.")


def train_stack(members: list[StackMember], *, partition: Path, resume: bool | None = False, force: bool = False,
                events: TrainEvents | None = None, plot: Plot | None = None, logs: tuple[str, ...] = (),
                label: str = "train") -> list[Path]:
    """Train ``members`` (runs of one stackable algorithm) stacked on a run axis in this process
    (:func:`pfl_cli.fl.stack.train_stacked`), each written to its ``out`` exactly as :func:`run_train` writes
    that config there (the manifest adds ``stacked``: the seeds of the stack). A member whose artifact is up to
    date is left as it is; the others train, each from its checkpoint where ``resume`` (None: where a checkpoint
    of this very run is there -- ``compare --spec``'s continuation after a kill; one of another config is
    refused unless ``force`` discards it). Under --dp each run is its own mechanism: its noise from its own
    generator (OS entropy unless ``dp_noise: seeded``), its own ledger composed with its ``study``'s. Returns
    the members trained now (none: all were up to date); a run that fails ends the command after the others
    are written (RunError naming it)."""
    from pfl_cli.artifacts import ArtifactWriter
    from pfl_cli.overlap import partition_input, training_record
    from pfl_cli.config import config_to_dict
    from pfl_cli.fl.api import validate_train_config
    from pfl_cli.fl.device import check_device, resolve_device
    from pfl_cli.fl.stack import check_stackable
    from pfl_cli.data.location import load_partition_dataset
    from pfl_cli.fl.distributed import launched_size
    from pfl_cli.readers import check_checkpoint_location

    from pfl_cli import registry

    events = TrainEvents() if events is None else events
    if launched_size() > 1:  # the stack's local SGD is one batched call, which ranks would each repeat and write
        raise InputError(f"--seeds trains its runs stacked in one process and does not run under torchrun "
                         f"(WORLD_SIZE is {launched_size()}); run it without torchrun, or train each seed with "
                         "--seed S.")
    cfgs = [m.cfg for m in members]
    for c in cfgs:
        check_stackable(c, registry.stackable_names)
        validate_train_config(c)
    if plot and any(c.dp_epsilon is not None for c in cfgs):
        raise InputError("--plot draws accuracies measured on the private clients, which --dp does not release; "
                         "drop --plot (with --write-nonprivate, nonprivate-metrics.csv holds those numbers).")
    check_device(cfgs[0].device)
    for m in members:
        ArtifactWriter(m.out, stage="train", config={}, seed=m.cfg.seed, force=force)  # --out problems first
    part, info, part_art, ds = load_partition_dataset(partition)
    n_train = int(np.sum(part.role == 0))
    if n_train == 0:
        raise InputError(f"--partition {partition}: training needs train clients (role 0); all "
                         f"{part.num_clients} clients are holdout clients. Re-partition with fewer "
                         "--holdout-clients.")
    from pfl_cli.readers.files import file_inputs

    inputs = [partition_input(part_art), ds.input_ref(), *file_inputs(cfgs[0])]
    configs = [config_to_dict(c) for c in cfgs]
    todo = []
    for i, (m, c) in enumerate(zip(members, cfgs)):
        if ArtifactWriter(m.out, stage="train", config=configs[i], seed=c.seed, inputs=inputs, force=force,
                          dp=c.dp_epsilon is not None).up_to_date():
            events.note(f"{m.out} is up to date (same config and inputs); nothing to do.")
        else:
            todo.append(i)
    stacked = {"seeds": [cfgs[i].seed for i in todo], "runs": len(todo)}  # the runs trained together
    writers, cks, states = {}, {}, {}
    for i in todo:
        m, c, config = members[i], cfgs[i], configs[i]
        writer = ArtifactWriter(m.out, stage="train", config=config, seed=c.seed, inputs=inputs, force=force,
                                dp=c.dp_epsilon is not None, notes={"stacked": stacked})
        ck = Checkpointer(m.out, fingerprint(with_model_files(config, c), inputs))
        check_checkpoint_location(ck.dir, ck.path, resume=bool(resume))
        if resume is None:
            states[i] = _continue(ck, c, m.out, force, events)
        else:
            if not resume and ck.path.is_file():
                if not force:
                    raise InputError(f"--out {m.out}: an earlier run was interrupted and left its checkpoint at "
                                     f"{ck.path}; pass --resume to continue from it, or --force to start over and "
                                     "discard it.")
                ck.path.unlink(missing_ok=True)
            states[i] = _resume(ck, c, events) if resume else None
        ck.remove_torn_writes()
        writers[i], cks[i] = (writer, config), ck
    if not todo:
        return []
    # the round loop and torch: only once some run is not up to date
    from pfl_cli.fl.loop import TrainingDiverged
    from pfl_cli.fl.stack import train_stacked

    device = resolve_device(cfgs[0].device)
    if any(cfgs[i].dp_epsilon is None for i in todo):  # under --dp the clients' number and sizes are private
        _warn_clamped(cfgs[todo[0]], part, n_train, events)
    events.kept("interrupted; nothing more was written, and each unfinished run's last checkpoint is kept beside "
                   "its artifact: run the same command again (train: with --resume) to continue from them.")
    import threading
    import time

    lock = threading.Lock()
    loggers = {i: events.loggers(logs, members[i].log_dir or members[i].out, private=cfgs[i].dp_epsilon is not None,
                                 resume=states[i] is not None, name=members[i].log_as[0] or members[i].out.name,
                                 group=members[i].log_as[1], params=writers[i][1]) for i in todo}
    try:
        with events.progress(label, sum(cfgs[i].rounds for i in todo), unit="round") as bar:
            for lg in loggers.values():  # each run's elapsed time from the stack's start, not its loggers' set-up
                lg.start = time.monotonic()
            seen = {i: int(states[i]["round"]) if states[i] else 0 for i in todo}
            resumed = sum(seen.values())
            if resumed:
                bar.advance(resumed, status="resumed")

            def on_progress(j: int, done: int, total: int, status: dict) -> None:
                i = todo[j]
                private = cfgs[i].dp_epsilon is not None
                with lock:  # the runs' threads: one display, each run's loggers written by one thread at a time
                    # Under --dp the running loss and accuracies are private diagnostics: not shown, not logged.
                    bar.advance(done - seen[i], status=f"seed {cfgs[i].seed}" + ("" if private else
                                                                                 f": {_status(status)}"))
                    seen[i] = done
                    loggers[i].log(done, status, done % cfgs[i].eval_every == 0 or done == total)

            results = train_stacked(ds.x, ds.y, ds.num_classes, part, [cfgs[i] for i in todo], device=device,
                                    labeled=ds.labeled, vocab_size=ds.extra.get("vocab_size"),
                                    resumes=[states[i] for i in todo],
                                    on_checkpoint=[cks[i].write for i in todo], on_progress=on_progress)
    finally:
        for lg in loggers.values():
            lg.close()
    failed, trained = [], []
    record = None
    for i, got in zip(todo, results):
        m, c, ck = members[i], cfgs[i], cks[i]
        if got.error is not None:
            err = got.error
            failed.append(_diverged_message(err, c, ck.path, m.out) if isinstance(err, TrainingDiverged)
                          else f"seed {c.seed}: {err}")
            continue
        writer, config = writers[i]
        run = got.run
        metrics = train_metrics(c, run, info, device)
        if c.dp_epsilon is not None:
            with writer:
                released = write_dp_artifact(writer, c, config, run, part, metrics, prior=m.study[0])
                writer.after_swap(lambda d=ck.dir: shutil.rmtree(d, ignore_errors=True))
            events.trained(m.out, {**metrics, "dp": released}, private=True, nonprivate=bool(c.write_nonprivate))
            if m.study[1]:
                events.note(m.study[1])
            trained.append(m.out)
            continue
        if m.study[1]:
            events.note(m.study[1])
        if record is None:
            record = training_record(part, ds, info["spec"])
        with writer:
            write_train_files(writer, config, run, part, metrics, record=record)
            if plot:
                plot(writer.path("metrics.csv"), writer.path("metrics.json"), writer.path("curves.png"))
            if (ck.written or states[i] is not None) and ck.path.is_file():  # this run's checkpoint
                shutil.copyfile(ck.path, writer.path(f"checkpoint/{CHECKPOINT_FILE}"))
            writer.after_swap(lambda d=ck.dir: shutil.rmtree(d, ignore_errors=True))
        events.trained(m.out, metrics, private=False)
        trained.append(m.out)
    if failed:
        raise RunError("; ".join(failed))
    return trained


def _continue(ck: Checkpointer, cfg, out: Path, force: bool, events: TrainEvents) -> dict | None:
    """Without --resume / --no-resume (``compare --spec``): this run's checkpoint, left by a kill, is continued;
    one of another config or other inputs is refused, or discarded with ``force``."""
    from pfl_cli.fl.checkpoint import read_checkpoint

    if not ck.path.is_file():
        return None
    if read_checkpoint(ck.path).get("fingerprint") != ck.fp:
        if not force:
            raise InputError(f"--out {out}: an earlier run of another config or other inputs left its checkpoint at "
                             f"{ck.path}; pass --force to discard it and start over, or delete {ck.dir}.")
        events.warn(f"--force: discarding the checkpoint another config left at {ck.path}; starting over.")
        ck.path.unlink(missing_ok=True)
        return None
    return ck.resume(cfg)


