"""`train` and `predict` warn in one line when the accuracy they release is within 5 points of chance (issue 33)."""

import json
import math

import pytest

from pfl_cli.cli.chance import MARGIN, chance_level, near_chance

WARNING = "within 5 points of chance"


def test_the_rule_is_chance_plus_five_points_on_the_unmasked_mean():
    assert MARGIN == 0.05 and chance_level(10) == 0.1 and chance_level(2) == 0.5
    assert near_chance({"train": 0.1499}, 10, "fedavg") is not None
    assert near_chance({"train": 0.1501}, 10, "fedavg") is None
    assert near_chance({"train": 0.54}, 2, "fedavg") is not None and near_chance({"train": 0.56}, 2, "fedavg") is None
    # a group without a score (unlabeled clients not scored) is not judged
    assert near_chance({"train": None, "holdout": math.nan}, 10, "fedavg") is None
    line = near_chance({"train": 0.081, "holdout": 0.9}, 10, "flowdup")
    assert line == ("the train clients' 8.1% unmasked mean accuracy is within 5 points of chance (10.0% for 10 "
                    "classes): flowdup's settings may not suit this task; `pflx tune --algorithm flowdup` searches "
                    "them on validation data.")
    both = near_chance({"train": 0.081, "holdout": 0.12}, 10, "flowdup")
    assert "the train clients' 8.1% and the holdout clients' 12.0% unmasked mean accuracy are" in both


@pytest.fixture(scope="module")
def part(tmp_path_factory):
    from pfl_cli.cli.app import main

    root = tmp_path_factory.mktemp("chance")
    assert main(["partition", "--dataset", "builtin:digits", "--iid", "--num-clients", "10", "--holdout-clients",
                 "2", "--test-fraction", "0.3", "--out", str(root / "part"), "--format", "quiet"]) == 0
    return root


FAST = ["--algorithm", "fedavg", "--clients-per-round", "4", "--local-steps", "5", "--eval-every", "1"]


def _train(cli, root, name, *extra):
    run = cli("train", "--partition", root / "part", "--out", root / name, *FAST, *extra)
    assert run.code == 0, run.err
    return run, json.loads((root / name / "metrics.json").read_text())


def test_a_run_left_at_chance_warns_once_naming_pflx_tune_and_predict_too(part, cli):
    # lr 1e-7: one round leaves the seeded initialization where it was, at chance
    run, m = _train(cli, part, "stuck", "--rounds", "1", "--lr", "1e-7")
    assert m["train"]["mean_accuracy"] < 0.15 and m["holdout"]["mean_accuracy"] < 0.15  # the premise
    lines = [line for line in run.err.splitlines() if WARNING in line]
    assert len(lines) == 1 and lines[0].startswith("pflx: warning: the train clients'")
    assert "`pflx tune --algorithm fedavg`" in lines[0] and "the holdout clients'" in lines[0]
    pred = cli("predict", "--model", part / "stuck", "--partition", part / "part", "--out", part / "stuck-pred")
    assert pred.code == 0, pred.err
    assert [line for line in pred.err.splitlines() if WARNING in line] == [
        f"pflx: warning: {near_chance({'holdout': json.loads((part / 'stuck-pred' / 'metrics.json').read_text())['mean_accuracy_nolm']}, 10, 'fedavg')}"]
    quiet = cli("train", "--partition", part / "part", "--out", part / "stuck-q", *FAST, "--rounds", "1", "--lr",
                "1e-7", "--format", "quiet")
    assert quiet.code == 0 and quiet.err == ""  # quiet prints nothing


def test_a_run_that_learns_does_not_warn(part, cli):
    run, m = _train(cli, part, "learns", "--rounds", "5", "--lr", "0.1")
    assert m["train"]["mean_accuracy"] > 0.5  # the premise: far above chance
    assert WARNING not in run.err
    pred = cli("predict", "--model", part / "learns", "--partition", part / "part", "--out", part / "learns-pred")
    assert pred.code == 0 and WARNING not in pred.err


def test_a_dp_run_releases_no_accuracy_and_never_warns(part, cli):
    # the same stuck run under --dp: its nonprivate diagnostics are at chance, but nothing was released
    run = cli("train", "--partition", part / "part", "--out", part / "stuck-dp", *FAST, "--rounds", "1", "--lr",
              "1e-7", "--set", "normalize=false", "--dp", "eps=4,delta=1e-6,clip=0.5,population=1000,noise=seeded",
              "--write-nonprivate")
    assert run.code == 0, run.err
    nonprivate = json.loads((part / "stuck-dp" / "nonprivate.json").read_text())
    assert nonprivate["train"]["mean_accuracy"] < 0.15  # the premise: a non-DP run would have warned
    assert WARNING not in run.err
