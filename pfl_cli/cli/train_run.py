"""The body of `pflx train`: read inputs, train with checkpoints, write the artifact, print.

The ``train`` artifact (DESIGN.md section 3):

- ``config.yaml``: the resolved TrainConfig;
- ``model.pt``: the model payload of :func:`pfl_cli.fl.api.model_payload` (plain dicts and tensors,
  ``torch.load(weights_only=True)``);
- ``metrics.csv``: round, group, metric, value for every evaluation;
- ``metrics.json``: the selected model's summaries per group (train, holdout, val), how it was
  selected, parameter counts, floats communicated per client and round, and ``communication``: the
  floats down / up per client and round, bytes per round (float32) and total bytes, summed from the
  tensors the algorithm really exchanged (``pfl_cli.fl.communication``), with a per-message breakdown;
- ``clients.csv``: client_id, role (0 train, 1 holdout, as in the partition's stats.csv), n_train
  (fit + validation samples), n_test, accuracy, accuracy_lm (label-masked) of the selected model;
- ``train_samples.npz``: ``sample``, the sorted dataset indices of the train clients' train samples,
  and ``digest`` (uint8, 16 bytes a sample), their content digests (what predict and attack compare
  scored samples with, :mod:`pfl_cli.overlap`; not under ``--dp``);
- ``checkpoint/state.pt``: the last checkpoint of the run (absent for ``local``, which has no rounds).

While training, the latest checkpoint lives in ``.<out>.checkpoint/state.pt`` beside ``--out``
(:mod:`pfl_cli.fl.checkpoint`: sealed, fingerprinted, written atomically by rank 0); it moves into
the artifact when the run completes.
"""

from __future__ import annotations

import math
import shutil
from pathlib import Path
from typing import Any

import numpy as np

from pfl_cli.cli import interrupt
from pfl_cli.cli.common import load_partition_dataset
from pfl_cli.cli.output import Reporter
from pfl_cli.errors import InputError, RunError
from pfl_cli.fl.checkpoint import CHECKPOINT_FILE, Checkpointer, fingerprint, torch_bytes
METRIC_NAMES = ("mean_accuracy", "pooled_accuracy", "mean_accuracy_lm", "pooled_accuracy_lm")
# clients.csv (and nonprivate-clients.csv, predict's clients.csv): the first six columns as before, then the
# per-client balanced accuracy and macro-F1 and the global model's accuracy (pfl_cli.fl.evaluate); empty: undefined.
CLIENT_COLUMNS = ("client_id", "role", "n_train", "n_test", "accuracy", "accuracy_lm", "balanced_accuracy",
                  "macro_f1", "global_accuracy")


