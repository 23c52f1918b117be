"""`pflx tune` end to end on real directories: the artifact, best.yaml into train, resumption, --jobs, --dp, bad input."""

import json
import sqlite3
from pathlib import Path

import numpy as np
import optuna
import pytest
import yaml

SMALL = ["--rounds", "2", "--eval-every", "1", "--local-steps", "3", "--clients-per-round", "4",
         "--set", "mlp_hidden=[16]", "--device", "cpu"]


@pytest.fixture(scope="module")
def part(tmp_path_factory):
    from pfl_cli.cli.app import main

    out = tmp_path_factory.mktemp("tune") / "part"
    assert main(["partition", "--dataset", "builtin:digits", "--classes-per-client", "2", "--num-clients", "16",
                 "--holdout-clients", "4", "--format", "quiet", "--out", str(out)]) == 0
    return out


def _nothing_written(out: Path) -> bool:
    return not out.exists() and not any(out.parent.glob(f".{out.name}*"))


def test_tune_writes_a_study_whose_best_yaml_trains(cli, part, tmp_path):
    out = tmp_path / "t"
    r = cli("tune", "--partition", part, "--algorithm", "fedavg", "--trials", "3", *SMALL,
            "--space", "lr=choice:0.003,0.03,0.3", "--sampler", "grid", "--format", "json", "--out", out)
    assert r.code == 0, r.err
    doc = json.loads(r.out)
    assert {p.name for p in out.iterdir()} == {"manifest.json", "best.yaml", "trials.csv", "study.db", "metrics.json"}
    rows = list(csv_rows(out / "trials.csv"))
    assert sorted(float(r_["lr"]) for r_ in rows) == [0.003, 0.03, 0.3]  # the grid, each point once
    complete = [r_ for r_ in rows if r_["state"] == "complete"]
    best = max(complete, key=lambda r_: float(r_["value"]))
    assert doc["best"]["params"]["lr"] == float(best["lr"])
    assert all(r_["curve"].startswith("1:") for r_ in complete)  # the validation curve, per evaluation
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["objective"]["group"] == "train" and metrics["objective"]["metric"] == "mean_accuracy"
    best_yaml = yaml.safe_load((out / "best.yaml").read_text())
    assert best_yaml["lr"] == float(best["lr"]) and best_yaml["algorithm"] == "fedavg" and best_yaml["rounds"] == 2
    # the study database is Optuna's own, with the same trials
    study = optuna.load_study(study_name="pflx-tune-fedavg", storage=f"sqlite:///{out / 'study.db'}")
    assert len(study.trials) == 3
    assert not any(tmp_path.glob(".t.study"))  # the running study moved into the artifact
    r = cli("show", out, "--format", "json")
    assert r.code == 0, r.err
    head = json.loads(r.out)["headline"]
    assert head["best_lr"] == float(best["lr"]) and head["best_validation"] == float(best["value"])
    assert head["trials"].startswith(f"{len(complete)} complete")
    # best.yaml is a config `pflx train --config` takes as is
    r = cli("train", "--partition", part, "--config", out / "best.yaml", "--format", "json", "--out", tmp_path / "run")
    assert r.code == 0, r.err
    assert json.loads(r.out)["algorithm"] == "fedavg"
    # the same command again: up to date
    r = cli("tune", "--partition", part, "--algorithm", "fedavg", "--trials", "3", *SMALL,
            "--space", "lr=choice:0.003,0.03,0.3", "--sampler", "grid", "--format", "json", "--out", out)
    assert r.code == 0 and json.loads(r.out)["up_to_date"] is True


def csv_rows(path: Path):
    import csv

    with open(path, newline="") as fh:
        yield from csv.DictReader(fh)


