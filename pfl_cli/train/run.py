"""The train stage's core: read the partition, train with checkpoints, write the artifact.

:func:`run_train` is what `pflx train` runs (``pfl_cli.cli.train_run`` parses, calls it and prints) and what a
Python user calls, with the same refusals: a config the algorithm does not take, ``plot`` under --dp, a
partition without train clients, an interrupted run's checkpoint without ``resume`` or ``force``, a device that
is not there. The files it writes: :mod:`pfl_cli.train.files`; the stacked runs of ``--seeds``:
:mod:`pfl_cli.train.stack`. It reports through ``events`` (:class:`pfl_cli.train.events.TrainEvents`).

While training, the latest checkpoint lives in ``.<out>.checkpoint/state.pt`` beside ``--out``
(:mod:`pfl_cli.fl.checkpoint`: sealed, fingerprinted, written atomically by rank 0); it moves into
the artifact when the run completes.
"""

from __future__ import annotations

import dataclasses
import shutil
from pathlib import Path
from typing import Callable

import numpy as np

from pfl_cli.errors import InputError, RunError
from pfl_cli.fl.checkpoint import CHECKPOINT_FILE, Checkpointer, fingerprint
from pfl_cli.train.events import TrainEvents
from pfl_cli.train.files import train_metrics, write_dp_artifact, write_train_files

# draw(metrics.csv, metrics.json, curves.png): the training curves drawn into the artifact (the command's
# ``--plot``: pfl_cli.cli.figures.training_curves)
Plot = Callable[[Path, Path, Path], object]


@dataclasses.dataclass(frozen=True)
class TrainResult:
    """What :func:`run_train` did: ``up_to_date`` (nothing to do), else the run's ``metrics`` (under --dp the
    public ones and ``dp``, what the ledger released; on a rank other than 0 of a distributed run, which writes
    nothing, the metrics it computed)."""

    out: Path
    up_to_date: bool
    metrics: dict | None = None


def run_train(cfg, *, partition: Path, out: Path, resume: bool = False, force: bool = False,
              events: TrainEvents | None = None, plot: Plot | None = None, logs: tuple[str, ...] = (),
              log_dir: Path | None = None, study=(None, None),
              log_as: tuple[str | None, str | None] = (None, None), config_file: Path | None = None,
              allow_nonprivate_config: bool = False) -> TrainResult:
    """Train ``cfg`` (a TrainConfig: :func:`pfl_cli.registry.train_config`) on the partition artifact
    ``partition`` and write the train artifact ``out``; re-run with the same config and inputs, nothing to do.

    ``resume``: continue from the checkpoint an interrupted run of this config left beside ``out`` (without it,
    such a checkpoint is refused unless ``force`` discards it; ``force`` also replaces a different artifact).
    ``events``: what the run says (default :class:`TrainEvents`: warnings only). ``plot``: draws curves.png
    from metrics.csv and metrics.json (refused under --dp). ``logs``: experiment loggers ``events`` builds, in
    ``log_dir`` (default ``out``). ``study``: ``(ledger, note)`` of the private study whose best.yaml is the
    config (:func:`pfl_cli.privacy.study.study_prior`): its ledger composes into privacy.json. ``log_as``:
    ``(run name, group)`` of the W&B / MLflow run (default: ``out``'s name, no group). ``config_file``: the YAML
    ``cfg`` was read from (`pflx train --config`): a study's best.yaml composes its ledger, or is refused under
    --dp when a study without --dp chose it on this partition, unless ``allow_nonprivate_config``
    (:func:`study_of`)."""
    events = TrainEvents() if events is None else events
    out, partition = Path(out), Path(partition)
    study = study_of(cfg, partition, study, config_file, allow_nonprivate_config)
    from pfl_cli.fl import distributed
    from pfl_cli.fl.api import validate_train_config
    from pfl_cli.fl.device import check_device, resolve_device

    validate_train_config(cfg)
    if plot and cfg.dp_epsilon is not None:  # curves.png would draw accuracies of the private clients
        raise InputError("--plot draws accuracies measured on the private clients, which --dp does not release; "
                         "drop --plot (with --write-nonprivate, nonprivate-metrics.csv holds those numbers).")
    check_device(cfg.device)  # --device cuda without a GPU fails here, before any work
    if distributed.launched_size() > 1:  # under torchrun or --nproc: join the ranks, rank 0 alone writes
        device = resolve_device(cfg.device)
        distributed.check_world_size(cfg, distributed.launched_size(), device)
        device = distributed.start(device)
        try:
            result = _run_train(cfg, device, partition=partition, out=out, resume=resume, force=force,
                                events=events, plot=plot, logs=logs, log_dir=log_dir, study=study, log_as=log_as)
        except BaseException:
            distributed.stop()
            raise
        distributed.stop(finished=True)
        return result
    # the device (and torch) once the run is known not to be up to date
    return _run_train(cfg, None, partition=partition, out=out, resume=resume, force=force, events=events,
                      plot=plot, logs=logs, log_dir=log_dir, study=study, log_as=log_as)


