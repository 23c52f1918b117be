"""`pflx train` end to end on builtin:digits: the artifact, no-op re-runs, determinism, kill + --resume, errors.

Training runs single-threaded (``torch.set_num_threads(1)`` in tests/conftest.py, ``OMP_NUM_THREADS=1`` for the
subprocesses): the nets are tiny, and on a small shared machine intra-op threads only add
synchronization cost; it also keeps every run's floating-point reductions in one order.
"""

import csv
import json
import os
import signal
import subprocess
import sys
import time

import numpy as np
import pytest
import torch
import yaml

from pfl_cli import registry
from pfl_cli.artifacts import load_partition
from pfl_cli.cli.app import main
from pfl_cli.fl.checkpoint import checkpoint_dir, seal_checkpoint
from pfl_cli.registry import train_config
from pflx_testing import cli_args

FAST = ["--rounds", "20", "--eval-every", "10", "--local-steps", "5", "--set", "hyper_hidden=16",
        "--set", "mlp_hidden=[16]"]
PER_ALGORITHM = {"pefll": [], "fedavg": [], "local": ["--local-epochs", "3"]}


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    root = tmp_path_factory.mktemp("train")
    assert main(["partition", "--dataset", "builtin:digits", "--classes-per-client", "2", "--class-shares", "equal",
                 "--num-clients", "20", "--holdout-clients", "4", "--test-fraction", "0.3",
                 "--out", str(root / "part"), "--format", "quiet"]) == 0
    return root


def train(root, out, *extra, fmt="json"):
    return main(cli_args(["train", "--partition", str(root / "part"), "--out", str(out), "--format", fmt, *FAST,
                          *extra]))


@pytest.fixture(scope="module")
def trained(root):
    outs = {}
    for alg, extra in PER_ALGORITHM.items():
        outs[alg] = root / alg
        assert train(root, outs[alg], "--algorithm", alg, *extra) == 0
    return outs


def read_csv(path):
    with open(path, newline="") as fh:
        return list(csv.DictReader(fh))


def _float(text):
    return float("nan") if text == "" else float(text)


