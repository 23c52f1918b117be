"""`pflx train --log tensorboard|csv|jsonl`: per-round metrics where those tools read them, equal to the
artifact's own metrics.csv; nothing private under --dp; bad or uninstalled loggers refused up front."""

from __future__ import annotations

import csv
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from pfl_cli.cli.app import main

ROOT = Path(__file__).resolve().parents[2]
FAST = ["--algorithm", "fedavg", "--rounds", "4", "--eval-every", "2", "--local-steps", "2", "--format", "quiet"]


@pytest.fixture(scope="module")
def part(tmp_path_factory):
    root = tmp_path_factory.mktemp("loggers")
    assert main(["partition", "--dirichlet", "0.5", "-n", "10", "--holdout-clients", "2", "--out", str(root / "part"),
                 "--format", "quiet"]) == 0
    return root


def _artifact_accuracies(out: Path) -> dict[tuple[int, str], float]:
    metric = "mean_accuracy_lm" if json.loads((out / "metrics.json").read_text())["label_mask"] else "mean_accuracy"
    with open(out / "metrics.csv", newline="") as fh:
        return {(int(r["round"]), f"{r['group']}/accuracy"): float(r["value"]) for r in csv.DictReader(fh)
                if r["metric"] == metric}


def test_csv_jsonl_and_tensorboard_logs_hold_the_artifacts_numbers(part):
    out = part / "fedavg"
    assert main(["train", "--partition", str(part / "part"), "--out", str(out), *FAST,
                 "--log", "csv", "--log", "jsonl", "--log", "tensorboard"]) == 0
    logs = part / "fedavg.logs"  # the default --log-dir, beside --out and outside the artifact
    assert not any("log" in p.name or "tfevents" in p.name for p in out.rglob("*"))
    expected = _artifact_accuracies(out)
    assert {r for r, _ in expected} == {2, 4} and len(expected) == 6  # train, val, holdout at rounds 2 and 4

    with open(logs / "metrics.csv", newline="") as fh:
        rows = list(csv.DictReader(fh))
    logged = {(int(r["round"]), r["metric"]): float(r["value"]) for r in rows}
    assert {k: v for k, v in logged.items() if k[1].endswith("/accuracy")} == expected
    assert sorted(r for r, m in logged if m == "train/cohort_loss") == [1, 2, 3, 4]

    lines = [json.loads(ln) for ln in (logs / "metrics.jsonl").read_text().splitlines()]
    assert [d["round"] for d in lines] == [1, 2, 3, 4]
    for d in lines:
        for name, value in d.items():
            if name.endswith("/accuracy"):
                assert expected[(d["round"], name)] == value
        assert d["train/cohort_loss"] == logged[(d["round"], "train/cohort_loss")]

    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(logs / "tensorboard"))
    events.Reload()
    assert {"train/cohort_loss", "train/accuracy", "holdout/accuracy", "val/accuracy"} <= set(events.Tags()["scalars"])
    for tag in ("train/accuracy", "holdout/accuracy"):
        got = {e.step: e.value for e in events.Scalars(tag)}
        assert got == pytest.approx({r: v for (r, t), v in expected.items() if t == tag}, abs=1e-6)  # float32


def test_dp_run_logs_no_value_computed_from_private_data(part):
    out = part / "dp"
    assert main(["train", "--partition", str(part / "part"), "--out", str(out), *FAST, "--clients-per-round", "4",
                 "--set", "normalize=false", "--dp", "eps=4,delta=1e-6,clip=0.5,population=1000",
                 "--log", "jsonl", "--log-dir", str(part / "dp-logs")]) == 0
    lines = [json.loads(ln) for ln in (part / "dp-logs" / "metrics.jsonl").read_text().splitlines()]
    assert [d["round"] for d in lines] == [1, 2, 3, 4]
    assert all(set(d) == {"round", "time/elapsed_s"} for d in lines)


def test_unknown_logger_and_missing_tensorboard_are_refused_before_any_work(part, tmp_path, cli):
    run = cli("train", "--partition", part / "part", "--out", tmp_path / "x", *FAST, "--log", "neptune")
    assert run.code == 2 and "--log must be one of tensorboard, csv, jsonl, wandb, mlflow" in run.err and not (tmp_path / "x").exists()
    hide = tmp_path / "hide"
    hide.mkdir()
    (hide / "sitecustomize.py").write_text("import sys\nsys.modules['tensorboard'] = None\n")
    proc = subprocess.run([sys.executable, "-m", "pfl_cli", "train", "--partition", str(part / "part"), "--out",
                           str(tmp_path / "y"), *FAST, "--log", "tensorboard"], capture_output=True, text=True,
                          env=dict(os.environ, PYTHONPATH=os.pathsep.join([str(hide), str(ROOT)])), timeout=120)
    assert proc.returncode == 2 and "pip install 'pflx[tensorboard]'" in proc.stderr
    assert proc.stderr.count("\n") == 1 and not (tmp_path / "y").exists() and not (tmp_path / "y.logs").exists()
