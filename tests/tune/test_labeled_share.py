"""Validation clients carved from a partition with unlabeled train clients keep the labeled share (issue 39, item 5).

FLowDUP's headline setting (thesis ch. 5: rotated clients, p = 0.1 / 0.2 of the train clients labeled)
once had every labeled client carved into validation clients, and every trial failed.
"""

import json

import numpy as np
import pytest

from pfl_cli.errors import InputError
from pfl_cli.partition.base import Partition
from pfl_cli.tune.split import validation_partition


def _partition(n_train: int, n_labeled: int, n_holdout: int = 2, size: int = 6) -> Partition:
    n = n_train + n_holdout
    labeled = np.zeros(n, np.uint8)
    labeled[np.random.default_rng(1).choice(n_train, n_labeled, replace=False)] = 1
    role = np.r_[np.zeros(n_train), np.ones(n_holdout)].astype(np.uint8)
    return Partition(client_id=np.arange(100, 100 + n), role=role,
                     train_offsets=np.arange(n + 1) * size, train_indices=np.arange(n * size),
                     test_offsets=np.arange(n + 1), test_indices=n * size + np.arange(n), labeled=labeled)


@pytest.mark.parametrize("n_train, n_labeled", [(48, 5), (48, 10), (40, 2), (540, 54), (20, 20)])
def test_labeled_training_clients_keep_the_partitions_share(n_train, n_labeled):
    part = _partition(n_train, n_labeled)
    for seed in range(3):
        v = validation_partition(part, val_fraction=0.2, val_clients=0.2, rng=np.random.default_rng(seed),
                                 unlabeled_validation_clients=True)
        kept = v.role == 0
        was = np.asarray(part.labeled)[:n_train].astype(bool)
        # labeled as the partition marks them (the validation clients are relabeled 0 for the trial)
        left = was[kept]
        assert left.sum() >= 1
        assert left.mean() >= was.mean() - 1e-12, (seed, left.sum(), kept.sum())
        assert 1 <= (v.role == 1).sum() < n_train


def test_labeled_only_validation_refused_when_it_lowers_the_share():
    part = _partition(20, 5)
    with pytest.raises(InputError, match="--validation-clients 0.2: only labeled clients can validate"):
        validation_partition(part, val_fraction=0.2, val_clients=0.2, rng=np.random.default_rng(0))


@pytest.mark.parametrize("prevalence", ["0.1", "0.2"])
def test_flowdup_default_study_runs_on_few_labeled_clients(tmp_path, cli, prevalence):
    part = tmp_path / "rot"
    run = cli("partition", "--dataset", "builtin:digits", "--iid", "--num-clients", "60", "--holdout-clients", "12",
              "--test-fraction", "0.3", "--label-prevalence", prevalence, "--rotations", "0,90,180,270",
              "--out", part)
    assert run.code == 0, run.err
    run = cli("tune", "--algorithm", "flowdup", "--partition", part, "--out", tmp_path / "t", "--trials", "2",
              "--rounds", "2", "--eval-every", "1", "--set", "subspace_dim=20", "--set", "feature_dim=8",
              "--set", "hyper_hidden=8")
    assert run.code == 0, run.err
    metrics = json.loads((tmp_path / "t" / "metrics.json").read_text())
    assert metrics["trials"].get("complete", 0) == 2, metrics["trials"]