def test_a_killed_study_continues_where_it_stopped(cli, part, tmp_path):
    """The running study lives beside --out; the same command runs only the missing trials, and a trial
    that was running when its process died is marked failed and not counted: it is run again."""
    import shutil

    out = tmp_path / "t"
    r = cli("tune", "--partition", part, "--algorithm", "fedavg", "--trials", "1", *SMALL, "--out", tmp_path / "t1")
    assert r.code == 0, r.err
    staging = tmp_path / ".t.study"
    staging.mkdir()
    shutil.copyfile(tmp_path / "t1" / "study.db", staging / "study.db")  # the study of the same command, 1 trial
    storage = f"sqlite:///{staging / 'study.db'}"
    study = optuna.load_study(storage=storage, study_name="pflx-tune-fedavg")
    dist = optuna.distributions.FloatDistribution(1e-3, 1.0, log=True)
    orphan = study.ask({"lr": dist})  # a trial whose process is gone
    study._storage.set_trial_system_attr(orphan._trial_id, "pflx_pid", 2 ** 22 + 12345)
    import socket

    study._storage.set_trial_system_attr(orphan._trial_id, "pflx_host", socket.gethostname())
    r = cli("tune", "--partition", part, "--algorithm", "fedavg", "--trials", "3", *SMALL, "--out", out)
    assert r.code == 0, r.err
    assert "continuing the study" in r.err
    rows = list(csv_rows(out / "trials.csv"))
    assert [r_["state"] for r_ in rows] == ["complete", "interrupted", "complete", "complete"]
    assert rows[1]["error"].startswith("interrupted (not counted") and "the process running it stopped" in rows[1]["error"]


def test_resuming_a_study_of_another_algorithm_is_refused(cli, part, tmp_path):
    out = tmp_path / "t"
    staging = tmp_path / ".t.study"
    staging.mkdir()
    study = optuna.create_study(storage=f"sqlite:///{staging / 'study.db'}", study_name="pflx-tune-fedavg",
                                direction="maximize")
    study.set_user_attr("algorithm", "fedavg")
    study.set_user_attr("partition", "0" * 64)
    r = cli("tune", "--partition", part, "--algorithm", "fedavg", "--trials", "2", *SMALL, "--out", out)
    assert r.code == 2 and "made by an earlier pflx" in r.err and "partition (--partition)" in r.err
    assert "--force" in r.err
    assert not out.exists()


@pytest.mark.slow  # default-tier budget (2026-11-29): minutes-long or a learning run
def test_jobs_run_trials_in_worker_processes(cli, part, tmp_path):
    out = tmp_path / "t"
    r = cli("tune", "--partition", part, "--algorithm", "fedavg", "--trials", "2", "--jobs", "2", *SMALL,
            "--format", "json", "--out", out)
    assert r.code == 0, r.err
    rows = list(csv_rows(out / "trials.csv"))
    assert len(rows) == 2 and all(r_["state"] == "complete" for r_ in rows)


def test_new_client_methods_are_scored_on_validation_clients(cli, part, tmp_path):
    out = tmp_path / "t"
    r = cli("tune", "--partition", part, "--algorithm", "pefll", "--trials", "1", *SMALL, "--set", "hyper_hidden=16",
            "--space", "lr=log:1e-2:1e-1", "--format", "json", "--out", out)
    assert r.code == 0, r.err
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["objective"]["group"] == "holdout" and metrics["validation"]["clients"] == 0.2
    r = cli("tune", "--partition", part, "--algorithm", "pefll", "--trials", "1", *SMALL,
            "--validation-clients", "0", "--out", tmp_path / "t0")
    assert r.code == 2 and "--validation-clients 0" in r.err


def test_a_study_where_every_trial_fails_writes_nothing(cli, part, tmp_path):
    out = tmp_path / "t"
    r = cli("tune", "--partition", part, "--algorithm", "fedavg", "--trials", "1", *SMALL, "--set", "client_clip=0",
            "--space", "lr=choice:1e9", "--out", out)
    assert r.code == 1 and "no trial of the study completed" in r.err and "diverged" in r.err
    assert not out.exists()


