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
    # Tests import transformers, peft and timm directly (the PeftModel round trip is plain transformers + peft):
    # where the installed torchvision is a build for another torch they import only after this (pflx's own imports
    # of them call it too; pfl_cli/torchvision_compat.py says why).
    from pfl_cli.torchvision_compat import declare_torchvision_ops

    declare_torchvision_ops()


# Tests of the optional extras carry a marker naming the extra; the package each one needs.
EXTRA_MODULES = {"hf": ("datasets",), "peft": ("transformers", "peft"), "flower": ("flwr_datasets", "flwr"),
                 "tracking": ("wandb", "mlflow"), "models": ("torchvision", "timm")}


def _missing_extras() -> list[str]:
    import importlib.util

    return [extra for extra, modules in EXTRA_MODULES.items()
            if any(importlib.util.find_spec(module) is None for module in modules)]


def pytest_collection_modifyitems(config, items):
    # `make test` and CI install the extras, so these tests run there. Elsewhere (a bare
    # `pip install -e .`) they are deselected with a notice; under CI a missing extra is an error,
    # so CI can never pass without running them.
    missing = _missing_extras()
    if not missing:
        return
    if os.environ.get("CI", "") not in ("", "0", "false"):
        raise pytest.UsageError(f"CI must run the tests of the extras {missing}: pip install -e '.[test,hf,peft,flower,wandb,mlflow,models]'")
    keep, dropped = [], []
    for item in items:
        (dropped if any(item.get_closest_marker(m) for m in missing) else keep).append(item)
    if dropped:
        config.hook.pytest_deselected(items=dropped)
        items[:] = keep
        config._pflx_extras_note = (
            f"{len(dropped)} tests of the extras {missing} deselected: pip install -e '.[test,hf,peft,flower,wandb,mlflow,models]' (make test does)"
        )


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    note = getattr(config, "_pflx_extras_note", None)
    if note:
        terminalreporter.write_line(f"pflx: {note}", yellow=True)
