"""Shared fixtures: run the real CLI in-process and capture what it prints."""

from __future__ import annotations

import os
from dataclasses import dataclass

import pytest

os.environ.setdefault("MPLBACKEND", "Agg")


@dataclass
class Run:
    code: int
    out: str
    err: str


@pytest.fixture
def cli(capsys):
    """``cli("partition", "--out", d)`` -> Run(code, stdout, stderr) through pflx's error boundary."""
    from pfl_cli.cli.app import main

    def run(*args) -> Run:
        capsys.readouterr()
        code = main([str(a) for a in args])
        captured = capsys.readouterr()
        return Run(code, captured.out, captured.err)

    return run


@pytest.fixture(scope="session")
def digits_clients():
    """builtin:digits over 20 clients with 2 classes each, 4 of them holdout: (dataset, partition)."""
    from pfl_cli.data import load_dataset
    from pfl_cli.partition import PartitionConfig, partition_labels
    from pfl_cli.rng import make_rng

    ds = load_dataset("builtin:digits")
    cfg = PartitionConfig(scheme="pathological", classes_per_client=2, class_shares="equal", num_clients=20,
                          holdout_clients=4, test_fraction=0.3)
    part = partition_labels(ds.y, cfg, num_classes=ds.num_classes, rng=make_rng(0, "partition"), pool=ds.pool)
    return ds, part


def pytest_configure(config):
    # The engine's models are tiny: one thread is fastest, and two threads on a busy 2-core
    # machine spin-wait on each other (8x slower in the cohort tests).
    import torch

    torch.set_num_threads(1)
