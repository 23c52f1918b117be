"""The vectorized cohort equals the one-client-at-a-time loop; batches are what they claim."""

import numpy as np
import pytest
import torch

from pfl_cli.fl.batches import sample_batches
from pfl_cli.fl.cohort import local_sgd, local_sgd_reference
from pfl_cli.fl.store import build_store
from pfl_cli.models import client_model
from pfl_cli.rng import make_rng


@pytest.fixture(scope="module")
def store(digits_clients):
    ds, part = digits_clients
    return build_store(ds.x, ds.y, ds.num_classes, part, val_fraction=0.2, rng=make_rng(0, "v"), device="cpu")


def _start(net, c, seed=0):
    g = torch.Generator().manual_seed(seed)
    return {k: v.detach().unsqueeze(0).repeat(c, *[1] * v.dim()) + 0.1 * torch.randn(c, *v.shape, generator=g)
            for k, v in net.named_parameters()}


@pytest.mark.parametrize("opts", [
    dict(lr=0.05, momentum=0.9, weight_decay=1e-3, clip=1.0),   # clipping active
    dict(lr=0.1, momentum=0.0, weight_decay=0.0, clip=0.0),
    dict(lr=0.05, momentum=0.5, weight_decay=0.0, clip=50.0),
])
def test_vmapped_local_sgd_equals_sequential_sgd(store, opts):
    net = client_model("mlp", (64,), 10, hidden=(16,))
    clients = torch.tensor([0, 3, 5, 7, 11])
    index, mask = sample_batches(store.fit, clients, 12, 8, torch.Generator().manual_seed(1))
    start = _start(net, len(clients))
    fast, fast_loss = local_sgd(net, start, store, index, mask, **opts)
    slow, slow_loss = local_sgd_reference(net, start, store, index, mask, **opts)
    for k in fast:
        torch.testing.assert_close(fast[k], slow[k], rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(fast_loss, slow_loss.to(fast_loss.dtype), rtol=1e-5, atol=1e-6)
    assert not torch.equal(fast["fc1.weight"], start["fc1.weight"])  # it trained


def test_inactive_steps_leave_a_client_alone(store):
    net = client_model("mlp", (64,), 10, hidden=(8,))
    clients = torch.tensor([1, 2, 4])
    index, mask = sample_batches(store.fit, clients, 6, 4, torch.Generator().manual_seed(2))
    active = torch.tensor([[True] * 6, [True, True, False, False, False, False], [False] * 6])
    start = _start(net, 3)
    fast, _ = local_sgd(net, start, store, index, mask, lr=0.1, momentum=0.9, active=active)
    slow, _ = local_sgd_reference(net, start, store, index, mask, lr=0.1, momentum=0.9, active=active)
    for k in fast:
        torch.testing.assert_close(fast[k], slow[k], rtol=1e-5, atol=1e-6)
        assert torch.equal(fast[k][2], start[k][2])


def test_batches_are_distinct_samples_of_the_client(store):
    clients = torch.arange(store.num_clients)
    index, mask = sample_batches(store.fit, clients, 5, 8, torch.Generator().manual_seed(3))
    rows, length = store.fit.rows(clients)
    for i in range(len(clients)):
        own = set(rows[i, : length[i]].tolist())
        for s in range(5):
            picked = index[i, s][mask[i, s] > 0].tolist()
            assert len(picked) == min(8, int(length[i]))
            assert len(set(picked)) == len(picked)  # without replacement
            assert set(picked) <= own


def test_a_client_smaller_than_the_batch_uses_all_its_samples():
    from pfl_cli.fl.store import Padded

    padded = Padded.from_csr(np.array([0, 0, 0, 1, 1, 1, 1, 1, 1]), np.arange(9), 2, "cpu")
    index, mask = sample_batches(padded, torch.tensor([0, 1]), 4, 5, torch.Generator().manual_seed(0))
    assert index.shape == (2, 4, 5)
    assert mask[0].sum(1).tolist() == [3, 3, 3, 3]
    assert all(sorted(index[0, s, :3].tolist()) == [0, 1, 2] for s in range(4))
    assert mask[1].sum(1).tolist() == [5, 5, 5, 5]


def test_batches_depend_only_on_the_generator_seed(store):
    clients = torch.tensor([0, 1, 2])
    a = sample_batches(store.fit, clients, 3, 4, torch.Generator().manual_seed(7))[0]
    b = sample_batches(store.fit, clients, 3, 4, torch.Generator().manual_seed(7))[0]
    c = sample_batches(store.fit, clients, 3, 4, torch.Generator().manual_seed(8))[0]
    assert torch.equal(a, b) and not torch.equal(a, c)


def test_vmapped_lenet_cohort_equals_sequential_sgd():
    """The image path: vmap over batched conv weights (Table B.1 LeNet) on CIFAR-shaped data."""
    from pfl_cli.partition import PartitionConfig, partition_labels

    rng = np.random.default_rng(0)
    x = rng.integers(0, 256, size=(120, 3, 32, 32), dtype=np.uint8)
    y = np.repeat(np.arange(10), 12)
    part = partition_labels(y, PartitionConfig(scheme="pathological", classes_per_client=2, class_shares="equal",
                                               num_clients=6, test_fraction=0.2), num_classes=10, rng=make_rng(0, "p"))
    store = build_store(x, y, 10, part, val_fraction=0.0, rng=None, device="cpu")
    net = client_model("auto", (3, 32, 32), 10)
    clients = torch.tensor([0, 2, 5])
    index, mask = sample_batches(store.fit, clients, 3, 4, torch.Generator().manual_seed(4))
    start = _start(net, 3)
    opts = dict(lr=0.01, momentum=0.9, weight_decay=1e-4, clip=5.0)
    fast, _ = local_sgd(net, start, store, index, mask, **opts)
    slow, _ = local_sgd_reference(net, start, store, index, mask, **opts)
    for k in fast:
        torch.testing.assert_close(fast[k], slow[k], rtol=1e-4, atol=1e-5)
