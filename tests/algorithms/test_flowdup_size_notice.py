"""FLowDUP's size notice (issue 39, item 5): `train` and `tune` say in one line when a partition has fewer labeled
train clients than FLowDUP was measured to need to beat FedAvg (benchmarks/flowdup_curve.py), and nothing otherwise."""

import dataclasses

import numpy as np
import pytest

from pfl_cli import registry
from pfl_cli.algorithms.flowdup import MEASURED_AHEAD_FROM, FLowDUP
from pfl_cli.partition.base import Partition

NOTICE = "FLowDUP was measured ahead of FedAvg"
TINY = ["--rounds", "1", "--eval-every", "1", "--clients-per-round", "4", "--set", "subspace_dim=20",
        "--set", "feature_dim=8", "--set", "hyper_hidden=8"]


def _partition(n_train: int, n_labeled: int, n_holdout: int = 2, labeled_holdout: bool = False) -> Partition:
    n = n_train + n_holdout
    labeled = np.zeros(n, np.uint8)
    labeled[np.random.default_rng(0).choice(n_train, n_labeled, replace=False)] = 1
    labeled[n_train:] = int(labeled_holdout)
    return Partition(client_id=np.arange(n), role=np.r_[np.zeros(n_train), np.ones(n_holdout)].astype(np.uint8),
                     train_offsets=np.arange(n + 1) * 2, train_indices=np.arange(2 * n),
                     test_offsets=np.arange(n + 1), test_indices=2 * n + np.arange(n), labeled=labeled)


def test_the_notice_counts_the_labeled_train_clients_against_the_measured_size():
    n = MEASURED_AHEAD_FROM
    line = FLowDUP.partition_notice(_partition(5 * n, n - 1))
    assert line is not None and "\n" not in line
    assert line.startswith(f"flowdup: this partition has {n - 1} labeled train clients; {NOTICE} on unlabeled new "
                           f"clients from {n} on")
    assert "docs/algorithms/flowdup.md" in line and "`pflx tune --algorithm fedavg`" in line
    assert FLowDUP.partition_notice(_partition(5 * n, n)) is None
    assert FLowDUP.partition_notice(_partition(n, n)) is None  # every train client labeled
    # labeled holdout clients do not train: they do not count
    assert f"has {n - 1} labeled" in FLowDUP.partition_notice(_partition(5 * n, n - 1, n_holdout=3 * n,
                                                                         labeled_holdout=True))
    # a partition without a labeled mark: every train client has labels
    assert FLowDUP.partition_notice(dataclasses.replace(_partition(n, 1), labeled=None)) is None
    assert "has 1 labeled train client;" in FLowDUP.partition_notice(dataclasses.replace(_partition(1, 1),
                                                                                        labeled=None))


@pytest.mark.parametrize("name", registry.names())
def test_every_algorithms_notice_is_one_line_or_none(name):
    """Generic: an algorithm that declares a partition notice gives one line or None, on a small and a large
    partition; the others declare none (train and tune print nothing for them)."""
    notice = getattr(registry.train_config(name).algorithm_class, "partition_notice", None)
    if notice is None:
        return
    for part in (_partition(4, 1), _partition(2000, 1000)):
        line = notice(part)
        assert line is None or (isinstance(line, str) and line and "\n" not in line), (name, line)
    assert notice(_partition(2000, 1000)) is None  # a large federation: nothing to say


@pytest.fixture(scope="module")
def few(tmp_path_factory):
    """Digits over 16 clients, 4 of them new and unlabeled, half the 12 train clients labeled (6)."""
    from pfl_cli.cli.app import main

    root = tmp_path_factory.mktemp("notice")
    assert main(["partition", "--dataset", "builtin:digits", "--iid", "--num-clients", "16", "--holdout-clients",
                 "4", "--test-fraction", "0.3", "--label-prevalence", "0.5", "--out", str(root / "part"),
                 "--format", "quiet"]) == 0
    return root


def _notices(err: str) -> list[str]:
    return [line for line in err.splitlines() if NOTICE in line]


def test_train_and_tune_say_it_once_for_flowdup_below_the_measured_size(few, cli):
    assert MEASURED_AHEAD_FROM > 6  # the premise: the fixture is below the measured size
    run = cli("train", "--algorithm", "flowdup", "--partition", few / "part", "--out", few / "train", *TINY)
    assert run.code == 0, run.err
    lines = _notices(run.err)
    assert len(lines) == 1 and lines[0].startswith("pflx: warning: flowdup: this partition has 6 labeled train "
                                                   f"clients; {NOTICE} on unlabeled new clients from")
    run = cli("tune", "--algorithm", "flowdup", "--partition", few / "part", "--out", few / "tune", "--trials", "1",
              *TINY)
    assert run.code == 0, run.err
    assert len(_notices(run.err)) == 1 and "has 6 labeled train clients" in _notices(run.err)[0]
    # FedAvg on the same partition: no notice
    run = cli("train", "--algorithm", "fedavg", "--partition", few / "part", "--out", few / "fedavg", "--rounds", "1",
              "--eval-every", "1", "--local-steps", "1")
    assert run.code == 0, run.err
    assert _notices(run.err) == []
