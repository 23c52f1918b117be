"""`pflx train --log wandb|mlflow`: the run read back with each package's own reader (MLflow's MlflowClient on
the SQLite store; W&B's offline run file parsed into wandb.proto records) holds the artifact's numbers, the run's
name and its config as parameters; under --dp the elapsed time alone; a missing package refused up front."""

from __future__ import annotations

import csv
import json
import os
import struct
import subprocess
import sys
from pathlib import Path

import pytest

from pfl_cli.cli.app import main

pytestmark = pytest.mark.tracking  # deselected with a notice without pflx[wandb,mlflow]; an error under CI

ROOT = Path(__file__).resolve().parents[2]
FAST = ["--algorithm", "fedavg", "--rounds", "4", "--eval-every", "2", "--local-steps", "2", "--format", "quiet"]


@pytest.fixture(autouse=True)
def _offline(monkeypatch):
    for name in ("WANDB_MODE", "WANDB_PROJECT", "MLFLOW_TRACKING_URI", "MLFLOW_EXPERIMENT_NAME"):
        monkeypatch.delenv(name, raising=False)  # the defaults under test: offline W&B, LOG_DIR/mlflow.db
    monkeypatch.setenv("WANDB_DISABLE_GIT", "true")


@pytest.fixture(scope="module")
def part(tmp_path_factory):
    root = tmp_path_factory.mktemp("tracking")
    assert main(["partition", "--dirichlet", "0.5", "-n", "10", "--holdout-clients", "2", "--out", str(root / "part"),
                 "--format", "quiet"]) == 0
    return root


def wandb_records(run_dir: Path) -> list:
    """The records of an offline W&B run (``run-<id>.wandb``) as ``wandb.proto`` Records: the file is W&B's
    LevelDB-style log (a 7-byte ``:W&B`` header, then 32 KiB blocks of chunks, each a little-endian header of
    CRC-32, length and type: 1 full, 2 first, 3 middle, 4 last). wandb 0.31 reads it in its Go core only."""
    from wandb.proto import wandb_internal_pb2

    (path,) = run_dir.glob("run-*.wandb")
    data = path.read_bytes()
    assert data[:4] == b":W&B"
    records, pos, pending = [], 7, b""
    while pos + 7 <= len(data):
        if 32768 - pos % 32768 < 7:  # a block's tail too short for a header is padding
            pos += 32768 - pos % 32768
            continue
        _crc, length, kind = struct.unpack("<IHB", data[pos:pos + 7])
        if kind == 0:
            break
        pending += data[pos + 7:pos + 7 + length]
        pos += 7 + length
        if kind in (1, 4):
            record = wandb_internal_pb2.Record()
            record.ParseFromString(pending)
            records.append(record)
            pending = b""
    return records


def wandb_run(log_dir: Path, name: str) -> tuple[dict, dict, dict[str, dict[int, float]]]:
    """(run record fields, config, metric -> {step: value}) of the offline run named ``name`` under LOG_DIR/wandb."""
    for run_dir in sorted((log_dir / "wandb").glob("offline-run-*")):
        records = wandb_records(run_dir)
        (run,) = [r.run for r in records if r.WhichOneof("record_type") == "run"]
        if run.display_name != name:
            continue
        config = {i.key: json.loads(i.value_json) for i in run.config.update if i.key != "_wandb"}
        series: dict[str, dict[int, float]] = {}
        for r in records:
            if r.WhichOneof("record_type") == "history":
                items = {i.key or "/".join(i.nested_key): json.loads(i.value_json) for i in r.history.item}
                for key, value in items.items():
                    if not key.startswith("_"):
                        series.setdefault(key, {})[int(items["_step"])] = value
        assert any(r.WhichOneof("record_type") == "exit" for r in records)  # finished: `wandb sync` uploads it
        return {"project": run.project, "group": run.run_group}, config, series
    raise AssertionError(f"no W&B run named {name!r} under {log_dir / 'wandb'}")


def mlflow_run(store: Path, name: str):
    """(the run, metric -> {step: value}) of the MLflow run named ``name`` in the SQLite store ``store``."""
    from mlflow import MlflowClient

    client = MlflowClient(tracking_uri=f"sqlite:///{store}")
    experiments = [e.experiment_id for e in client.search_experiments()]
    (run,) = client.search_runs(experiments, filter_string=f"attributes.run_name = '{name}'")
    series = {key: {m.step: m.value for m in client.get_metric_history(run.info.run_id, key)}
              for key in run.data.metrics}
    return run, series