@pytest.mark.parametrize("alg", list(PER_ALGORITHM))
def test_artifact_files_parse_and_agree(root, trained, alg):
    out = trained[alg]
    manifest = json.loads((out / "manifest.json").read_text())
    names = {o["path"] for o in manifest["outputs"]}
    expected = {"config.yaml", "model.pt", "metrics.csv", "metrics.json", "clients.csv", "train_samples.npz"}
    assert expected | ({"checkpoint/state.pt"} if alg != "local" else set()) == names
    assert manifest["stage"] == "train" and [i["stage"] for i in manifest["inputs"]] == ["partition", "dataset"]
    config = yaml.safe_load((out / "config.yaml").read_text())
    assert config == manifest["config"] and train_config(**config).algorithm == alg
    assert list(config) == registry.get(alg).keys  # only the algorithm's keys, in field order
    assert not checkpoint_dir(out).exists()

    model = torch.load(out / "model.pt", weights_only=True, map_location="cpu")
    assert model["algorithm"] == alg and set(model["arch"]) == (
        {"client", "embedding", "hypernetwork"} if alg == "pefll" else {"client"})

    # metrics.csv: every evaluation, per group, and the selected round's rows equal metrics.json.
    rows = read_csv(out / "metrics.csv")
    assert list(rows[0]) == ["round", "group", "metric", "value"]
    rounds = sorted({int(r["round"]) for r in rows})
    assert rounds == ([10, 20] if alg != "local" else [0])
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["algorithm"] == alg and metrics["rounds"] == (20 if alg != "local" else 0)
    assert metrics["best_round"] in rounds and metrics["selection"] == "val" and metrics["device"] == "cpu"
    masked = registry.train_config(alg).label_mask  # PeFLL's default is on (specs/pefll.md §1.7), the others' off
    assert metrics["label_mask"] is masked
    assert metrics["headline_metric"] == ("mean_accuracy_lm" if masked else "mean_accuracy")
    info = json.loads((root / "part" / "dataset.json").read_text())
    assert metrics["dataset"] == {"spec": "builtin:digits", "labels_sha256": info["labels_sha256"], "num_classes": 10}
    for group in ("train", "holdout", "val"):
        for metric in ("mean_accuracy", "pooled_accuracy", "mean_accuracy_lm", "pooled_accuracy_lm", "loss"):
            row = [r for r in rows if int(r["round"]) == metrics["best_round"] and r["group"] == group
                   and r["metric"] == metric]
            assert len(row) == 1 and float(row[0]["value"]) == pytest.approx(metrics[group][metric], rel=1e-12)
    if alg != "local":
        assert any(r["metric"] == "train_loss" for r in rows)

    # clients.csv: one row per client, in partition order, consistent with metrics.json.
    part, _, _ = load_partition(root / "part")
    clients = read_csv(out / "clients.csv")
    assert [int(c["client_id"]) for c in clients] == part.client_id.tolist()
    assert [int(c["role"]) for c in clients] == part.role.tolist()
    assert [int(c["n_train"]) for c in clients] == part.train_sizes.tolist()
    assert [int(c["n_test"]) for c in clients] == part.test_sizes.tolist()
    for role, group in ((0, "train"), (1, "holdout")):
        mine = [c for c in clients if int(c["role"]) == role]
        n = np.array([int(c["n_test"]) for c in mine])
        s = metrics[group]
        assert s["num_clients"] == len(mine) and s["num_samples"] == n.sum()
        for column, suffix in (("accuracy", ""), ("accuracy_lm", "_lm")):
            acc = np.array([_float(c[column]) for c in mine])
            assert np.nanmean(acc) == pytest.approx(s["mean_accuracy" + suffix], abs=1e-12)
            assert np.nansum(np.round(acc * n)) / n.sum() == pytest.approx(s["pooled_accuracy" + suffix], abs=1e-12)

    params = metrics["parameters"]
    d = params["client"]
    assert d == sum(v.numel() for v in torch.nn.Linear(64, 16).parameters()) + 16 * 10 + 10
    floats = {"pefll": 2 * (d + params.get("embedding", 0) + model["arch"].get("hypernetwork", {}).get("in_dim", 0)),
              "fedavg": 2 * d, "local": 0}[alg]
    assert metrics["floats_per_client_round"] == floats
    if alg == "pefll":
        assert model["arch"]["hypernetwork"]["in_dim"] == int(1 + 20 / 4)
        assert params["embedding"] > 0 and params["hypernetwork"] > d
    if alg != "local":
        ckpt = torch.load(out / "checkpoint" / "state.pt", weights_only=True)
        assert set(ckpt) == {"round", "algorithm_name", "algorithm", "history", "loss_acc", "best", "fingerprint", "traffic", "sha256",
                             "config_format"}
        assert ckpt["round"] == 20 and len(ckpt["history"]) == len(rows)


def test_printed_results(root, trained, capsys):
    assert train(root, root / "printed", "--algorithm", "fedavg", "--label-mask", fmt="human") == 0
    text = capsys.readouterr().out
    assert "holdout" in text and "mean lm*" in text and "pooled lm*" in text and "--label-mask" in text
    assert train(root, root / "printed", "--algorithm", "fedavg", "--label-mask") == 0
    assert json.loads(capsys.readouterr().out) == {"out": str(root / "printed"), "up_to_date": True}
    assert main(cli_args(["train", "--partition", str(root / "part"), "--out", str(root / "printed2"), "--format",
                          "json", *FAST, "--algorithm", "fedavg", "--label-mask"])) == 0
    result = json.loads(capsys.readouterr().out)
    metrics = json.loads((root / "printed2" / "metrics.json").read_text())
    assert result["up_to_date"] is False and result["algorithm"] == "fedavg" and result["label_mask"] is True
    assert result["headline_metric"] == "mean_accuracy_lm" and metrics["headline_metric"] == "mean_accuracy_lm"
    assert result["train"] == metrics["train"] and result["holdout"] == metrics["holdout"]
    assert result["best_round"] == metrics["best_round"]


