"""Every registered algorithm under Byzantine clients: it trains under attack with a robust aggregator, or it
refuses in one line before any work (issue 48, DESIGN.md §9).

Generated from the registry, like tests/algorithms/test_every_algorithm.py: for each algorithm a smoke run on
digits (8 train clients, 4 per round, 2 rounds)

1. with sign-flipping clients and a trimmed mean: an algorithm that declares ``averages_updates`` trains, its
   honest clients' accuracy is in the history, and its weights differ from the same run without the attack (its
   server really reads the corrupted uploads: a class that declared it without aggregating in
   ``FedAvg.aggregate`` fails here); any other algorithm is refused with one line naming ``averages_updates``;
2. with label-flipping clients (data poisoning, which needs no server step): every algorithm trains, or is refused
   in one line (an algorithm that exists only under --dp);
3. an algorithm that declares ``averages_updates`` averages through the aggregator: norm bounding with a radius no
   update reaches (each update kept whole, then the algorithm's own weighted mean) gives the weights of the plain
   run (``aggregator=mean``, the algorithm's own mean bit for bit), to float rounding.

The default tier runs representatives (1-2: FedAvg, Ditto's personal models, Local, which averages no updates; 3:
FedRep's shared body); the whole registry is ``slow``.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch

from pflx_testing import smoke_values

from pfl_cli import registry
from pfl_cli.errors import ConfigError, PflxError

BASE = {"rounds": 2, "clients_per_round": 4, "local_steps": 2, "batch_size": 8, "eval_every": 2,
        "mlp_hidden": (8,), "val_fraction": 0.2}
UNDER_ATTACK = {"attack": "sign-flip", "attack_fraction": 0.25, "aggregator": "trimmed-mean", "robust_fraction": 0.25}
DEFAULT_TIER = ("fedavg", "ditto", "local")


def _data():
    from pfl_cli.data import load_dataset
    from pfl_cli.partition import PartitionConfig, partition_labels
    from pfl_cli.rng import make_rng

    ds = load_dataset("builtin:digits")
    part = partition_labels(ds.y, PartitionConfig(scheme="pathological", classes_per_client=3, num_clients=10,
                                                  holdout_clients=2, test_fraction=0.3),
                            num_classes=ds.num_classes, rng=make_rng(0, "partition"), pool=ds.pool)
    return ds, part


def settings(name: str, **keys) -> dict:
    entry = registry.get(name)
    out = {k: v for k, v in {**BASE, **smoke_values(name)}.items() if k in entry.keys}
    if getattr(entry.config(), "local_epochs", None) is not None or out.get("local_epochs") is not None:
        out.pop("local_steps", None)  # a round of epochs counts no steps (pfl_cli.fl.config.NEEDS)
    return {**out, **keys}


def run(name: str, **keys):
    from pfl_cli.fl.api import train_federated

    ds, part = _data()
    cfg = registry.train_config(name, **settings(name, **keys))
    return train_federated(ds.x, ds.y, ds.num_classes, part, cfg, device=torch.device("cpu"))


def weights(run_) -> dict:
    out = {}

    def walk(prefix, tree):
        for k, v in tree.items():
            if isinstance(v, dict):
                walk(f"{prefix}{k}.", v)
            elif isinstance(v, torch.Tensor):
                out[prefix + k] = v.detach().numpy()

    walk("", run_.model["weights"])
    return out


def cases():
    return [pytest.param(name, id=name, marks=() if name in DEFAULT_TIER else pytest.mark.slow)
            for name in registry.names()]


def refused_in_one_line(name: str, keys: dict) -> str | None:
    """The refusal's message when ``name`` refuses ``keys`` (None when it accepts them)."""
    try:
        registry.train_config(name, **settings(name, **keys))
    except ConfigError as err:
        return str(err)
    return None


@pytest.mark.parametrize("name", cases())
def test_trains_under_update_attack_and_robust_aggregator_or_refuses(name):
    declared = bool(registry.get(name).algorithm.__dict__.get("averages_updates", False))
    refusal = refused_in_one_line(name, UNDER_ATTACK)
    if not declared:
        assert refusal is not None, f"{name} declares no averages_updates but accepted an update attack"
        assert "\n" not in refusal and "averages_updates" in refusal, refusal
        return
    assert refusal is None, refusal
    attacked, clean = run(name, **UNDER_ATTACK), run(name)
    got, base = weights(attacked), weights(clean)
    assert all(np.isfinite(v).all() for v in got.values())
    assert any(not np.array_equal(got[k], base[k]) for k in base), f"{name}: the attack changed nothing"
    groups = {row[1] for row in attacked.outcome.history}
    assert "honest" in groups


@pytest.mark.parametrize("name", cases())
def test_trains_with_label_flipping_clients_or_refuses(name):
    try:
        attacked = run(name, attack="label-flip", attack_fraction=0.25)
    except PflxError as err:
        assert "\n" not in str(err), str(err)
        assert isinstance(err, ConfigError), f"{name}: refused at run time, not before any work: {err}"
        return
    assert all(np.isfinite(v).all() for v in weights(attacked).values())
    honest = [row for row in attacked.outcome.history if row[1] == "honest" and row[2] == "mean_accuracy"]
    assert honest and 0.0 <= honest[-1][3] <= 1.0
    assert dataclasses.asdict(attacked.algorithm.cfg)["attack"] == "label-flip"


def averaging_cases():
    """The algorithms that declare ``averages_updates`` (test 1 checks the others' refusal)."""
    return [pytest.param(name, id=name, marks=() if name == "fedrep" else pytest.mark.slow)
            for name in registry.names() if registry.get(name).algorithm.__dict__.get("averages_updates")]


@pytest.mark.parametrize("name", averaging_cases())
def test_the_aggregator_reduces_to_the_plain_mean(name):
    one = {"rounds": 1, "eval_every": 1}  # one server step: only its rounding separates the two
    plain = weights(run(name, aggregator="mean", **one))
    bounded = weights(run(name, aggregator="norm-bound", robust_clip=1e12, **one))
    assert plain.keys() == bounded.keys()
    for k in plain:
        np.testing.assert_allclose(bounded[k], plain[k], rtol=1e-5, atol=1e-6, err_msg=f"{name}: {k}")
