"""`pflx simulate` end to end: a partition artifact other stages read, modes, policies, bad input."""

import json

import numpy as np
import pytest

from pfl_cli.artifacts import load_partition
from pfl_cli.cli.app import main
from pfl_cli.data import load_dataset


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("runs")
    assert main(["partition", "--dirichlet", "0.3", "--num-clients", "40", "--out", str(root / "part"), "--format", "quiet"]) == 0
    assert main(["mdm-fit", "--partition", str(root / "part"), "--components", "2", "--rounds", "20",
                 "--out", str(root / "mdm"), "--format", "quiet"]) == 0
    return root


def sim(out, *args):
    return main(["simulate", "--out", str(out), "--format", "json", *args])


def test_simulate_writes_a_partition_artifact(runs, tmp_path, capsys):
    assert sim(tmp_path / "s", "--model", str(runs / "mdm"), "--num-clients", "60", "--holdout-clients", "0.1") == 0
    part, info, art = load_partition(tmp_path / "s")
    assert art.stage == "partition" and part.num_clients == 60 and (part.role == 1).sum() == 6
    assert info["spec"] == "builtin:digits" and info["num_classes"] == 10
    stats = json.loads((tmp_path / "s/stats.json").read_text())
    assert stats["scheme_info"]["mode"] == "mdm" and "shortage" in stats["scheme_info"]
    labels = load_dataset("builtin:digits").y
    csv = np.loadtxt(tmp_path / "s/stats.csv", delimiter=",", skiprows=1, dtype=np.int64)
    own = np.bincount(np.repeat(np.arange(60), part.train_sizes) * 10 + labels[part.train_indices], minlength=600)
    assert np.array_equal(csv[:, 4:], own.reshape(60, 10))
    assert sim(tmp_path / "t", "--model", str(runs / "mdm"), "--num-clients", "60", "--holdout-clients", "0.1") == 0
    assert (tmp_path / "s/clients.npz").read_bytes() == (tmp_path / "t/clients.npz").read_bytes()
    # The simulated partition feeds mdm-fit like a real one.
    assert main(["mdm-fit", "--partition", str(tmp_path / "s"), "--components", "1", "--rounds", "3",
                 "--out", str(tmp_path / "refit"), "--format", "quiet"]) == 0


def test_no_replacement_is_disjoint(runs, tmp_path, capsys):
    assert sim(tmp_path / "s", "--model", str(runs / "mdm"), "--num-clients", "30", "--no-replacement") == 0
    part, _, _ = load_partition(tmp_path / "s")
    every = np.concatenate([part.train_indices, part.test_indices])
    assert len(every) == len(np.unique(every))


def test_shortage_policies(runs, tmp_path, capsys):
    args = ["--model", str(runs / "mdm"), "--num-clients", "400", "--no-replacement"]
    assert sim(tmp_path / "e", *args, "--shortage", "error") == 2
    err = capsys.readouterr().err
    assert "runs short" in err and "--shortage cap" in err and not (tmp_path / "e").exists()
    assert sim(tmp_path / "c", *args, "--shortage", "cap") == 0
    assert "ran short of server samples" in capsys.readouterr().err
    stats = json.loads((tmp_path / "c/stats.json").read_text())
    assert stats["scheme_info"]["shortage"]["samples_capped"] > 0


def test_baselines(runs, tmp_path, capsys):
    assert sim(tmp_path / "iid", "--model", str(runs / "mdm"), "--mode", "iid", "--num-clients", "50") == 0
    assert sim(tmp_path / "cond", "--mode", "conditional-iid", "--like", str(runs / "part"), "--test-fraction", "0") == 0
    true = np.loadtxt(runs / "part/stats.csv", delimiter=",", skiprows=1, dtype=np.int64)
    cond = np.loadtxt(tmp_path / "cond/stats.csv", delimiter=",", skiprows=1, dtype=np.int64)
    assert np.array_equal(cond[:, 4:], true[true[:, 1] == 0][:, 4:])


@pytest.mark.parametrize(
    "args, message",
    [
        (["--model", "{runs}/part", "--num-clients", "5"], "expected a 'mdm-fit' artifact, found stage 'partition'"),
        (["--like", "{runs}/mdm", "--mode", "conditional-iid"], "expected a 'partition' artifact, found stage 'mdm-fit'"),
        (["--num-clients", "5"], "mode mdm needs --model"),
        (["--model", "{runs}/mdm"], "needs --num-clients"),
        (["--model", "{runs}/mdm", "--num-clients", "5", "--shortage", "maybe"], "shortage must be one of"),
        (["--model", "{runs}/mdm", "--num-clients", "5", "--dataset", "builtin:nope"], "builtin"),
    ],
    ids=["model-wrong-stage", "like-wrong-stage", "no-model", "no-n", "bad-policy", "bad-dataset"],
)
def test_bad_input_is_one_line_exit_2(runs, tmp_path, capsys, args, message):
    code = sim(tmp_path / "out", *[a.format(runs=runs) for a in args])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and message in err[-1]
    assert not (tmp_path / "out").exists()


def test_model_category_count_must_match_the_dataset(runs, tmp_path, capsys):
    rng = np.random.default_rng(0)
    np.save(tmp_path / "c.npy", rng.multinomial(20, rng.dirichlet(np.ones(3), size=50)))
    assert main(["mdm-fit", "--counts", str(tmp_path / "c.npy"), "--components", "1", "--rounds", "3",
                 "--out", str(tmp_path / "m3"), "--format", "quiet"]) == 0
    assert sim(tmp_path / "out", "--model", str(tmp_path / "m3"), "--num-clients", "5") == 2
    assert "model has 3 categories but the server dataset has 10 classes" in capsys.readouterr().err
