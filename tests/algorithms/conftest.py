"""Fixtures of the algorithm tests."""

import pytest


@pytest.fixture(scope="module")
def store(digits_clients):
    """The digits clients (tests/conftest.py) on the cpu, 10% of each client's train split held for validation."""
    from pfl_cli.fl.store import build_store
    from pfl_cli.rng import make_rng

    ds, part = digits_clients
    return build_store(ds.x, ds.y, ds.num_classes, part, val_fraction=0.1, rng=make_rng(0, "validation-split"),
                       device="cpu")