def study_of(cfg, partition, study, config_file, allow_nonprivate_config: bool):
    """``study`` as given, or with ``config_file`` what :func:`pfl_cli.privacy.study.study_prior` makes of it (the
    same ledger, note or refusal as `pflx train --config`)."""
    if config_file is None:
        return study
    from pfl_cli.privacy.study import study_prior

    return study_prior(Path(config_file), partition, cfg, allow_nonprivate=allow_nonprivate_config)


def _run_train(cfg, device, *, partition: Path, out: Path, resume: bool, force: bool, events: TrainEvents,
               plot: Plot | None = None, logs: tuple[str, ...] = (), log_dir: Path | None = None,
               study=(None, None), log_as: tuple[str | None, str | None] = (None, None)) -> TrainResult:
    from pfl_cli.artifacts import ArtifactWriter
    from pfl_cli.config import config_to_dict
    from pfl_cli.data.location import load_partition_dataset
    from pfl_cli.fl.distributed import world
    from pfl_cli.partition.base import ROLE_TRAIN

    writes = world()[0] == 0
    ArtifactWriter(out, stage="train", config={}, seed=cfg.seed, force=force)  # --out problems first
    part, info, part_art, ds = load_partition_dataset(partition)
    n_train = int(np.sum(part.role == ROLE_TRAIN))
    if n_train == 0:
        raise InputError(f"--partition {partition}: training needs train clients (role 0); all "
                         f"{part.num_clients} clients are holdout clients. Re-partition with fewer "
                         "--holdout-clients.")
    config = config_to_dict(cfg)
    from pfl_cli.overlap import partition_input, training_record
    from pfl_cli.readers.files import file_inputs

    # the partition's fingerprint identifies it under --dp too; files the config names by path travel as inputs
    inputs = [partition_input(part_art), ds.input_ref(), *file_inputs(cfg)]
    private = cfg.dp_epsilon is not None
    if not private:  # under --dp the number and sizes of the clients are private: nothing is said about them
        _warn_clamped(cfg, part, n_train, events)
        notice = getattr(getattr(cfg, "algorithm_class", None), "partition_notice", None)  # FLowDUP's size notice
        if notice is not None and (line := notice(part)):
            events.warn(line)
    writer = ArtifactWriter(out, stage="train", config=config, seed=cfg.seed, inputs=inputs, force=force, dp=private)
    if writer.up_to_date():
        events.note(f"{out} is up to date (same config and inputs); nothing to do."
                    + (f" `pflx show --plot {out}` draws its curves." if plot else ""))
        return TrainResult(out, up_to_date=True)
    # the round loop (and torch, with the device) once the run is known not to be up to date
    from pfl_cli.fl.api import train_federated
    from pfl_cli.fl.loop import TrainingDiverged
    from pfl_cli.readers import check_checkpoint_location

    if device is None:
        from pfl_cli.fl.device import resolve_device

        device = resolve_device(cfg.device)

    ck = Checkpointer(out, fingerprint(with_model_files(config, cfg), inputs))
    ck_path, ck_dir = ck.path, ck.dir
    check_checkpoint_location(ck_dir, ck_path, resume=resume)
    if not resume and ck_path.is_file():  # an interrupted run's work is discarded only when asked to
        if not force:
            raise InputError(f"--out {out}: an earlier run was interrupted and left its checkpoint at {ck_path}; "
                             "pass --resume to continue from it, or --force to start over and discard it.")
        events.warn(f"--force: discarding the checkpoint an earlier run left at {ck_path}; starting over.")
        if writes:  # gone now, so that an interrupt before this run's first checkpoint cannot leave it behind
            ck_path.unlink(missing_ok=True)
    ck.remove_torn_writes()
    state = _resume(ck, cfg, events) if resume else None

    def on_checkpoint(snapshot: dict) -> None:
        ck.write(snapshot)
        events.kept(_kept_note(int(snapshot["round"]), ck_path, events.continue_hint(), private))

    federated = cfg.algorithm_class.federated
    total = cfg.rounds if federated else 0
    start = int(state["round"]) if state is not None else 0
    if start:
        events.kept(_kept_note(start, ck_path, events.continue_hint(), private))
    elif federated:
        # --dp checkpoints after every round (fl.loop: no round is released twice)
        when = "after every round" if private else f"every {cfg.checkpoint_every or cfg.eval_every} rounds"
        events.kept(f"interrupted before the first checkpoint (one comes {when}); nothing was kept; run the "
                       "command again to start over.")
    loggers = events.loggers(logs if writes else (), log_dir or out, private=private, resume=state is not None,
                             name=log_as[0] or out.name, group=log_as[1], params=config)  # W&B / MLflow
    with events.progress("train", total or None, unit="round") as bar:
        seen = [start]
        if start:
            bar.advance(start, status="resumed")

        def on_progress(done: int, _total: int, status: dict) -> None:
            # Under --dp the running loss and accuracies are private diagnostics: not shown, not logged.
            bar.advance(done - seen[0], status="" if private else _status(status))
            seen[0] = done
            loggers.log(done, status, done % cfg.eval_every == 0 or done == _total)

        try:
            run = train_federated(ds.x, ds.y, ds.num_classes, part, cfg, device=device, resume=state,
                                  labeled=ds.labeled, vocab_size=ds.extra.get("vocab_size"),
                                  on_checkpoint=on_checkpoint, on_progress=on_progress)
        except TrainingDiverged as err:
            raise RunError(_diverged_message(err, cfg, ck_path, out)) from None
        finally:
            loggers.close()

    metrics = train_metrics(cfg, run, info, device)
    if not writes:  # a rank other than 0 (distributed): rank 0 alone writes
        return TrainResult(out, up_to_date=False, metrics=metrics)
    if private:
        with writer:
            released = write_dp_artifact(writer, cfg, config, run, part, metrics, prior=study[0])
            writer.after_swap(lambda: shutil.rmtree(ck_dir, ignore_errors=True))
        public = {**metrics, "dp": released}
        events.trained(out, public, private=True, nonprivate=bool(cfg.write_nonprivate))
        if study[1]:
            events.note(study[1])
        return TrainResult(out, up_to_date=False, metrics=public)
    if study[1]:
        events.note(study[1])
    with writer:
        write_train_files(writer, config, run, part, metrics, record=training_record(part, ds, info["spec"]))
        if plot:  # drawn from the CSV just written, exactly as `pflx show --plot` redraws it
            plot(writer.path("metrics.csv"), writer.path("metrics.json"), writer.path("curves.png"))
        if (ck.written or state is not None) and ck_path.is_file():  # this run's checkpoint, not a stale one
            shutil.copyfile(ck_path, writer.path(f"checkpoint/{CHECKPOINT_FILE}"))
        writer.after_swap(lambda: shutil.rmtree(ck_dir, ignore_errors=True))
    events.trained(out, metrics, private=False)
    return TrainResult(out, up_to_date=False, metrics=metrics)


