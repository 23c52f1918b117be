"""`pflx tune --stack K` end to end: the study and its artifact as one trial at a time writes them."""

import csv

import pytest

TUNE = ["--algorithm", "fedavg", "--trials", "3", "--rounds", "3", "--eval-every", "1", "--clients-per-round", "4",
        "--local-steps", "3", "--sampler", "random", "--pruner", "none", "--format", "quiet"]


def _rows(path):
    with open(path) as f:
        return list(csv.DictReader(f))


# two studies (~40 s on the shared CPU); tests/tune/test_stack_study.py holds the same in the default tier
@pytest.mark.slow
def test_tune_stack_writes_the_study_one_at_a_time_writes(digits_root, tmp_path, cli):
    part = digits_root / "part"
    assert cli("tune", "--partition", part, "--stack", "2", "--out", tmp_path / "stacked", *TUNE).code == 0
    assert cli("tune", "--partition", part, "--out", tmp_path / "alone", *TUNE).code == 0
    a, b = _rows(tmp_path / "stacked" / "trials.csv"), _rows(tmp_path / "alone" / "trials.csv")
    assert len(a) == 3 and [r["lr"] for r in a] == [r["lr"] for r in b]
    assert [round(float(r["value"]), 6) for r in a] == [round(float(r["value"]), 6) for r in b]
    assert (tmp_path / "stacked" / "best.yaml").read_text() == (tmp_path / "alone" / "best.yaml").read_text()


def test_stack_with_an_algorithm_that_cannot_stack_is_refused(digits_root, tmp_path, cli):
    out = tmp_path / "t"
    run = cli("tune", "--partition", digits_root / "part", "--algorithm", "ditto", "--stack", "2", "--trials", "2",
              "--rounds", "2", "--out", out, "--format", "quiet")
    assert run.code == 2 and "cannot train runs stacked" in run.err and len(run.err.strip().splitlines()) == 1
    assert not out.exists()
