"""What "one local epoch", the client lr and input normalization mean in pflx (docs/performance/peers.md).

Users compare learning curves across tools; PFLlib, for one, runs floor(n / B) steps per epoch
(``drop_last=True``), plain SGD without momentum, and inputs scaled to [-1, 1]. These tests pin
pflx's meanings so the page that explains the difference stays true.
"""

import math

import numpy as np
import torch

from pfl_cli.fl.api import make_algorithm
from pfl_cli.registry import train_config
from pfl_cli.fl.store import build_store
from pfl_cli.partition import PartitionConfig, partition_labels
from pfl_cli.rng import make_rng


def _cifar_like(sizes=(100, 64, 37), holdout=1):
    rng = np.random.default_rng(0)
    n = 400
    x = rng.integers(0, 256, size=(n, 3, 8, 8), dtype=np.uint8)
    x[:, 1] //= 2  # channels with different statistics
    y = rng.integers(0, 10, n)
    part = partition_labels(y, PartitionConfig(scheme="iid", num_clients=len(sizes) + holdout, test_fraction=0.2,
                                               holdout_clients=holdout), num_classes=10, rng=make_rng(0, "p"))
    return x, y, part


def test_one_local_epoch_is_a_shuffled_pass_of_ceil_n_over_b_steps():
    x, y, part = _cifar_like()
    store = build_store(x, y, 10, part, val_fraction=0.0, rng=make_rng(0, "v"), device="cpu")
    cfg = train_config("fedavg", local_epochs=1, batch_size=32, model_arch="mlp")
    alg = make_algorithm(cfg, store)
    clients = torch.as_tensor(store.clients(0))
    batches = alg.local_batches(clients, torch.Generator().manual_seed(0), **alg.round_schedule())
    sizes = store.fit.length[clients].tolist()
    assert batches.client_steps.tolist() == [math.ceil(n / 32) for n in sizes]  # drop_last=False
    index, mask, active = batches.materialize()
    for i, n in enumerate(sizes):
        taken = index[i][active[i]][mask[i][active[i]] > 0]
        assert sorted(taken.tolist()) == sorted(store.fit.rows(clients[i:i + 1])[0][0, :n].tolist())  # each once
        assert mask[i][active[i]].sum(1)[-1] == n - (math.ceil(n / 32) - 1) * 32  # the short last batch trains
        assert taken[:n].tolist() != sorted(taken[:n].tolist())  # shuffled, not in stored order


def test_inputs_are_standardized_with_train_pool_statistics_per_channel():
    x, y, part = _cifar_like()
    store = build_store(x, y, 10, part, val_fraction=0.25, rng=make_rng(0, "v"), device="cpu")
    train = store.clients(0)
    pool = torch.cat([store.fit.rows(torch.as_tensor([c]))[0][0, :int(store.fit.length[c])] for c in train])
    reference = x[pool.numpy()].astype(np.float64)
    assert np.allclose(store.mean.numpy().ravel(), reference.mean(axis=(0, 2, 3)), rtol=1e-5)
    assert np.allclose(store.std.numpy().ravel(), reference.std(axis=(0, 2, 3)), rtol=1e-5)
    z = store.inputs(pool).double()  # unit variance per channel, not [0, 1] or [-1, 1]
    assert torch.allclose(z.mean((0, 2, 3)), torch.zeros(3, dtype=z.dtype), atol=1e-4)
    assert torch.allclose(z.std((0, 2, 3), unbiased=False), torch.ones(3, dtype=z.dtype), atol=1e-4)
    # holdout clients, test samples and the validation split do not enter the statistics
    assert not np.allclose(store.mean.numpy().ravel(), x.astype(np.float64).mean(axis=(0, 2, 3)), rtol=1e-6)


def test_the_client_optimizer_defaults_the_docs_compare():
    cfg = train_config("fedavg")
    assert (cfg.lr, cfg.momentum, cfg.client_clip, cfg.batch_size, cfg.normalize) == (2e-3, 0.9, 50.0, 32, True)