def _warn_clamped(cfg, part, n_train: int, events: TrainEvents) -> None:
    """Sizes above what the partition holds have an obvious meaning (all of them): used so, with a warning."""
    if cfg.clients_per_round is not None and cfg.clients_per_round > n_train:
        events.warn(f"--clients-per-round {cfg.clients_per_round} is more than the {n_train} train clients; every "
                    f"round uses all {n_train}.")
    if cfg.algorithm == "knnper":
        largest = int(np.max(np.diff(part.train_offsets))) if part.num_clients else 0
        if cfg.knn_k > largest:
            events.warn(f"knn_k {cfg.knn_k} is more than the largest client's {largest} train samples; each client "
                        "uses all the samples of its datastore as neighbours.")


def _resume(ck: Checkpointer, cfg, events: TrainEvents) -> dict | None:
    state = ck.resume(cfg)
    if state is None:
        events.warn(f"--resume: no checkpoint at {ck.path}; starting from scratch.")
    else:
        events.note(f"resuming from round {int(state['round'])} (checkpoint {ck.path}).")
    return state


def _kept_note(round_: int, ck_path: Path, how_to_continue: str, private: bool = False) -> str:
    if private:
        from pfl_cli.fl.dp import CHECKPOINT_HOLDS

        return (f"interrupted; nothing was written to --out, and the checkpoint of round {round_} is kept at "
                f"{ck_path} (mode 0600; it holds {CHECKPOINT_HOLDS}): {how_to_continue} to "
                "continue from it.")
    return (f"interrupted; nothing was written to --out, and the checkpoint of round {round_} is kept at {ck_path}: "
            f"{how_to_continue} to continue from it.")


