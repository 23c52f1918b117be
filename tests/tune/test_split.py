"""The tuning partition holds validation data only: no test sample, no holdout client, every train sample once."""

import numpy as np
import pytest

from pfl_cli.errors import InputError
from pfl_cli.tune.split import validation_partition


def _reference_counts(n: int, fraction: float) -> int:
    """The slow, obvious rule: at least one validation sample of a client with two or more, one fit sample kept."""
    if n < 2:  # (a validation client: fraction at least 0.5)
        return 0
    return min(max(1, int(round(fraction * n))), n - 1)


@pytest.mark.parametrize("fraction, clients", [(0.2, 0.0), (0.3, 0.25), (0.5, 0.1)])
def test_validation_partition_reads_only_train_clients_train_samples(digits_clients, fraction, clients):
    _, part = digits_clients
    v = validation_partition(part, val_fraction=fraction, val_clients=clients, rng=np.random.default_rng(3))
    train = np.flatnonzero(part.role == 0)
    assert v.num_clients == len(train)
    np.testing.assert_array_equal(v.client_id, part.client_id[train])
    forbidden = set(part.test_indices.tolist()) | {int(i) for j in np.flatnonzero(part.role == 1)
                                                   for i in part.train_of(j)}
    for k, j in enumerate(train):  # per client, against a loop over the original partition
        fit, val = set(v.train_of(k).tolist()), set(v.test_of(k).tolist())
        assert fit.isdisjoint(val)
        assert fit | val == set(part.train_of(j).tolist())
        share = max(fraction, 0.5) if v.role[k] == 1 else fraction
        assert len(val) == _reference_counts(len(part.train_of(j)), share)
        assert not (fit | val) & forbidden
    expected = max(1, int(round(clients * len(train)))) if clients else 0
    assert int(np.sum(v.role == 1)) == expected


def test_the_split_depends_on_the_rng_only():
    from pfl_cli.partition.base import Partition

    part = Partition(client_id=np.arange(3), role=np.array([0, 0, 1], np.uint8),
                     train_offsets=np.array([0, 5, 10, 15]), train_indices=np.arange(15),
                     test_offsets=np.array([0, 1, 2, 3]), test_indices=np.array([15, 16, 17]))
    a = validation_partition(part, val_fraction=0.4, val_clients=0, rng=np.random.default_rng(0))
    b = validation_partition(part, val_fraction=0.4, val_clients=0, rng=np.random.default_rng(0))
    np.testing.assert_array_equal(a.test_indices, b.test_indices)
    assert len(a.test_indices) == 4 and not set(a.test_indices) & {10, 11, 12, 13, 14, 15, 16, 17}


def test_validation_clients_can_be_marked_unlabeled(digits_clients):
    _, part = digits_clients
    v = validation_partition(part, val_fraction=0.2, val_clients=0.25, rng=np.random.default_rng(0),
                             unlabeled_validation_clients=True)
    np.testing.assert_array_equal(v.labeled == 0, v.role == 1)


@pytest.mark.parametrize("kwargs, message", [
    ({"val_fraction": 0.0, "val_clients": 0.0}, "val_fraction must be in"),
    ({"val_fraction": 1.0, "val_clients": 0.0}, "val_fraction must be in"),
    ({"val_fraction": 0.2, "val_clients": 1.0}, "val_clients must be in"),
    ({"val_fraction": 0.2, "val_clients": 0.99}, "cannot be carved"),
])
def test_impossible_splits_are_refused(digits_clients, kwargs, message):
    _, part = digits_clients
    with pytest.raises(InputError, match=message):
        validation_partition(part, rng=np.random.default_rng(0), **kwargs)
