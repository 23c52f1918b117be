"""The body of `pflx train`: read inputs, train with checkpoints, write the artifact, print.

The ``train`` artifact (DESIGN.md section 3):

- ``config.yaml``: the resolved TrainConfig;
- ``model.pt``: the model payload of :func:`pfl_cli.fl.api.model_payload` (plain dicts and tensors,
  ``torch.load(weights_only=True)``);
- ``metrics.csv``: round, group, metric, value for every evaluation;
- ``metrics.json``: the selected model's summaries per group (train, holdout, val), how it was
  selected, parameter counts and floats communicated per client and round;
- ``clients.csv``: client_id, role (0 train, 1 holdout, as in the partition's stats.csv), n_train
  (fit + validation samples), n_test, accuracy, accuracy_lm (label-masked) of the selected model;
- ``checkpoint/state.pt``: the last checkpoint of the run (absent for ``local``, which has no rounds).

While training, the latest checkpoint lives in ``.<out>.checkpoint/state.pt`` beside ``--out``,
replaced atomically, with a fingerprint of the resolved config and the inputs; ``--resume`` continues
from it only when the fingerprint matches. It moves into the artifact when the run completes.
"""

from __future__ import annotations

import hashlib
import io
import math
import os
import shutil
import sys
from pathlib import Path
from typing import Any

import numpy as np

from pfl_cli.cli.common import load_partition_dataset
from pfl_cli.cli.output import Reporter
from pfl_cli.errors import ArtifactError, ConfigError, InputError, RunError

CHECKPOINT_FILE = "state.pt"
METRIC_NAMES = ("mean_accuracy", "pooled_accuracy", "mean_accuracy_lm", "pooled_accuracy_lm")


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