@pytest.mark.parametrize("args, message", [
    (["--trials", "0"], "--trials must be an integer >= 1"),
    (["--jobs", "0"], "--jobs must be an integer >= 1"),
    (["--space", "lr=log:0:1"], "--space lr: a log range needs LOW > 0"),
    (["--space", "lr=log:1:0.1"], "LOW must be < HIGH"),
    (["--space", "lrr=log:1e-3:1"], "unknown --space key 'lrr'"),
    (["--space", "lr=int:1:3"], "float key, an int range"),
    (["--space", "dp_epsilon=float:1:8"], "dp_epsilon cannot be searched"),
    (["--space", "dp_clip=log:0.1:1"], "dp_clip cannot be searched"),
    (["--space", "seed=int:0:3"], "seed cannot be searched"),
    (["--space", ""], "expected KEY=SPEC"),
    (["--sampler", "grid"], "a grid search needs a finite set"),
    (["--sampler", "bayes"], "--sampler must be one of"),
    (["--pruner", "hyperband"], "--pruner must be one of"),
    (["--validation-fraction", "1"], "--validation-fraction must be in"),
    (["--storage", "postgresql://nobody@127.0.0.1:1/none"], "--storage 127.0.0.1:1/none: cannot open"),
    (["--storage", "notaurl"], "--storage notaurl: cannot open"),
    (["--dp-shape", "2"], "apply only with --dp"),
])
def test_bad_input_is_one_line_exit_2_and_nothing_written(cli, part, tmp_path, args, message):
    out = tmp_path / "t"
    r = cli("tune", "--partition", part, "--algorithm", "fedavg", *SMALL, *args, "--out", out)
    assert r.code == 2, r.err
    assert message in r.err and r.err.count("\n") == 1
    assert _nothing_written(out)


def test_a_missing_or_wrong_partition_is_refused(cli, part, tmp_path):
    r = cli("tune", "--partition", tmp_path / "nothing", "--algorithm", "fedavg", "--out", tmp_path / "t")
    assert r.code == 2 and "nothing" in r.err
    r = cli("tune", "--partition", tmp_path, "--algorithm", "fedavg", "--out", tmp_path / "t")
    assert r.code == 2


# ---------------------------------------------------------------------------- --dp
DP = ["--dp", "eps=4,clip=1,population=100,delta=1e-5", "--set", "normalize=false"]


def test_dp_tune_releases_the_best_config_under_a_repeat_and_select_ledger(cli, part, tmp_path):
    out = tmp_path / "t"
    r = cli("tune", "--partition", part, "--algorithm", "fedavg", "--trials", "2", *SMALL, *DP,
            "--format", "json", "--out", out)
    assert r.code == 0, r.err
    assert {p.name for p in out.iterdir()} == {"manifest.json", "best.yaml", "privacy.json", "metrics.json"}
    ledger = json.loads((out / "privacy.json").read_text())
    (event,) = ledger["events"]
    assert event["type"] == "RepeatAndSelectDpEvent" and event["mean"] == 2.0 and event["shape"] == 1.0
    inner = event["event"]["events"]
    assert [e["type"] for e in inner[-2:]] == ["GaussianDpEvent", "GaussianDpEvent"]  # the score's release
    manifest = json.loads((out / "manifest.json").read_text())
    assert {o["path"]: o["release"] for o in manifest["outputs"]} == {
        "best.yaml": "mechanism", "metrics.json": "mechanism", "privacy.json": "post-processing"}
    assert "trial" not in r.err.replace("trials (mean", "")  # no trial count in the progress lines
    # privacy-account composes it, and the study costs more than one trial's training
    r = cli("privacy-account", out, "--format", "json")
    assert r.code == 0, r.err
    study_eps = json.loads(r.out)["epsilon"]
    assert study_eps == pytest.approx(ledger["epsilon"], rel=1e-6) and study_eps > 4.0
    # best.yaml trains under the same DP budget
    r = cli("train", "--partition", part, "--config", out / "best.yaml", "--format", "quiet", "--out", tmp_path / "r")
    assert r.code == 0, r.err


@pytest.mark.parametrize("args, message", [
    (["--sampler", "tpe"], "--sampler tpe under --dp"),
    (["--pruner", "median"], "--pruner median under --dp"),
    (["--space", "rounds=int:1:3"], "--space rounds: under --dp"),
    (["--storage", "sqlite:///x.db"], "--storage under --dp"),
    (["--jobs", "2"], "--jobs 2 under --dp"),
    (["--trials", "1"], "must be >= 2"),
    (["--dp-shape", "0"], "--dp-shape must be"),
    (["--dp-score-noise", "0"], "--dp-score-noise must be"),
])
def test_dp_refusals(cli, part, tmp_path, args, message):
    out = tmp_path / "t"
    r = cli("tune", "--partition", part, "--algorithm", "fedavg", *SMALL, *DP, *args, "--out", out)
    assert r.code == 2, r.err
    assert message in r.err
    assert _nothing_written(out)
