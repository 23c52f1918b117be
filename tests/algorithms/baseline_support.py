"""Helpers of the personalized baselines' tests: a round against its per-client reference
(test_algorithms_*.py) and the ring learning tests (test_*_learning.py)."""

import pytest
import torch

from pfl_cli.data import load_dataset
from pfl_cli.errors import ConfigError
from pfl_cli.fl import train_federated
from pfl_cli.fl.api import make_algorithm
from pfl_cli.fl.store import ROLE_TRAIN
from pfl_cli.partition import PartitionConfig, partition_labels
from pfl_cli.registry import train_config
from pfl_cli.rng import make_rng
from pflx_testing import replace

TOL = dict(atol=2e-5, rtol=1e-4)


def alg_factory(base):
    """``alg_for(store, **opts)``: the algorithm of ``base`` with ``opts`` changed, built on ``store``."""
    def alg_for(store, **opts):
        return make_algorithm(replace(base, **opts), store)

    return alg_for


def gen(seed=7):
    return torch.Generator().manual_seed(seed)


def cohort(store, k=4):
    return torch.as_tensor(store.clients(ROLE_TRAIN)[[0, 3, 5, 9][:k]])


def close(a, b):
    for k in b:
        torch.testing.assert_close(a[k], b[k], **TOL, msg=k)


def assert_config_refused(algorithm, opts, message):
    """``train_config(algorithm, **opts)`` raises a ConfigError whose text holds ``message``."""
    with pytest.raises(ConfigError) as err:
        train_config(algorithm, **opts)
    assert message in str(err.value), str(err.value)


def assert_unknown_key(algorithm, key, then=""):
    """``key`` is refused as unknown for ``algorithm``, the message going on to match the pattern ``then``."""
    with pytest.raises(ConfigError, match=f"unknown key '{key}' for algorithm '{algorithm}'{then}"):
        train_config(algorithm, **{key: 1.0})


# ----------------------------------------------------------------------------- the ring learning tests
RING_BASE = dict(rounds=200, eval_every=50, clients_per_round=10, local_steps=20, lr=0.05, new_client_epochs=10)
MARGIN = 0.10


def ring(seed):
    """The ring task with two classes a client, 100 clients (20 holdout): (dataset, partition)."""
    ds = load_dataset("ring:")
    cfg = PartitionConfig(scheme="pathological", classes_per_client=2, class_shares="equal", num_clients=100,
                          holdout_clients=20, seed=seed)
    return ds, partition_labels(ds.y, cfg, num_classes=ds.num_classes, rng=make_rng(seed, "partition"), pool=ds.pool)


def train(base, data, seed, **opts):
    """The best evaluation's summaries of ``base`` with ``opts`` on ``data``."""
    ds, part = data
    return train_federated(ds.x, ds.y, ds.num_classes, part, replace(base, seed=seed, **opts),
                           device="cpu").outcome.best.summaries()


def fedavg_train_accuracy(base, data, seed):
    """FedAvg's train clients' mean accuracy at the best of three client learning rates (validation split)."""
    runs = [train(base, data, seed, algorithm="fedavg", lr=lr) for lr in (0.005, 0.02, 0.05)]
    return max(runs, key=lambda s: s["val"]["pooled_accuracy"])["train"]["mean_accuracy"]


def assert_beats_fedavg(base, data, seed, name, fedavg):
    """``name``'s train clients beat FedAvg's (capped near the Bayes accuracy, <= 0.50) by MARGIN."""
    s = train(base, data, seed, algorithm=name)
    print(f"\nseed {seed} {name}: train {s['train']['mean_accuracy']:.3f} holdout {s['holdout']['mean_accuracy']:.3f}"
          f" | fedavg train {fedavg:.3f}")
    assert fedavg <= 0.50, fedavg
    assert s["train"]["mean_accuracy"] >= fedavg + MARGIN, (name, seed, s["train"]["mean_accuracy"], fedavg)