def _artifact_accuracies(out: Path) -> dict[str, dict[int, float]]:
    metric = "mean_accuracy_lm" if json.loads((out / "metrics.json").read_text())["label_mask"] else "mean_accuracy"
    got: dict[str, dict[int, float]] = {}
    with open(out / "metrics.csv", newline="") as fh:
        for r in csv.DictReader(fh):
            if r["metric"] == metric:
                got.setdefault(f"{r['group']}/accuracy", {})[int(r["round"])] = float(r["value"])
    return got


@pytest.mark.slow  # default-tier budget (2026-11-29): minutes-long or a learning run
def test_wandb_and_mlflow_runs_hold_the_artifacts_numbers_and_config(part):
    out = part / "fedavg"
    assert main(["train", "--partition", str(part / "part"), "--out", str(out), *FAST, "--set", "lr=0.07",
                 "--log", "wandb", "--log", "mlflow", "--log", "jsonl"]) == 0
    logs = part / "fedavg.logs"
    assert not any("wandb" in p.name or "mlflow" in p.name for p in out.rglob("*"))  # never inside the artifact
    expected = _artifact_accuracies(out)
    assert set(expected) == {"train/accuracy", "val/accuracy", "holdout/accuracy"}
    assert all(set(v) == {2, 4} for v in expected.values())
    jsonl = [json.loads(ln) for ln in (logs / "metrics.jsonl").read_text().splitlines()]
    loss = {d["round"]: d["train/cohort_loss"] for d in jsonl}
    assert sorted(loss) == [1, 2, 3, 4]

    info, config, series = wandb_run(logs, "fedavg")
    assert info == {"project": "pflx", "group": ""}
    assert config["lr"] == 0.07 and config["algorithm"] == "fedavg" and config["rounds"] == 4
    for tag, values in expected.items():
        assert series[tag] == values  # the JSON text of the float: exact
    assert series["train/cohort_loss"] == loss
    assert sorted(series["time/elapsed_s"]) == [1, 2, 3, 4]
    assert set(series) == {*expected, "train/cohort_loss", "time/elapsed_s"}

    run, history = mlflow_run(logs / "mlflow.db", "fedavg")
    assert run.info.status == "FINISHED"
    assert run.data.params["lr"] == "0.07" and run.data.params["algorithm"] == "fedavg"
    for tag, values in expected.items():
        assert history[tag] == values
    assert history["train/cohort_loss"] == loss and sorted(history["time/elapsed_s"]) == [1, 2, 3, 4]
    assert set(history) == set(series)


def test_dp_run_logs_the_elapsed_time_and_nothing_else(part, monkeypatch):
    out = part / "dp"
    store = part / "fedavg.logs" / "mlflow.db"  # MLFLOW_TRACKING_URI wins over --log-dir (and skips a schema creation)
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{store}")
    assert main(["train", "--partition", str(part / "part"), "--out", str(out), *FAST, "--clients-per-round", "4",
                 "--set", "normalize=false", "--dp", "eps=4,delta=1e-6,clip=0.5,population=1000",
                 "--log", "wandb", "--log", "mlflow", "--log-dir", str(part / "dp-logs")]) == 0
    _info, config, series = wandb_run(part / "dp-logs", "dp")
    assert config == {} and set(series) == {"time/elapsed_s"} and sorted(series["time/elapsed_s"]) == [1, 2, 3, 4]
    assert not (part / "dp-logs" / "mlflow.db").exists()
    run, history = mlflow_run(store, "dp")
    assert run.data.params == {} and set(history) == {"time/elapsed_s"}
    assert sorted(history["time/elapsed_s"]) == [1, 2, 3, 4]


def test_missing_wandb_and_mlflow_are_refused_naming_the_extras(part, tmp_path):
    hide = tmp_path / "hide"
    hide.mkdir()
    (hide / "sitecustomize.py").write_text("import sys\nsys.modules['wandb'] = None\nsys.modules['mlflow'] = None\n")
    proc = subprocess.run([sys.executable, "-m", "pfl_cli", "train", "--partition", str(part / "part"), "--out",
                           str(tmp_path / "y"), *FAST, "--log", "wandb", "--log", "mlflow"], capture_output=True,
                          text=True, env=dict(os.environ, PYTHONPATH=os.pathsep.join([str(hide), str(ROOT)])),
                          timeout=120)
    assert proc.returncode == 2 and "pip install 'pflx[wandb,mlflow]'" in proc.stderr, proc.stderr
    assert proc.stderr.count("\n") == 1 and not (tmp_path / "y").exists() and not (tmp_path / "y.logs").exists()