def _canonical(obj: Any) -> Any:
    """A copy whose pickle depends on values only: fresh containers, interned strings.

    Pickle memoizes by object identity, so equal values that are one object in one run (a
    literal key) and two objects in another (keys read back from a checkpoint) would give
    different bytes.
    """
    if isinstance(obj, dict):
        return {_canonical(k): _canonical(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_canonical(v) for v in obj]
    if isinstance(obj, tuple):
        return tuple([_canonical(v) for v in obj])
    if type(obj) is str:
        return sys.intern(obj)
    return obj


def torch_bytes(obj: Any) -> bytes:
    """``torch.save`` into memory, byte-identical for equal values (whatever file name or origin)."""
    import torch

    buf = io.BytesIO()
    torch.save(_canonical(obj), buf)
    return buf.getvalue()


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


# ---------------------------------------------------------------------------- checkpoints
def checkpoint_dir(out: Path) -> Path:
    """Where a running ``train --out OUT`` keeps its latest checkpoint: ``.OUT.checkpoint`` beside OUT."""
    out = Path(out)
    return out.parent / f".{out.name}.checkpoint"


def fingerprint(config: dict, inputs: list[dict]) -> str:
    """What a checkpoint must match to be resumed: the resolved config and the input hashes."""
    from pfl_cli.artifacts import canonical_json

    doc = {"config": config, "inputs": [[i["stage"], i["sha256"]] for i in inputs]}
    return hashlib.sha256(canonical_json(doc).encode()).hexdigest()


def _write_atomic(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    with open(tmp, "wb") as fh:
        fh.write(data)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)  # a kill leaves the previous checkpoint or this one, never a torn file


def read_checkpoint(path: Path) -> dict:
    import torch

    try:
        state = torch.load(path, weights_only=True, map_location="cpu")
    except Exception as err:  # noqa: BLE001 - any unreadable file gets the same advice
        raise ArtifactError(f"--resume: checkpoint {path} is unreadable ({type(err).__name__}); delete "
                            f"{path.parent} and run without --resume.") from None
    if not isinstance(state, dict) or "fingerprint" not in state or "round" not in state:
        raise ArtifactError(f"--resume: {path} is not a pflx train checkpoint; delete {path.parent} and run "
                            "without --resume.")
    return state


def _load_resume(path: Path, fp: str, report: Reporter) -> dict | None:
    if not path.is_file():
        report.warn(f"--resume: no checkpoint at {path}; starting from scratch.")
        return None
    state = read_checkpoint(path)
    if state["fingerprint"] != fp:
        raise ConfigError(f"--resume: the checkpoint {path} belongs to a different config or different inputs "
                          f"(its fingerprint differs from this command's); resume only with the exact options "
                          f"and inputs of the interrupted run, or drop --resume (or delete {path.parent}) to "
                          "start over.")
    report.note(f"resuming from round {int(state['round'])} (checkpoint {path}).")
    return {k: v for k, v in state.items() if k != "fingerprint"}


# ---------------------------------------------------------------------------- the command
def run_train(cfg, *, partition: Path, out: Path, resume: bool, force: bool, report: Reporter) -> None:
    import torch
    import yaml

    from pfl_cli.algorithms import REGISTRY
    from pfl_cli.artifacts import ArtifactWriter
    from pfl_cli.config import config_to_dict
    from pfl_cli.fl.api import train_federated, validate_train_config
    from pfl_cli.fl.device import resolve_device
    from pfl_cli.fl.loop import TrainingDiverged
    from pfl_cli.fl.store import ROLE_TRAIN

    validate_train_config(cfg)
    device = resolve_device(cfg.device)  # --device cuda without a GPU fails here, before any work
    ArtifactWriter(out, stage="train", config={}, seed=cfg.seed, force=force)  # --out problems first
    part, info, part_art, ds = load_partition_dataset(partition)
    n_train = int(np.sum(part.role == ROLE_TRAIN))
    if n_train == 0:
        raise InputError(f"--partition {partition}: training needs train clients (role 0); all "
                         f"{part.num_clients} clients are holdout clients. Re-partition with fewer "
                         "--holdout-clients.")
    config = config_to_dict(cfg)
    inputs = [part_art.input_ref(), ds.input_ref()]
    private = cfg.dp_epsilon is not None
    writer = ArtifactWriter(out, stage="train", config=config, seed=cfg.seed, inputs=inputs, force=force, dp=private)
    if writer.up_to_date():
        report.note(f"{out} is up to date (same config and inputs); nothing to do.")
        report.result({"out": str(out), "up_to_date": True})
        return

    ck_dir = checkpoint_dir(out)
    ck_path = ck_dir / CHECKPOINT_FILE
    fp = fingerprint(config, inputs)
    state = _load_resume(ck_path, fp, report) if resume else None
    if state is None and ck_path.is_file():
        report.warn(f"replacing the checkpoint an earlier run left at {ck_path} (pass --resume to continue it).")
    written: list[int] = []

    def on_checkpoint(ck: dict) -> None:
        _write_atomic(ck_path, torch_bytes({**ck, "fingerprint": fp}))
        written.append(int(ck["round"]))

    federated = REGISTRY[cfg.algorithm].federated
    total = cfg.rounds if federated else 0
    start = int(state["round"]) if state is not None else 0
    with report.progress("train", total or None) as bar:
        seen = [start]
        if start:
            bar.advance(start, status="resumed")

        def on_progress(done: int, _total: int, status: dict) -> None:
            # Under --dp the running loss and accuracies are private diagnostics: not shown.
            bar.advance(done - seen[0], status="" if private else _status(status))
            seen[0] = done

        try:
            run = train_federated(ds.x, ds.y, ds.num_classes, part, cfg, device=device, resume=state,
                                  on_checkpoint=on_checkpoint, on_progress=on_progress)
        except TrainingDiverged as err:
            raise RunError(_diverged_message(err, cfg, ck_path, out)) from None

    outcome, model = run.outcome, run.model
    metrics = _metrics(cfg, run, info, device)
    if private:
        with writer:
            write_dp_artifact(writer, cfg, config, run, part, metrics)
        shutil.rmtree(ck_dir, ignore_errors=True)
        _print_dp_summary(report, out, {**metrics, "dp": clean(run.dp.info())}, cfg.write_nonprivate)
        return
    with writer:
        writer.save_text("config.yaml", yaml.safe_dump(config, sort_keys=False))
        writer.path("model.pt").write_bytes(torch_bytes(model))
        writer.save_csv("metrics.csv", ["round", "group", "metric", "value"], outcome.history)
        writer.save_json("metrics.json", metrics)
        writer.save_csv("clients.csv", ["client_id", "role", "n_train", "n_test", "accuracy", "accuracy_lm"],
                        client_rows(part, [run.outcome.best.groups[g] for g in ("train", "holdout")
                                           if g in run.outcome.best.groups]))
        if (written or state is not None) and ck_path.is_file():  # this run's checkpoint, not a stale one
            shutil.copyfile(ck_path, writer.path(f"checkpoint/{CHECKPOINT_FILE}"))
    shutil.rmtree(ck_dir, ignore_errors=True)
    _print_summary(report, out, metrics)


def write_dp_artifact(writer, cfg, config: dict, run, part, metrics: dict) -> None:
    """The train artifact under --dp: only what the ledger covers, diagnostics as nonprivate* on request.

    - ``model.pt``: the last round's model, the output of the DP mechanism (no selection by
      private validation accuracy; inputs are not standardized with private statistics);
    - ``privacy.json``: the ledger; ``config.yaml``: the public config;
    - ``metrics.json``: public facts only (algorithm, rounds, sizes, the mechanism's calibration);
    - with ``--write-nonprivate``: ``nonprivate.json`` (accuracies of the model on the private
      clients), ``nonprivate-metrics.csv`` (every evaluation), ``nonprivate-clients.csv``.

    The checkpoint is not part of a DP artifact (it holds the evaluation history).
    """
    import yaml

    from pfl_cli.artifacts import MECHANISM, NONPRIVATE, POST_PROCESSING

    writer.save_text("config.yaml", yaml.safe_dump(config, sort_keys=False), release=POST_PROCESSING)
    writer.path("model.pt", release=MECHANISM).write_bytes(torch_bytes(run.model))
    writer.save_json("privacy.json", run.dp.ledger().to_dict(accountant=cfg.dp_accountant), release=POST_PROCESSING)
    public = {k: v for k, v in metrics.items() if k not in ("train", "holdout", "val", "dataset", "best_round")}
    public["dataset"] = {"spec": metrics["dataset"]["spec"], "num_classes": metrics["dataset"]["num_classes"]}
    public["dp"] = clean(run.dp.info())
    writer.save_json("metrics.json", public, release=POST_PROCESSING)
    if cfg.write_nonprivate:
        outcome = run.outcome
        writer.save_json("nonprivate.json", {
            "note": "accuracies measured on the private clients: NOT covered by the DP guarantee of privacy.json",
            **{g: metrics[g] for g in ("train", "holdout", "val") if g in metrics}}, release=NONPRIVATE)
        writer.save_csv("nonprivate-metrics.csv", ["round", "group", "metric", "value"], outcome.history,
                        release=NONPRIVATE)
        writer.save_csv("nonprivate-clients.csv", ["client_id", "role", "n_train", "n_test", "accuracy",
                                                   "accuracy_lm"],
                        client_rows(part, [outcome.best.groups[g] for g in ("train", "holdout")
                                           if g in outcome.best.groups]), release=NONPRIVATE)


def _print_dp_summary(report: Reporter, out: Path, m: dict, nonprivate: bool) -> None:
    from rich.table import Table

    dp = m["dp"]
    table = Table(title=f"train --dp -> {out}: {m['algorithm']}, model of the last round ({m['rounds']}), "
                  f"{m['device']}", title_justify="left")
    for col in ("unit", "epsilon", "delta", "clip", "noise multiplier", "sampling rate", "accountant"):
        table.add_column(col, justify="right")
    table.add_row(dp["unit"], f"{dp['epsilon']:g}", f"{dp['delta']:g}", f"{dp['clip']:g}",
                  f"{dp['noise_multiplier']:.4g}", f"{dp.get('sampling_rate', float('nan')):.4g}", dp["accountant"])
    data = {"out": str(out), "up_to_date": False, "dp": dp,
            **{k: m[k] for k in ("algorithm", "rounds", "selection", "device")}}
    # Printing is releasing too: accuracies on the private clients stay in the nonprivate* files.
    if nonprivate:
        data["nonprivate_files"] = ["nonprivate.json", "nonprivate-metrics.csv", "nonprivate-clients.csv"]
        report.note(f"accuracies on the private clients (not covered by DP): {out}/nonprivate.json")
    report.result(data, table)


def _status(status: dict) -> str:
    parts = [f"loss {status['loss']:.3f}"] if "loss" in status else []
    for group in ("train", "holdout"):
        if group in status:
            parts.append(f"{group} {100 * status[group]:.1f}%")
    return " ".join(parts)


def _diverged_message(err, cfg, ck_path: Path, out: Path) -> str:
    server = "default" if cfg.server_lr is None else f"{cfg.server_lr:g}"
    if err.last_checkpoint is not None and ck_path.is_file():
        kept = f"the last good checkpoint (round {err.last_checkpoint}) is kept at {ck_path}"
    else:
        every = cfg.checkpoint_every or cfg.eval_every
        kept = f"no checkpoint was written yet (one comes every {every} rounds)"
    return (f"training diverged at round {err.round}: the mean client loss became {err.loss}; {kept}; nothing "
            f"was written to --out {out}. Lower --lr (now {cfg.lr:g}) or --server-lr (now {server}) and run "
            "again: --resume continues a checkpoint only with the identical config and inputs, so a run with "
            "a lower learning rate starts from round 0.")


def _metrics(cfg, run, info: dict, device) -> dict:
    from pfl_cli.algorithms import REGISTRY
    from pfl_cli.models import num_parameters

    outcome, arch = run.outcome, run.model["arch"]
    params = {name: int(num_parameters(spec)) for name, spec in arch.items()}
    floats = REGISTRY[cfg.algorithm].floats_per_client_round(arch)
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
    metrics["parameters"] = params
    metrics["floats_per_client_round"] = floats
    return clean(metrics)


def client_rows(part, evals) -> list[list]:
    """clients.csv rows (client_id, role, n_train, n_test, accuracy, accuracy_lm), in partition order."""
    rows = []
    for ev in evals:
        acc, acc_lm = ev.accuracy(False), ev.accuracy(True)
        rows += [(int(c), [int(part.client_id[c]), int(part.role[c]), int(part.train_sizes[c]),
                           int(part.test_sizes[c]), csv_float(acc[i]), csv_float(acc_lm[i])])
                 for i, c in enumerate(ev.clients)]
    return [row for _, row in sorted(rows, key=lambda r: r[0])]


def _print_summary(report: Reporter, out: Path, m: dict) -> None:
    groups = {g: m[g] for g in ("train", "holdout", "val") if g in m}
    title = (f"train -> {out}: {m['algorithm']}, model of round {m['best_round']} of {m['rounds']} "
             f"(selected by {'validation accuracy' if m['selection'] == 'val' else 'last evaluation'}), "
             f"{m['device']}")
    table = accuracy_table(title, groups, m["label_mask"])
    data = {"out": str(out), "up_to_date": False,
            **{k: m[k] for k in ("algorithm", "best_round", "rounds", "selection", "label_mask", "headline_metric",
                                 "device")},
            **groups}
    report.result(data, table)
