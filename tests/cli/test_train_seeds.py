"""`pflx train --seeds`: the seeds trained stacked in one process, each written as `train --seed` writes it."""

import json

import torch

ARGS = ["--algorithm", "fedavg", "--rounds", "4", "--eval-every", "2", "--clients-per-round", "4", "--local-steps",
        "3", "--lr", "0.05", "--set", "momentum=0.5", "--format", "quiet"]


def _files(d):
    return sorted(p.relative_to(d).as_posix() for p in d.rglob("*") if p.is_file())


def test_seeds_write_each_run_as_a_separate_train_does(digits_root, tmp_path, cli):
    part = digits_root / "part"
    stacked, alone = tmp_path / "stack", tmp_path / "alone"
    assert cli("train", "--partition", part, "--seeds", "0,1", "--out", stacked, *ARGS).code == 0
    assert cli("train", "--partition", part, "--seed", "1", "--out", alone, *ARGS).code == 0
    got = stacked / "seed-1"
    assert _files(got) == _files(alone)
    a = torch.load(got / "model.pt", weights_only=True)["weights"]["client"]
    b = torch.load(alone / "model.pt", weights_only=True)["weights"]["client"]
    diff = max(float((a[k] - b[k]).abs().max()) for k in a)
    assert diff <= 1e-5, diff  # measured 0.0 (bit-identical) on this machine
    for name in ("config.yaml", "metrics.csv", "clients.csv"):
        assert (got / name).read_text() == (alone / name).read_text(), name
    ma, mb = (json.loads((d / "metrics.json").read_text()) for d in (got, alone))
    assert ma == mb
    manifest = json.loads((got / "manifest.json").read_text())
    assert manifest["stacked"] == {"seeds": [0, 1], "runs": 2} and manifest["seed"] == 1
    s0 = torch.load(stacked / "seed-0" / "model.pt", weights_only=True)["weights"]["client"]
    assert any(not torch.equal(s0[k], a[k]) for k in a)  # the seeds differ
    # the same command again: every run is up to date, nothing is retrained or rewritten
    before = (got / "manifest.json").read_text()
    assert cli("train", "--partition", part, "--seeds", "0,1", "--out", stacked, *ARGS).code == 0
    assert (got / "manifest.json").read_text() == before


def test_seeds_of_an_algorithm_that_cannot_stack_are_refused_and_nothing_is_written(digits_root, tmp_path, cli):
    out = tmp_path / "ditto"
    run = cli("train", "--partition", digits_root / "part", "--seeds", "0,1", "--out", out,
              *[a if a != "fedavg" else "ditto" for a in ARGS])
    assert run.code == 2
    assert "ditto" in run.err and "cannot train runs stacked" in run.err and len(run.err.strip().splitlines()) == 1
    assert not out.exists()


def test_bad_seeds_are_refused_in_one_line(digits_root, tmp_path, cli):
    for seeds, words in (("0,x", "comma-separated integers"), ("1,1", "distinct")):
        run = cli("train", "--partition", digits_root / "part", "--seeds", seeds, "--out", tmp_path / "o", *ARGS)
        assert run.code == 2 and words in run.err, run.err
    run = cli("train", "--partition", digits_root / "part", "--seeds", "0,1", "--seed", "3", "--out", tmp_path / "o",
              *ARGS)
    assert run.code == 2 and "--seeds and --seed" in run.err
    assert not (tmp_path / "o").exists()


def test_a_set_seed_beside_seeds_is_refused_not_ignored(digits_root, tmp_path, cli):
    """``--set seed=5`` with ``--seeds 0,1`` trained seeds 0 and 1 and dropped the 5 without a word (``--seed 5`` is
    refused): a --set key is the highest layer of the config (DESIGN.md §5), so it is refused, not outranked."""
    run = cli("train", "--partition", digits_root / "part", "--seeds", "0,1", "--set", "seed=5", "--out",
              tmp_path / "o", *ARGS)
    assert run.code == 2 and "--seeds and --set seed" in run.err and len(run.err.strip().splitlines()) == 1, run.err
    assert not (tmp_path / "o").exists()