@pytest.mark.slow  # three W&B and MLflow runs: ~15 s of CPU
def test_tune_logs_each_trial_as_a_run_of_the_study_with_its_drawn_values(part):
    import optuna

    out = part / "tune"
    assert main(["tune", "--partition", str(part / "part"), "--algorithm", "fedavg", "--trials", "3", "--rounds", "4",
                 "--eval-every", "2", "--local-steps", "2", "--out", str(out), "--format", "quiet",
                 "--log", "mlflow", "--log", "wandb"]) == 0
    (name,) = optuna.get_all_study_names(f"sqlite:///{out / 'study.db'}")
    study = optuna.load_study(study_name=name, storage=f"sqlite:///{out / 'study.db'}")
    trials = study.get_trials()
    assert len(trials) == 3 and all(t.state.is_finished() for t in trials)
    logs = part / "tune.logs"
    for t in trials:
        _info, config, series = wandb_run(logs, f"trial-{t.number}")
        assert _info["group"] == name and config == t.params and set(config)  # the searched keys, drawn
        curve = {int(k): v for k, v in t.intermediate_values.items()}
        metric = "validation/accuracy"  # the objective's curve, reported to the pruner
        assert series[metric] == curve and set(series) == {metric, "objective"}
        run, history = mlflow_run(logs / "mlflow.db", f"trial-{t.number}")
        assert {k: v for k, v in run.data.params.items()} == {k: str(v) for k, v in t.params.items()}
        assert history[metric] == curve and run.data.tags["pflx.state"] == t.state.name.lower()
        if t.value is not None:
            assert list(history["objective"].values()) == [t.value] == list(series["objective"].values())
    from mlflow import MlflowClient

    client = MlflowClient(tracking_uri=f"sqlite:///{logs / 'mlflow.db'}")
    assert len(client.search_runs([client.get_experiment_by_name(name).experiment_id])) == 3  # the study's experiment


def test_tune_log_refusals(part, tmp_path, cli):
    base = ("tune", "--partition", part / "part", "--algorithm", "fedavg", "--trials", "2", "--rounds", "2")
    run = cli(*base, "--out", tmp_path / "a", "--log", "csv")
    assert run.code == 2 and "--log for tune must be one of wandb, mlflow" in run.err and not (tmp_path / "a").exists()
    run = cli(*base, "--out", tmp_path / "b", "--log", "mlflow", "--dp", "eps=4,delta=1e-6,clip=0.5,population=1000")
    assert run.code == 2 and "--log with --dp" in run.err and not (tmp_path / "b").exists()
    assert not (tmp_path / "b.logs").exists()


@pytest.mark.slow  # a 2-trial study and two trainings, each a W&B and an MLflow run: ~20 s of CPU
def test_compare_spec_logs_the_protocol_as_one_experiment(part, tmp_path):
    spec = tmp_path / "spec.yaml"
    spec.write_text(f"partition: {part / 'part'}\nseeds: [0, 1]\nruns: {tmp_path / 'runs'}\nalgorithms:\n"
                    "  fedavg: {set: {rounds: 2, eval_every: 1, local_steps: 2}, "
                    "tune: {trials: 2, rounds: 2, eval_every: 1}}\n")
    out = tmp_path / "table"
    assert main(["compare", "--spec", str(spec), "--out", str(out), "--format", "quiet",
                 "--log", "mlflow", "--log", "wandb"]) == 0
    logs = tmp_path / "table.logs"
    from mlflow import MlflowClient

    client = MlflowClient(tracking_uri=f"sqlite:///{logs / 'mlflow.db'}")
    experiment = client.get_experiment_by_name("pflx-compare-table")
    names = sorted(r.info.run_name for r in client.search_runs([experiment.experiment_id]))
    assert names == ["fedavg-s0", "fedavg-s1", "pflx-tune-fedavg-trial-0", "pflx-tune-fedavg-trial-1"]
    for seed in (0, 1):
        run_dir = tmp_path / "runs" / "fedavg" / f"seed-{seed}"
        expected = _artifact_accuracies(run_dir)
        run, history = mlflow_run(logs / "mlflow.db", f"fedavg-s{seed}")
        assert run.data.params["seed"] == str(seed) and run.info.experiment_id == experiment.experiment_id
        for tag, values in expected.items():
            assert history[tag] == values
        info, config, series = wandb_run(logs, f"fedavg-s{seed}")
        assert info["group"] == "pflx-compare-table" and config["seed"] == seed
        for tag, values in expected.items():
            assert series[tag] == values
    info, config, _series = wandb_run(logs, "pflx-tune-fedavg-trial-0")
    assert info["group"] == "pflx-compare-table" and set(config) and "lr" in config


def test_compare_log_needs_spec(tmp_path, cli):
    run = cli("compare", tmp_path / "r0", "--out", tmp_path / "t", "--log", "mlflow")
    assert run.code == 2 and "--log logs the runs that compare --spec trains" in run.err
    assert not (tmp_path / "t").exists() and not (tmp_path / "t.logs").exists()
