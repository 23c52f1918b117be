"""`pflx train --seeds` with the other train options, end to end on temp dirs: --dp (each seed its own mechanism:
its own noise, its own privacy.json, equal to the separate run under seeded noise), --log (each seed its own log
folder and tracker run, holding the separate run's numbers), --plot (each seed its curves), and --nproc / torchrun
(refused in one line naming the option, nothing written, no rank launched)."""

import csv
import json

import pytest
import torch

ARGS = ["--algorithm", "fedavg", "--rounds", "4", "--eval-every", "2", "--clients-per-round", "4", "--local-steps",
        "3", "--lr", "0.05", "--format", "quiet"]
DP = ["--set", "normalize=false", "--dp", "eps=4,clip=1,population=100", "--write-nonprivate"]


def _files(d):
    return sorted(p.relative_to(d).as_posix() for p in d.rglob("*") if p.is_file())


def _weights(run):
    return torch.load(run / "model.pt", weights_only=True)["weights"]["client"]


def _same(a, b) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_seeds_under_dp_each_seed_is_its_own_mechanism(digits_root, tmp_path, cli):
    part = digits_root / "part"
    seeded = [a.replace("population=100", "population=100,noise=seeded") for a in DP]
    stacked, alone = tmp_path / "stack", tmp_path / "alone"
    assert cli("train", "--partition", part, "--seeds", "0,1", "--out", stacked, *ARGS, *seeded).code == 0
    assert cli("train", "--partition", part, "--seed", "1", "--out", alone, *ARGS, *seeded).code == 0
    got = stacked / "seed-1"
    assert _files(got) == _files(alone) and "privacy.json" in _files(got) and "train_samples.npz" not in _files(got)
    assert _same(_weights(got), _weights(alone))  # seeded noise: the separate run's noise, bit for bit
    for name in ("config.yaml", "privacy.json", "metrics.json", "nonprivate.json", "nonprivate-metrics.csv"):
        assert (got / name).read_text() == (alone / name).read_text(), name
    assert json.loads((got / "manifest.json").read_text())["stacked"] == {"seeds": [0, 1], "runs": 2}
    # secure noise (the default): from OS entropy, not the seed -- the same stack twice gives other models
    first, second = tmp_path / "secure-a", tmp_path / "secure-b"
    for out in (first, second):
        assert cli("train", "--partition", part, "--seeds", "0,1", "--out", out, *ARGS, *DP).code == 0
    for seed in (0, 1):
        assert not _same(_weights(first / f"seed-{seed}"), _weights(second / f"seed-{seed}"))
        privacy = json.loads((first / f"seed-{seed}" / "privacy.json").read_text())
        assert privacy["epsilon"] <= 4.0 and "secure" in json.dumps(privacy).lower()
    assert not _same(_weights(first / "seed-0"), _weights(first / "seed-1"))


def _log_rows(folder):
    """(round, metric) -> value of a --log csv file, without the elapsed time (a clock, not a result)."""
    with open(folder / "metrics.csv", newline="") as fh:
        return {(int(r["round"]), r["metric"]): float(r["value"]) for r in csv.DictReader(fh)
                if r["metric"] != "time/elapsed_s"}


