"""Concurrent writers of one --out, and writers killed at any moment of their final write."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time

import pytest

from pfl_cli.artifacts import read_artifact
from . import contract

ENV = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
PARTITION = [sys.executable, "-m", "pfl_cli", "partition", "--dataset", "ring:", "--num-clients", "40", "--dirichlet", "0.5",
             "--format", "quiet"]


def _race(tmp_path, seeds) -> None:
    out = tmp_path / "part"
    procs = [subprocess.Popen([*PARTITION, "--out", str(out), "--seed", str(s)], env=ENV, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for s in seeds]
    results = [(p.wait(), p.stderr.read()) for p in procs]
    codes = sorted(code for code, _ in results)
    for code, err in results:
        assert code in (0, 2) and "Traceback" not in err, err
        if code == 2:
            assert err.count("\n") == 1 and ("is being written by process" in err or "already holds" in err), err
    manifest = read_artifact(out, "partition").manifest
    winners = [s for s, (code, _) in zip(seeds, results) if code == 0]
    assert manifest["seed"] in winners
    if seeds[0] != seeds[1]:
        assert codes == [0, 2]  # never both: the loser neither replaced nor was replaced silently
    assert contract.leftovers(out) == []


def test_two_writers_of_one_out_never_both_win(tmp_path):
    _race(tmp_path, (1, 2))


@pytest.mark.slow
@pytest.mark.parametrize("trial", range(8))
def test_two_writers_many_times(tmp_path, trial):
    _race(tmp_path, (trial, trial + 1) if trial % 2 else (trial, trial))


def _kill_during_write(tmp_path, delay: float) -> None:
    out = tmp_path / "part"
    proc = subprocess.Popen([*PARTITION, "--out", str(out), "--seed", "3"], env=ENV,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    time.sleep(delay)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    # Killed at any point: --out is absent or a complete artifact, never half-written.
    if out.exists():
        read_artifact(out, "partition")
    # The next run removes what the dead writer left and completes.
    done = subprocess.run([*PARTITION, "--out", str(out), "--seed", "3"], env=ENV, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert read_artifact(out, "partition").manifest["seed"] == 3
    assert contract.leftovers(out) == []


def _write_window() -> float:
    """Seconds a partition run takes here, so kills land across its whole life, final write included."""
    return 2.5


@pytest.mark.slow
@pytest.mark.parametrize("fraction", [0.6, 0.9])
def test_kill_during_write_leaves_nothing_half_written(tmp_path, fraction):
    _kill_during_write(tmp_path, fraction * _write_window())


@pytest.mark.slow
@pytest.mark.parametrize("trial", range(12))
def test_kill_during_write_many_times(tmp_path, trial):
    _kill_during_write(tmp_path, random.Random(trial).uniform(0.3, 1.3) * _write_window())


def test_a_kill_inside_the_final_rename_window_is_recovered(tmp_path):
    """Freeze the writer right after its temp folder holds every file (SIGSTOP), then kill it."""
    out = tmp_path / "part"
    proc = subprocess.Popen([*PARTITION, "--out", str(out), "--seed", "5"], env=ENV,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 60
    stopped = False
    while proc.poll() is None and time.monotonic() < deadline:
        temps = list(tmp_path.glob(".part.tmp-*"))
        if temps and any((t / "stats.json").exists() for t in temps):
            proc.send_signal(signal.SIGSTOP)
            stopped = True
            break
        time.sleep(0.002)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    if stopped:
        assert not out.exists() or read_artifact(out, "partition")
    done = subprocess.run([*PARTITION, "--out", str(out), "--seed", "5"], env=ENV, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert contract.leftovers(out) == [] and read_artifact(out, "partition").manifest["seed"] == 5
