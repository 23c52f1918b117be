"""Fixtures of the engine tests."""

import numpy as np
import pytest

N_CLIENTS, N_TRAIN, N_TEST = 12, 20, 8


@pytest.fixture(scope="module")
def equal_store():
    """Digits (scaled by the public bound 16) over 12 clients of exactly 20 train and 8 test samples."""
    from pfl_cli.data import load_dataset
    from pfl_cli.fl.store import build_store
    from pfl_cli.partition.base import Partition

    ds = load_dataset("builtin:digits")
    order = np.random.default_rng(0).permutation(ds.num_samples)
    per = N_TRAIN + N_TEST
    train = np.concatenate([order[i * per:i * per + N_TRAIN] for i in range(N_CLIENTS)])
    test = np.concatenate([order[i * per + N_TRAIN:(i + 1) * per] for i in range(N_CLIENTS)])
    part = Partition(client_id=np.arange(N_CLIENTS), role=np.zeros(N_CLIENTS, np.uint8),
                     train_offsets=np.arange(N_CLIENTS + 1) * N_TRAIN, train_indices=train,
                     test_offsets=np.arange(N_CLIENTS + 1) * N_TEST, test_indices=test)
    return build_store(ds.x / 16.0, ds.y, ds.num_classes, part, val_fraction=0.0, rng=None, device="cpu",
                       normalize=False)