# ---------------------------------------------------------------------------- shared with predict
def clean(obj: Any) -> Any:
    """``obj`` with non-finite floats as None (JSON has no NaN) and numpy scalars as Python ones."""
    if isinstance(obj, dict):
        return {k: clean(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [clean(v) for v in obj]
    if isinstance(obj, np.generic):
        obj = obj.item()
    if isinstance(obj, float) and not math.isfinite(obj):
        return None
    return obj


def csv_float(value: float) -> Any:
    return "" if not math.isfinite(value) else float(value)


def accuracy_table(title: str, groups: dict[str, dict], label_mask: bool, caption_extra: str = ""):
    """Mean and pooled accuracy, plain and label-masked, per group; the headline pair starred."""
    from rich.table import Table

    star = lambda masked: "*" if masked == label_mask else ""  # noqa: E731
    table = Table(title=title, title_justify="left",
                  caption=f"test accuracy; lm: label masking (classes absent from a client's train data never "
                  f"predicted); * headline (--{'' if label_mask else 'no-'}label-mask){caption_extra}",
                  caption_justify="left")
    table.add_column("group", style="bold")
    table.add_column("clients", justify="right")
    table.add_column("samples", justify="right")
    table.add_column(f"mean{star(False)}", justify="right")
    table.add_column(f"pooled{star(False)}", justify="right")
    table.add_column(f"mean lm{star(True)}", justify="right")
    table.add_column(f"pooled lm{star(True)}", justify="right")

    def pct(v):
        return "-" if v is None or not math.isfinite(v) else f"{100 * v:.2f}%"

    for name, s in groups.items():
        table.add_row(name, str(s["num_clients"]), str(s["num_samples"]), *(pct(s[m]) for m in METRIC_NAMES))
    return table


# ---------------------------------------------------------------------------- the command
def run_train(cfg, *, partition: Path, out: Path, resume: bool, force: bool, report: Reporter,
              plot: bool = False, logs: tuple[str, ...] = (), log_dir: Path | None = None, study=(None, None),
              log_as: tuple[str | None, str | None] = (None, None)) -> None:
    """``study``: ``(ledger, note)`` of the private study whose best.yaml is the config
    (:func:`pfl_cli.privacy.study.study_prior`): its ledger composes into privacy.json. ``log_as``:
    ``(run name, group)`` of the W&B / MLflow run (default: ``--out``'s name, no group)."""
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
            _run_train(cfg, device, partition=partition, out=out, resume=resume, force=force, report=report,
                       plot=plot, logs=logs, log_dir=log_dir, study=study, log_as=log_as)
        except BaseException:
            distributed.stop()
            raise
        distributed.stop(finished=True)
        return None
    # the device (and torch) once the run is known not to be up to date
    return _run_train(cfg, None, partition=partition, out=out, resume=resume, force=force, report=report,
                      plot=plot, logs=logs, log_dir=log_dir, study=study, log_as=log_as)


def _run_train(cfg, device, *, partition: Path, out: Path, resume: bool, force: bool, report: Reporter,
               plot: bool = False, logs: tuple[str, ...] = (), log_dir: Path | None = None,
               study=(None, None), log_as: tuple[str | None, str | None] = (None, None)) -> None:
    from pfl_cli.artifacts import ArtifactWriter
    from pfl_cli.config import config_to_dict
    from pfl_cli.fl.api import train_federated
    from pfl_cli.fl.distributed import world
    from pfl_cli.fl.loop import TrainingDiverged
    from pfl_cli.fl.store import ROLE_TRAIN
    from pfl_cli.readers import check_checkpoint_location

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
        _warn_clamped(cfg, part, n_train, report)
        notice = getattr(getattr(cfg, "algorithm_class", None), "partition_notice", None)  # FLowDUP's size notice
        if notice is not None and (line := notice(part)):
            report.warn(line)
    writer = ArtifactWriter(out, stage="train", config=config, seed=cfg.seed, inputs=inputs, force=force, dp=private)
    if writer.up_to_date():
        report.note(f"{out} is up to date (same config and inputs); nothing to do."
                    + (f" `pflx show --plot {out}` draws its curves." if plot else ""))
        report.result({"out": str(out), "up_to_date": True})
        return
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
        report.warn(f"--force: discarding the checkpoint an earlier run left at {ck_path}; starting over.")
        if writes:  # gone now, so that an interrupt before this run's first checkpoint cannot leave it behind
            ck_path.unlink(missing_ok=True)
    ck.remove_torn_writes()
    state = _resume(ck, cfg, report) if resume else None

    def on_checkpoint(snapshot: dict) -> None:
        ck.write(snapshot)
        interrupt.kept(_kept_note(int(snapshot["round"]), ck_path, private))

    federated = cfg.algorithm_class.federated
    total = cfg.rounds if federated else 0
    start = int(state["round"]) if state is not None else 0
    if start:
        interrupt.kept(_kept_note(start, ck_path, private))
    elif federated:
        # --dp checkpoints after every round (fl.loop: no round is released twice)
        when = "after every round" if private else f"every {cfg.checkpoint_every or cfg.eval_every} rounds"
        interrupt.kept(f"interrupted before the first checkpoint (one comes {when}); nothing was kept; run the "
                       "command again to start over.")
    from pfl_cli.cli.loggers import RunLoggers, round_values

    loggers = RunLoggers(logs if writes else (), log_dir or out, private=private, resume=state is not None,
                         name=log_as[0] or out.name, group=log_as[1], params=config)  # W&B / MLflow
    with report.progress("train", total or None, unit="round") as bar:
        seen = [start]
        if start:
            bar.advance(start, status="resumed")

        def on_progress(done: int, _total: int, status: dict) -> None:
            # Under --dp the running loss and accuracies are private diagnostics: not shown, not logged.
            bar.advance(done - seen[0], status="" if private else _status(status))
            seen[0] = done
            loggers.log(done, round_values(status, done % cfg.eval_every == 0 or done == _total))

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
        return
    if private:
        with writer:
            released = write_dp_artifact(writer, cfg, config, run, part, metrics, prior=study[0])
            writer.after_swap(lambda: shutil.rmtree(ck_dir, ignore_errors=True))
        _print_dp_summary(report, out, {**metrics, "dp": released}, cfg.write_nonprivate)
        if study[1]:
            report.note(study[1])
        return
    if study[1]:
        report.note(study[1])
    with writer:
        write_train_files(writer, config, run, part, metrics, record=training_record(part, ds, info["spec"]))
        if plot:  # drawn from the CSV just written, exactly as `pflx show --plot` redraws it
            from pfl_cli.cli.figures import training_curves

            training_curves(writer.path("metrics.csv"), writer.path("metrics.json"), writer.path("curves.png"))
        if (ck.written or state is not None) and ck_path.is_file():  # this run's checkpoint, not a stale one
            shutil.copyfile(ck_path, writer.path(f"checkpoint/{CHECKPOINT_FILE}"))
        writer.after_swap(lambda: shutil.rmtree(ck_dir, ignore_errors=True))
    _print_summary(report, out, metrics)


def write_train_files(writer, config: dict, run, part, metrics: dict, record=None) -> None:
    """The files of a train artifact without DP: config.yaml, model.pt, metrics.csv, metrics.json, clients.csv,
    train_samples.npz.

    Also what the Flower ServerApp writes (``pfl_cli.interop.flower_app.server``).
    ``train_samples.npz`` (``sample``: the sorted dataset indices of the train clients' train
    samples; ``digest``: their content digests, :mod:`pfl_cli.data.digest`) lets predict and attack
    refuse any scored sample with the content of one the model trained on, on any partition, also
    once the partition is gone (:mod:`pfl_cli.overlap`). ``record`` is ``(sample, digest)`` from
    :func:`pfl_cli.overlap.training_record`; without it (the Flower server reads no samples) the
    indices alone are written, and predict digests them from the dataset. A DP artifact holds
    neither (which records trained is what DP protects).
    """
    import yaml

    from pfl_cli.fl.store import ROLE_TRAIN

    writer.save_text("config.yaml", yaml.safe_dump(_portable(config, run, writer), sort_keys=False))
    writer.path("model.pt").write_bytes(torch_bytes(portable_model(run.model)))
    writer.save_csv("metrics.csv", ["round", "group", "metric", "value"], run.outcome.history)
    writer.save_json("metrics.json", metrics)
    writer.save_csv("clients.csv", CLIENT_COLUMNS,
                    client_rows(part, [run.outcome.best.groups[g] for g in ("train", "holdout")
                                       if g in run.outcome.best.groups]))
    if record is None:
        trained = np.asarray(part.role)[part.train_owner()] == ROLE_TRAIN
        writer.save_npz("train_samples.npz", sample=np.unique(np.asarray(part.train_indices, np.int64)[trained]))
    else:
        writer.save_npz("train_samples.npz", sample=record[0], digest=record[1])


def _portable(config: dict, run, writer) -> dict:
    """config.yaml's keys, path-valued ones relative to the artifact (pfl_cli.readers.files)."""
    from pfl_cli.readers.files import portable_config

    return portable_config(config, type(run.algorithm.cfg), writer.out)


def portable_model(model: dict) -> dict:
    """The model payload naming a backbone's weights file by name, not by where it was (the manifest's ``file``
    input finds it again: pfl_cli.readers.files); the bytes of model.pt then do not depend on the directory."""
    arch = model.get("arch")

    def backbone(s) -> bool:  # the specs whose file a manifest input finds again (SPEC_FIELDS); a model kind's
        return isinstance(s, dict) and s.get("arch") == "backbone" and bool(s.get("weights"))  # keeps its path

    if not isinstance(arch, dict) or not any(backbone(s) for s in arch.values()):
        return model
    return {**model, "arch": {k: ({**s, "weights": Path(str(s["weights"])).name} if backbone(s) else s)
                              for k, s in arch.items()}}


def write_dp_artifact(writer, cfg, config: dict, run, part, metrics: dict, prior=None) -> dict:
    """The train artifact under --dp: only what the ledger covers, diagnostics as nonprivate* on request.
    Returns metrics.json's ``dp`` block (with ``prior``: ``epsilon_total``, privacy.json's epsilon).

    - ``model.pt``: the last round's model, the output of the DP mechanism (no selection by
      private validation accuracy; inputs are not standardized with private statistics);
    - ``privacy.json``: the ledger (after ``prior``'s events: the private study that chose the config, on
      the same data, whose epsilon composes with this run's); ``config.yaml``: the public config;
    - ``metrics.json``: public facts only (algorithm, rounds, sizes, the mechanism's calibration);
    - with ``--write-nonprivate``: ``nonprivate.json`` (accuracies of the model on the private
      clients), ``nonprivate-metrics.csv`` (every evaluation), ``nonprivate-clients.csv``.

    The checkpoint is not part of a DP artifact; while the run lasts it lives beside --out, mode 0600,
    holding released state and client-held state only (:func:`pfl_cli.fl.dp.private_snapshot`).
    """
    import yaml

    from pfl_cli.artifacts import MECHANISM, NONPRIVATE, POST_PROCESSING

    writer.save_text("config.yaml", yaml.safe_dump(_portable(config, run, writer), sort_keys=False),
                     release=POST_PROCESSING)
    writer.path("model.pt", release=MECHANISM).write_bytes(torch_bytes(portable_model(run.model)))
    from pfl_cli.privacy.randomness import statement

    ledger = run.dp.ledger() if prior is None else prior.compose(run.dp.ledger())
    doc = ledger.to_dict(accountant=cfg.dp_accountant)
    writer.save_json("privacy.json", {**doc, **statement(cfg.dp_noise)}, release=POST_PROCESSING)
    # Exact counts of the private data (clients without labels; the realized Poisson cohorts behind the
    # communication totals) are diagnostics, not releases.
    private_keys = ("train", "holdout", "val", "dataset", "best_round", "communication", "num_unlabeled_clients")
    public = {k: v for k, v in metrics.items() if k not in private_keys}
    public["dataset"] = {"spec": metrics["dataset"]["spec"], "num_classes": metrics["dataset"]["num_classes"]}
    public["dp"] = {**clean(run.dp.info()), "noise": cfg.dp_noise}
    if prior is not None:  # the guarantee of the model is the total, not this run's share of it
        public["dp"]["epsilon_total"] = doc["epsilon"]
    writer.save_json("metrics.json", public, release=POST_PROCESSING)
    if cfg.write_nonprivate:
        outcome = run.outcome
        writer.save_json("nonprivate.json", {
            "note": "accuracies measured on the private clients: NOT covered by the DP guarantee of privacy.json",
            **{g: metrics[g] for g in ("train", "holdout", "val", "communication", "num_unlabeled_clients")
               if g in metrics}}, release=NONPRIVATE)
        writer.save_csv("nonprivate-metrics.csv", ["round", "group", "metric", "value"], outcome.history,
                        release=NONPRIVATE)
        writer.save_csv("nonprivate-clients.csv", CLIENT_COLUMNS,
                        client_rows(part, [outcome.best.groups[g] for g in ("train", "holdout")
                                           if g in outcome.best.groups]), release=NONPRIVATE)
    return public["dp"]


def _print_dp_summary(report: Reporter, out: Path, m: dict, nonprivate: bool) -> None:
    from rich.table import Table

    dp = m["dp"]
    table = Table(title=f"train --dp -> {out}: {m['algorithm']}, model of the last round ({m['rounds']}), "
                  f"{m['device']}", title_justify="left")
    total = "epsilon_total" in dp  # composed with the private study that chose the config
    for col in ("unit", "epsilon", *(["with study"] if total else []), "delta", "clip", "noise multiplier",
                "sampling rate", "accountant"):
        table.add_column(col, justify="right")
    table.add_row(dp["unit"], f"{dp['epsilon']:g}", *([f"{dp['epsilon_total']:.4g}"] if total else []),
                  f"{dp['delta']:g}", f"{dp['clip']:g}", f"{dp['noise_multiplier']:.4g}",
                  f"{dp.get('sampling_rate', float('nan')):.4g}", dp["accountant"])
    data = {"out": str(out), "up_to_date": False, "dp": dp,
            **{k: m[k] for k in ("algorithm", "rounds", "selection", "device")}}
    from pfl_cli.privacy.randomness import stamp

    table.caption, table.caption_justify = stamp(dp["noise"]), "left"
    if "surviving_cohort_assumption" in dp:  # distributed DP (pfl_cli.privacy.distributed)
        table.caption += f"\n{dp['mechanism']}: accounted for {dp['surviving_cohort_assumption']}"
    # Printing is releasing too: accuracies on the private clients stay in the nonprivate* files.
    if nonprivate:
        data["nonprivate_files"] = ["nonprivate.json", "nonprivate-metrics.csv", "nonprivate-clients.csv"]
        report.note(f"accuracies on the private clients (not covered by DP): {out}/nonprivate.json")
    report.result(data, table)


def _warn_clamped(cfg, part, n_train: int, report: Reporter) -> None:
    """Sizes above what the partition holds have an obvious meaning (all of them): used so, with a warning."""
    if cfg.clients_per_round is not None and cfg.clients_per_round > n_train:
        report.warn(f"--clients-per-round {cfg.clients_per_round} is more than the {n_train} train clients; every "
                    f"round uses all {n_train}.")
    if cfg.algorithm == "knnper":
        largest = int(np.max(np.diff(part.train_offsets))) if part.num_clients else 0
        if cfg.knn_k > largest:
            report.warn(f"knn_k {cfg.knn_k} is more than the largest client's {largest} train samples; each client "
                        "uses all the samples of its datastore as neighbours.")


def _resume(ck: Checkpointer, cfg, report: Reporter) -> dict | None:
    state = ck.resume(cfg)
    if state is None:
        report.warn(f"--resume: no checkpoint at {ck.path}; starting from scratch.")
    else:
        report.note(f"resuming from round {int(state['round'])} (checkpoint {ck.path}).")
    return state


def _kept_note(round_: int, ck_path: Path, private: bool = False) -> str:
    if private:
        from pfl_cli.fl.dp import CHECKPOINT_HOLDS

        return (f"interrupted; nothing was written to --out, and the checkpoint of round {round_} is kept at "
                f"{ck_path} (mode 0600; it holds {CHECKPOINT_HOLDS}): {interrupt.how_to_continue()} to "
                "continue from it.")
    return (f"interrupted; nothing was written to --out, and the checkpoint of round {round_} is kept at {ck_path}: "
            f"{interrupt.how_to_continue()} to continue from it.")


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


def train_metrics(cfg, run, info: dict, device) -> dict:
    from pfl_cli.models import num_parameters

    outcome, arch = run.outcome, run.model["arch"]
    params = {name: int(num_parameters(spec)) for name, spec in arch.items() if "kind" in spec}
    if "subspace" in arch:  # flowdup, ld-fedavg: theta = theta_0 + P v, v in R^k (k floats, not a network)
        params["subspace_dim"] = int(arch["subspace"]["dim"])
    floats = cfg.algorithm_class.floats_per_client_round(arch)
    metrics: dict[str, Any] = {
        "algorithm": cfg.algorithm,
        "label_mask": bool(cfg.label_mask),
        "headline_metric": "mean_accuracy_lm" if cfg.label_mask else "mean_accuracy",
        "selection": outcome.selection,
        "best_round": int(outcome.best.round),
        "rounds": int(outcome.last_round),
        "device": str(device),
        "dataset": {"spec": info["spec"], "labels_sha256": info.get("labels_sha256"),
                    "num_classes": int(info["num_classes"])},
    }
    summaries = outcome.best.summaries()
    for group in ("train", "holdout", "val"):
        if group in summaries:
            metrics[group] = summaries[group]
    # Whether the groups' global_accuracy is scored: the method holds one model for every client
    # (pfl_cli.algorithms.base.Algorithm.global_model); a property of the method, public under --dp.
    metrics["global_model"] = has_global_model(run.algorithm)
    metrics["parameters"] = params
    metrics["floats_per_client_round"] = floats
    store = run.store
    metrics["num_unlabeled_clients"] = int(np.sum(~store.labeled))
    metrics["hidden_label_oracle"] = bool(cfg.evaluate_hidden_labels)
    metrics["communication"] = run.algorithm.traffic.summary()
    if "conditions" in outcome.extra:  # federation conditions (pfl_cli.fl.conditions): public settings, the clock
        metrics["conditions"] = outcome.extra["conditions"]
    if run.algorithm.byzantine is not None:  # Byzantine clients (issue 48): honest clients, backdoor success
        metrics["byzantine"] = run.algorithm.byzantine.metrics(outcome, outcome.history)
    return clean(metrics)


def has_global_model(alg) -> bool:
    from pfl_cli.fl.evaluate import global_model_of

    return not alg.personalized or global_model_of(alg) is not None


def client_rows(part, evals) -> list[list]:
    """clients.csv rows (:data:`CLIENT_COLUMNS`), in partition order."""
    rows = []
    for ev in evals:
        acc, acc_lm = ev.accuracy(False), ev.accuracy(True)
        more = ev.client_metrics()
        rows += [(int(c), [int(part.client_id[c]), int(part.role[c]), int(part.train_sizes[c]),
                           int(part.test_sizes[c]), csv_float(acc[i]), csv_float(acc_lm[i]),
                           *(csv_float(more[m][i]) for m in CLIENT_COLUMNS[6:])])
                 for i, c in enumerate(ev.clients)]
    return [row for _, row in sorted(rows, key=lambda r: r[0])]


def _print_summary(report: Reporter, out: Path, m: dict) -> None:
    groups = {g: m[g] for g in ("train", "holdout", "val") if g in m}
    if m["rounds"] == 0:  # a non-federated algorithm (local): no rounds, nothing selected
        which = "no federated rounds (each client trains alone)"
    else:
        which = (f"model of round {m['best_round']} of {m['rounds']} "
                 f"(selected by {'validation accuracy' if m['selection'] == 'val' else 'last evaluation'})")
    title = f"train -> {out}: {m['algorithm']}, {which}, {m['device']}"
    table = accuracy_table(title, groups, m["label_mask"])
    data = {"out": str(out), "up_to_date": False,
            **{k: m[k] for k in ("algorithm", "best_round", "rounds", "selection", "label_mask", "headline_metric",
                                 "device")},
            **groups}
    report.result(data, table)
    from pfl_cli.cli.chance import near_chance

    warning = near_chance({g: m[g].get("mean_accuracy") for g in ("train", "holdout") if g in m},
                          m["dataset"]["num_classes"], m["algorithm"])
    if warning:  # issue 33: a run whose settings did not learn says so (never under --dp: nothing released)
        report.warn(warning)


# ---------------------------------------------------------------------------- --seeds: one stack
class StackMember:
    """One run of a stack: its config, its artifact, the private study whose ledger composes into it
    (``study``, as :func:`run_train` takes it), its tracker run's name and group and its loggers' folder."""

    def __init__(self, cfg, out: Path, *, study=(None, None), log_as: tuple[str | None, str | None] = (None, None),
                 log_dir: Path | None = None) -> None:
        self.cfg, self.out, self.study, self.log_as, self.log_dir = cfg, Path(out), study, log_as, log_dir


def run_train_seeds(cfg, seeds: list[int], *, partition: Path, out: Path, resume: bool, force: bool,
                    report: Reporter, plot: bool = False, logs: tuple[str, ...] = (), log_dir: Path | None = None,
                    study=(None, None)) -> None:
    """``pflx train --seeds S1,S2,... --out DIR``: the runs of ``cfg`` with those seeds trained stacked in this
    process (:mod:`pfl_cli.fl.stack`), each written to ``DIR/seed-<s>`` exactly as ``train --seed s --out
    DIR/seed-<s>`` writes it (its manifest adds ``stacked``); a finished run's artifact is left as it is. ``--log``:
    each seed its own loggers' folder (``LOG_DIR/seed-<s>``; default ``DIR/seed-<s>.logs``, where the separate
    run's default is) and its own W&B / MLflow run ``seed-<s>``."""
    import dataclasses

    from pfl_cli.cli.loggers import default_log_dir

    members = []
    for s in seeds:
        o = out / f"seed-{s}"
        members.append(StackMember(dataclasses.replace(cfg, seed=s), o, study=study,
                                   log_dir=default_log_dir(o) if log_dir is None else log_dir / f"seed-{s}"))
    done = train_stack(members, partition=partition, resume=resume, force=force, report=report, plot=plot, logs=logs)
    if not done:
        report.result({"out": str(out), "runs": [str(m.out) for m in members], "up_to_date": True})


def train_stack(members: list[StackMember], *, partition: Path, resume: bool | None, force: bool, report: Reporter,
                plot: bool = False, logs: tuple[str, ...] = (), label: str = "train") -> list[Path]:
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
    from pfl_cli.cli.loggers import RunLoggers, round_values
    from pfl_cli.overlap import partition_input, training_record
    from pfl_cli.config import config_to_dict
    from pfl_cli.fl.api import validate_train_config
    from pfl_cli.fl.device import check_device, resolve_device
    from pfl_cli.fl.loop import TrainingDiverged
    from pfl_cli.fl.stack import check_stackable, train_stacked
    from pfl_cli.readers import check_checkpoint_location

    from pfl_cli import registry

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
            report.note(f"{m.out} is up to date (same config and inputs); nothing to do.")
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
            states[i] = _continue(ck, c, m.out, force, report)
        else:
            if not resume and ck.path.is_file():
                if not force:
                    raise InputError(f"--out {m.out}: an earlier run was interrupted and left its checkpoint at "
                                     f"{ck.path}; pass --resume to continue from it, or --force to start over and "
                                     "discard it.")
                ck.path.unlink(missing_ok=True)
            states[i] = _resume(ck, c, report) if resume else None
        ck.remove_torn_writes()
        writers[i], cks[i] = (writer, config), ck
    if not todo:
        return []
    device = resolve_device(cfgs[0].device)  # torch: only once some run is not up to date
    if any(cfgs[i].dp_epsilon is None for i in todo):  # under --dp the clients' number and sizes are private
        _warn_clamped(cfgs[todo[0]], part, n_train, report)
    interrupt.kept("interrupted; nothing more was written, and each unfinished run's last checkpoint is kept beside "
                   "its artifact: run the same command again (train: with --resume) to continue from them.")
    import threading
    import time

    lock = threading.Lock()
    loggers = {i: RunLoggers(logs, members[i].log_dir or members[i].out, private=cfgs[i].dp_epsilon is not None,
                             resume=states[i] is not None, name=members[i].log_as[0] or members[i].out.name,
                             group=members[i].log_as[1], params=writers[i][1]) for i in todo}
    try:
        with report.progress(label, sum(cfgs[i].rounds for i in todo), unit="round") as bar:
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
                    loggers[i].log(done, round_values(status, done % cfgs[i].eval_every == 0 or done == total))

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
            _print_dp_summary(report, m.out, {**metrics, "dp": released}, c.write_nonprivate)
            if m.study[1]:
                report.note(m.study[1])
            trained.append(m.out)
            continue
        if m.study[1]:
            report.note(m.study[1])
        if record is None:
            record = training_record(part, ds, info["spec"])
        with writer:
            write_train_files(writer, config, run, part, metrics, record=record)
            if plot:
                from pfl_cli.cli.figures import training_curves

                training_curves(writer.path("metrics.csv"), writer.path("metrics.json"), writer.path("curves.png"))
            if (ck.written or states[i] is not None) and ck.path.is_file():  # this run's checkpoint
                shutil.copyfile(ck.path, writer.path(f"checkpoint/{CHECKPOINT_FILE}"))
            writer.after_swap(lambda d=ck.dir: shutil.rmtree(d, ignore_errors=True))
        _print_summary(report, m.out, metrics)
        trained.append(m.out)
    if failed:
        raise RunError("; ".join(failed))
    return trained


def _continue(ck: Checkpointer, cfg, out: Path, force: bool, report: Reporter) -> dict | None:
    """Without --resume / --no-resume (``compare --spec``): this run's checkpoint, left by a kill, is continued;
    one of another config or other inputs is refused, or discarded with ``force``."""
    from pfl_cli.fl.checkpoint import read_checkpoint

    if not ck.path.is_file():
        return None
    if read_checkpoint(ck.path).get("fingerprint") != ck.fp:
        if not force:
            raise InputError(f"--out {out}: an earlier run of another config or other inputs left its checkpoint at "
                             f"{ck.path}; pass --force to discard it and start over, or delete {ck.dir}.")
        report.warn(f"--force: discarding the checkpoint another config left at {ck.path}; starting over.")
        ck.path.unlink(missing_ok=True)
        return None
    return ck.resume(cfg)


def with_model_files(config: dict, cfg) -> dict:
    """``config`` and, for a model kind's net, the sha256 of the files it is built from (a factory's module, a
    weights file): a checkpoint resumes only with the same files (pfl_cli.models.kinds.file_digests)."""
    from pfl_cli.fl.config import model_kind

    if model_kind(getattr(cfg, "model_arch", "")) is None or getattr(cfg, "backbone", ""):
        return config
    from pfl_cli.models.kinds import file_digests

    return {**config, "model_files": file_digests(cfg.model_arch, cfg.model_weights)}
