"""PeFLL on the run axis end to end: `pflx train --seeds` and `pflx tune --stack` write what one run at a time writes."""

import csv
import json

import torch

TRAIN = ["--algorithm", "pefll", "--rounds", "4", "--eval-every", "2", "--clients-per-round", "4", "--local-steps",
         "3", "--batch-size", "8", "--lr", "0.05", "--set", "server_lr=5e-3", "--format", "quiet"]
TUNE = ["--algorithm", "pefll", "--trials", "2", "--rounds", "3", "--eval-every", "1", "--clients-per-round", "4",
        "--local-steps", "3", "--batch-size", "8", "--space", "lr=log:1e-2:1e-1", "--space", "lambda_h=choice:0,1e-3",
        "--sampler", "random", "--pruner", "none", "--format", "quiet"]


def _flat(tree, prefix=""):
    out = {}
    for k, v in tree.items():
        out.update(_flat(v, f"{prefix}{k}.") if isinstance(v, dict) else {f"{prefix}{k}": v})
    return out


def _files(d):
    return sorted(p.relative_to(d).as_posix() for p in d.rglob("*") if p.is_file())


def test_pefll_seeds_write_each_run_as_a_separate_train_does(digits_root, tmp_path, cli):
    part = digits_root / "part"
    stacked, alone = tmp_path / "stack", tmp_path / "alone"
    assert cli("train", "--partition", part, "--seeds", "0,1", "--out", stacked, *TRAIN).code == 0
    assert cli("train", "--partition", part, "--seed", "1", "--out", alone, *TRAIN).code == 0
    got = stacked / "seed-1"
    assert _files(got) == _files(alone)
    a = _flat(torch.load(got / "model.pt", weights_only=True)["weights"])
    b = _flat(torch.load(alone / "model.pt", weights_only=True)["weights"])
    assert a.keys() == b.keys() and {"hypernetwork", "embedding"} <= {k.split(".")[0] for k in a}
    diff = max(float((a[k].double() - b[k].double()).abs().max()) for k in a)
    assert diff == 0.0, diff  # bit-identical (measured on the 2-core dev CPU, one thread)
    for name in ("config.yaml", "metrics.csv", "clients.csv"):
        assert (got / name).read_text() == (alone / name).read_text(), name
    assert json.loads((got / "metrics.json").read_text()) == json.loads((alone / "metrics.json").read_text())
    s0 = _flat(torch.load(stacked / "seed-0" / "model.pt", weights_only=True)["weights"])
    assert any(not torch.equal(s0[k], a[k]) for k in a)  # the seeds differ


def _rows(path):
    with open(path) as f:
        return list(csv.DictReader(f))


def test_pefll_tune_stack_runs_the_study_one_trial_at_a_time_runs(digits_root, tmp_path, cli):
    """Two trials drawn by the seeded random sampler, trained as one stack: the same configs, scores and best.yaml
    as the unstacked study (the trials differ in lr and lambda_h, keys that stack)."""
    part = digits_root / "part"
    assert cli("tune", "--partition", part, "--stack", "2", "--out", tmp_path / "stacked", *TUNE).code == 0
    assert cli("tune", "--partition", part, "--out", tmp_path / "alone", *TUNE).code == 0
    a, b = _rows(tmp_path / "stacked" / "trials.csv"), _rows(tmp_path / "alone" / "trials.csv")
    assert len(a) == 2 and [(r["lr"], r["lambda_h"]) for r in a] == [(r["lr"], r["lambda_h"]) for r in b]
    assert a[0]["lr"] != a[1]["lr"]
    assert [float(r["value"]) for r in a] == [float(r["value"]) for r in b]
    assert (tmp_path / "stacked" / "best.yaml").read_text() == (tmp_path / "alone" / "best.yaml").read_text()
    assert "algorithm: pefll" in (tmp_path / "stacked" / "best.yaml").read_text()


def test_pefll_seeds_under_dp_each_seed_is_its_own_mechanism(digits_root, tmp_path, cli):
    """Under --dp each stacked seed is its own mechanism: with repeatable noise its model and privacy.json are the
    separate run's, bit for bit (its noise is its own seed's stream, not another seed's)."""
    part = digits_root / "part"
    dp = ["--set", "normalize=false", "--no-standardize-descriptor", "--embed-dim", "4",
          "--dp", "eps=4,clip=1,population=100,noise=seeded"]
    stacked, alone = tmp_path / "stack", tmp_path / "alone"
    assert cli("train", "--partition", part, "--seeds", "0,1", "--out", stacked, *TRAIN, *dp).code == 0
    assert cli("train", "--partition", part, "--seed", "1", "--out", alone, *TRAIN, *dp).code == 0
    got = stacked / "seed-1"
    assert _files(got) == _files(alone) and "privacy.json" in _files(got)
    a = _flat(torch.load(got / "model.pt", weights_only=True)["weights"])
    b = _flat(torch.load(alone / "model.pt", weights_only=True)["weights"])
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    for name in ("config.yaml", "privacy.json", "metrics.json"):
        assert (got / name).read_text() == (alone / name).read_text(), name
    s0 = _flat(torch.load(stacked / "seed-0" / "model.pt", weights_only=True)["weights"])
    assert any(not torch.equal(s0[k], a[k]) for k in a)
