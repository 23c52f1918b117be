"""torch's CPU threads: one for pflx's small models unless the user chose (PFLX_THREADS, OMP_NUM_THREADS)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from pfl_cli.errors import InputError
from pfl_cli.fl.threads import THREADED_MIN_PARAMETERS, choose_threads, requested_threads

ROOT = Path(__file__).resolve().parents[2]


def test_choice_is_one_thread_below_the_threshold_and_the_cores_above():
    assert choose_threads(10_000, 2) == 1 and choose_threads(THREADED_MIN_PARAMETERS - 1, 16) == 1
    assert choose_threads(THREADED_MIN_PARAMETERS, 2) == 2 and choose_threads(10**8, 64) == 8
    assert choose_threads(10**8, 1) == 1


@pytest.mark.parametrize("text, want", [("", None), ("auto", None), (" 3 ", 3), ("1", 1)])
def test_pflx_threads_is_read(monkeypatch, text, want):
    monkeypatch.setenv("PFLX_THREADS", text)
    assert requested_threads() == want


@pytest.mark.parametrize("text", ["0", "-2", "two", "1.5"])
def test_a_bad_pflx_threads_is_refused_in_one_line(monkeypatch, text):
    monkeypatch.setenv("PFLX_THREADS", text)
    with pytest.raises(InputError, match=r"^PFLX_THREADS must be a positive integer or auto; got "):
        requested_threads()


PROBE = """
import torch
from pfl_cli.data import load_dataset
from pfl_cli.fl.api import make_algorithm
from pfl_cli.fl.store import build_store
from pfl_cli.partition import PartitionConfig, partition_labels
from pfl_cli.registry import train_config
from pfl_cli.rng import make_rng
ds = load_dataset("builtin:digits")
part = partition_labels(ds.y, PartitionConfig(scheme="iid", num_clients=4, holdout_clients=0, seed=0),
                        num_classes=10, rng=make_rng(0, "partition"))
store = build_store(ds.x, ds.y, 10, part, val_fraction=0.0, rng=make_rng(0, "v"), device="cpu")
before = torch.get_num_threads()
make_algorithm(train_config("fedavg"), store)
print(before, torch.get_num_threads())
"""


def _threads(**env) -> tuple[int, int]:
    base = {k: v for k, v in os.environ.items() if k not in ("OMP_NUM_THREADS", "PFLX_THREADS", "MKL_NUM_THREADS")}
    proc = subprocess.run([sys.executable, "-c", PROBE], env={**base, "PYTHONPATH": str(ROOT), **env},
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    before, after = map(int, proc.stdout.split())
    return before, after


def test_a_run_without_any_setting_takes_one_thread_for_the_digits_mlp():
    before, after = _threads()
    assert after == 1


@pytest.mark.slow  # default-tier budget (2026-11-29): minutes-long or a learning run
def test_the_users_choice_wins():
    assert _threads(PFLX_THREADS="2")[1] == 2
    assert _threads(OMP_NUM_THREADS="2")[1] == 2  # exported: torch's own reading stands