def _status(status: dict) -> str:
    parts = [f"loss {status['loss']:.3f}"] if "loss" in status else []
    for group in ("train", "holdout"):
        if group in status:
            parts.append(f"{group} {100 * status[group]:.1f}%")
    return " ".join(parts)


def _diverged_message(err, cfg, ck_path: Path, out: Path) -> str:
    server_lr = getattr(cfg, "server_lr", None)
    server = "default" if server_lr is None else f"{server_lr:g}"
    if err.last_checkpoint is not None and ck_path.is_file():
        kept = f"the last good checkpoint (round {err.last_checkpoint}) is kept at {ck_path}"
    else:
        every = cfg.checkpoint_every or cfg.eval_every
        kept = f"no checkpoint was written yet (one comes every {every} rounds)"
    # Under --dp (err.loss None) the private loss is never printed: divergence was judged on the released model.
    what = "the released model stopped being finite" if err.loss is None else f"the mean client loss became {err.loss}"
    return (f"training diverged at round {err.round}: {what}; {kept}; nothing "
            f"was written to --out {out}. Lower --lr (now {cfg.lr:g}) or --server-lr (now {server}) and run "
            "again: --resume continues a checkpoint only with the identical config and inputs, so a run with "
            "a lower learning rate starts from round 0.")


def with_model_files(config: dict, cfg) -> dict:
    """``config`` and, for a model kind's net, the sha256 of the files it is built from (a factory's module, a
    weights file): a checkpoint resumes only with the same files (pfl_cli.models.kinds.file_digests)."""
    from pfl_cli.fl.config import model_kind

    if model_kind(getattr(cfg, "model_arch", "")) is None or getattr(cfg, "backbone", ""):
        return config
    from pfl_cli.models.kinds import file_digests

    return {**config, "model_files": file_digests(cfg.model_arch, cfg.model_weights)}