def test_seeds_log_each_seed_in_its_own_folder_with_the_separate_runs_numbers(digits_root, tmp_path, cli):
    part = digits_root / "part"
    stacked, alone = tmp_path / "stack", tmp_path / "alone"
    logs = ["--log", "csv", "--log", "jsonl", "--log", "tensorboard"]
    assert cli("train", "--partition", part, "--seeds", "0,1", "--out", stacked, *ARGS, *logs, "--plot").code == 0
    assert cli("train", "--partition", part, "--seed", "1", "--out", alone, *ARGS, *logs).code == 0
    expected = _log_rows(tmp_path / "alone.logs")
    assert {m for _r, m in expected} >= {"train/cohort_loss", "train/accuracy", "holdout/accuracy"}
    assert _log_rows(stacked / "seed-1.logs") == expected  # where `train --seed 1 --out STACK/seed-1` logs
    assert _log_rows(stacked / "seed-0.logs") != expected
    lines = [json.loads(ln) for ln in (stacked / "seed-1.logs" / "metrics.jsonl").read_text().splitlines()]
    assert [d["round"] for d in lines] == [1, 2, 3, 4]
    assert all(d[k] == expected[(d["round"], k)] for d in lines for k in d if k not in ("round", "time/elapsed_s"))
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = {}
    for name, folder in (("stack", stacked / "seed-1.logs"), ("alone", tmp_path / "alone.logs")):
        acc = EventAccumulator(str(folder / "tensorboard"))
        acc.Reload()
        events[name] = {tag: [(e.step, e.value) for e in acc.Scalars(tag)] for tag in acc.Tags()["scalars"]
                        if tag != "time/elapsed_s"}
    assert events["stack"] == events["alone"] and "holdout/accuracy" in events["stack"]
    for seed in (0, 1):  # --plot: each seed its curves; the logs stay outside the artifacts
        assert (stacked / f"seed-{seed}" / "curves.png").stat().st_size > 0
        assert not any("log" in p.name or "tfevents" in p.name for p in (stacked / f"seed-{seed}").rglob("*"))
    # --log-dir D: each seed under D/seed-<s>
    assert cli("train", "--partition", part, "--seeds", "0,1", "--out", tmp_path / "d", *ARGS, "--log", "csv",
               "--log-dir", tmp_path / "logs").code == 0
    assert sorted(p.name for p in (tmp_path / "logs").iterdir()) == ["seed-0", "seed-1"]
    assert _log_rows(tmp_path / "logs" / "seed-1") == expected


@pytest.mark.tracking
@pytest.mark.slow  # two W&B and two MLflow runs: ~15 s of CPU
def test_seeds_log_each_seed_as_its_own_wandb_and_mlflow_run(digits_root, tmp_path, cli, monkeypatch):
    from test_tracking_loggers import mlflow_run, wandb_run

    for name in ("WANDB_MODE", "WANDB_PROJECT", "MLFLOW_TRACKING_URI", "MLFLOW_EXPERIMENT_NAME"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("WANDB_DISABLE_GIT", "true")
    part, out = digits_root / "part", tmp_path / "stack"
    assert cli("train", "--partition", part, "--seeds", "0,1", "--out", out, *ARGS, "--log", "wandb", "--log",
               "mlflow", "--log", "csv").code == 0
    for seed in (0, 1):
        folder = out / f"seed-{seed}.logs"
        loss = {r: v for (r, m), v in _log_rows(folder).items() if m == "train/cohort_loss"}
        _info, config, series = wandb_run(folder, f"seed-{seed}")
        assert config["seed"] == seed and series["train/cohort_loss"] == loss
        run, history = mlflow_run(folder / "mlflow.db", f"seed-{seed}")
        assert run.data.params["seed"] == str(seed) and history["train/cohort_loss"] == loss


def test_seeds_with_nproc_or_under_torchrun_are_refused_before_any_work(digits_root, tmp_path, cli, monkeypatch):
    out = tmp_path / "o"
    run = cli("train", "--partition", digits_root / "part", "--seeds", "0,1", "--nproc", "2", "--out", out, *ARGS)
    assert run.code == 2 and "--nproc" in run.err and "--seeds" in run.err, run.err
    assert len(run.err.strip().splitlines()) == 1 and not out.exists()
    monkeypatch.setenv("WORLD_SIZE", "2")  # what torchrun sets in each rank
    run = cli("train", "--partition", digits_root / "part", "--seeds", "0,1", "--out", out, *ARGS)
    assert run.code == 2 and "torchrun" in run.err and len(run.err.strip().splitlines()) == 1, run.err
    assert not out.exists()