def test_rerun_is_a_noop_and_the_same_seed_is_byte_identical(root, trained, tmp_path, capsys):
    out = trained["pefll"]
    stamp = (out / "manifest.json").stat().st_mtime_ns
    assert train(root, out, "--algorithm", "pefll", fmt="human") == 0
    assert "up to date" in capsys.readouterr().err
    assert (out / "manifest.json").stat().st_mtime_ns == stamp
    # A fresh directory: --resume without a checkpoint warns, starts from round 0, and changes nothing.
    assert train(root, tmp_path / "again", "--resume") == 0
    assert "no checkpoint" in capsys.readouterr().err
    for name in ("metrics.csv", "metrics.json", "model.pt", "clients.csv", "config.yaml", "checkpoint/state.pt"):
        assert (out / name).read_bytes() == (tmp_path / "again" / name).read_bytes(), name
    # Another seed is another run, and a different artifact in the same --out needs --force.
    assert train(root, out, "--seed", "1") == 2
    assert "--force" in capsys.readouterr().err


@pytest.mark.slow  # default-tier budget (2026-11-29): minutes-long or a learning run
def test_kill_and_resume_equals_an_uninterrupted_run(root, tmp_path):
    args = ["--partition", str(root / "part"), "--rounds", "60", "--eval-every", "10", "--local-steps", "25",
            "--set", "hyper_hidden=16", "--set", "mlp_hidden=[16]"]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
    cmd = [sys.executable, "-m", "pfl_cli", "train", *args]
    killed, whole = tmp_path / "killed", tmp_path / "whole"
    reference = subprocess.Popen([*cmd, "--out", str(whole), "--format", "quiet"], env=env,
                                 stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    proc = subprocess.Popen([*cmd, "--out", str(killed), "--format", "quiet"], env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    ck = checkpoint_dir(killed) / "state.pt"
    deadline = time.monotonic() + 60
    try:
        while True:
            assert proc.poll() is None, "the run finished before it could be killed mid-way"
            assert time.monotonic() < deadline, "no checkpoint of round >= 20 appeared"
            if ck.is_file() and torch.load(ck, weights_only=True)["round"] >= 20:
                proc.send_signal(signal.SIGKILL)
                break
            time.sleep(0.02)
    finally:
        proc.kill()
        proc.wait()
    assert not killed.exists()
    # The checkpoint, and the lock file the OS released with the process (the next writer reuses it).
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith(".killed")) == [".killed.checkpoint",
                                                                                           ".killed.lock"]
    saved = torch.load(ck, weights_only=True)
    assert 20 <= saved["round"] < 60 and len(saved["fingerprint"]) == 64

    done = subprocess.run([*cmd, "--out", str(killed), "--resume"], env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert f"resuming from round {saved['round']}" in done.stderr
    assert reference.wait() == 0
    for name in ("metrics.csv", "metrics.json", "clients.csv", "model.pt"):
        assert (killed / name).read_bytes() == (whole / name).read_bytes(), name
    assert not checkpoint_dir(killed).exists()
    assert torch.load(killed / "checkpoint" / "state.pt", weights_only=True)["round"] == 60


def test_resume_really_continues_the_checkpoint(root, trained, tmp_path, capsys):
    # The finished run's last checkpoint (round 20 of 20), marked, placed where an interrupted run leaves it.
    state = torch.load(trained["pefll"] / "checkpoint" / "state.pt", weights_only=True)
    state["history"].append([20, "marker", "resumed", 1.0])
    state = seal_checkpoint(state, state["fingerprint"])  # an edit that re-seals: a valid checkpoint
    ck = checkpoint_dir(tmp_path / "r") / "state.pt"
    ck.parent.mkdir()
    torch.save(state, ck)
    assert train(root, tmp_path / "r", "--resume", fmt="human") == 0
    assert "resuming from round 20" in capsys.readouterr().err
    assert "20,marker,resumed,1.0" in (tmp_path / "r" / "metrics.csv").read_text()
    assert (tmp_path / "r" / "model.pt").read_bytes() == (trained["pefll"] / "model.pt").read_bytes()
    assert not ck.parent.exists()
    # Without --resume, a checkpoint left beside --out is neither continued nor silently discarded: one line
    # naming --resume and --force, exit 2, nothing written, the checkpoint untouched (issue 34, item 2).
    ck = checkpoint_dir(tmp_path / "s") / "state.pt"
    ck.parent.mkdir()
    torch.save(state, ck)
    before = ck.read_bytes()
    capsys.readouterr()
    assert train(root, tmp_path / "s", fmt="human") == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("pflx: error: ") and str(ck) in err, err
    assert "--resume" in err and "--force" in err
    assert ck.read_bytes() == before and not (tmp_path / "s").exists()
    # --force starts over: the old checkpoint is replaced, not continued.
    assert train(root, tmp_path / "s", "--force", fmt="human") == 0
    assert "discarding the checkpoint" in capsys.readouterr().err
    assert "marker" not in (tmp_path / "s" / "metrics.csv").read_text() and not ck.parent.exists()
    assert (tmp_path / "s" / "checkpoint" / "state.pt").read_bytes() == (
        trained["pefll"] / "checkpoint" / "state.pt").read_bytes()


def test_divergence_keeps_the_last_checkpoint_and_writes_nothing(root, tmp_path, capsys):
    out = tmp_path / "nan"
    diverge = ["--server-lr", "1000", "--eval-every", "1"]
    assert train(root, out, *diverge) == 1
    err = capsys.readouterr().err
    ck = checkpoint_dir(out) / "state.pt"
    assert "diverged at round 2" in err and "checkpoint (round 1)" in err and str(ck) in err and "--lr" in err
    # One error line, after the progress lines of the rounds that ran (stderr is not a terminal here).
    lines = err.splitlines()
    assert lines[-1].startswith("pflx: error: ") and all(ln.startswith("train: round ") for ln in lines[:-1])
    assert not out.exists()
    assert torch.load(ck, weights_only=True)["round"] == 1
    assert not [p for p in tmp_path.iterdir() if ".tmp-" in p.name]
    # That checkpoint belongs to this config only: --resume with another one is refused.
    assert train(root, out, *diverge[:1], "1e-3", *diverge[2:], "--resume") == 2
    err = capsys.readouterr().err
    assert "different config" in err and "drop --resume" in err and ck.is_file()
    # ... and a checkpoint of another algorithm is refused by name.
    assert train(root, out, *diverge, "--algorithm", "fedavg", "--resume") == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and (f"the checkpoint {ck} is of an --algorithm pefll run and this command trains "
                                      "--algorithm fedavg") in err and ck.is_file() and not out.exists()
    # Checkpoints every 10 rounds: none exists when the loss blows up at round 2.
    assert train(root, tmp_path / "nan10", "--server-lr", "1000") == 1
    err = capsys.readouterr().err
    assert "diverged at round 2" in err and "no checkpoint was written yet" in err
    assert not (tmp_path / "nan10").exists() and not checkpoint_dir(tmp_path / "nan10").exists()


@pytest.mark.parametrize("extra,message", [
    (("--algorithm", "sgd"), "algorithm must be one of pefll, fedavg, local"),
    (("--lr", "0"), "lr must be a finite number > 0"),
    (("--set", "no_such_key=1"), "unknown --set key"),
    (("--val-fraction", "1"), "val_fraction must be in [0, 1)"),
])
def test_bad_options_exit_2(root, tmp_path, capsys, extra, message):
    assert train(root, tmp_path / "bad", *extra) == 2
    assert message in capsys.readouterr().err and not (tmp_path / "bad").exists()


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has CUDA")
def test_cuda_without_a_gpu_exits_2(root, tmp_path, capsys):
    assert train(root, tmp_path / "gpu", "--device", "cuda") == 2
    err = capsys.readouterr().err
    assert "CUDA" in err and "--device cpu" in err and not (tmp_path / "gpu").exists()


def test_changed_dataset_is_refused(tmp_path, capsys):
    rng = np.random.default_rng(0)
    data = tmp_path / "d.npz"
    np.savez(data, x=rng.normal(size=(200, 5)).astype(np.float32), y=rng.integers(0, 3, 200))
    assert main(["partition", "--dataset", f"npz:{data}", "--num-clients", "4", "--out", str(tmp_path / "p"),
                 "--format", "quiet"]) == 0
    np.savez(data, x=rng.normal(size=(200, 5)).astype(np.float32), y=rng.integers(0, 3, 200))
    assert main(["train", "--partition", str(tmp_path / "p"), "--out", str(tmp_path / "t"), *FAST]) == 2
    assert "is not the data the partition was made from" in capsys.readouterr().err  # its digest differs


def test_help_names_every_config_key(cli):
    text = " ".join(cli("train", "-h").out.split())
    for name in registry.get("pefll").keys:
        assert f"--{name.replace('_', '-')}" in text or name in text, name
