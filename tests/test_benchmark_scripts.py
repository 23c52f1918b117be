"""Benchmark scripts run end to end: the GPU benchmark as a CPU smoke run, the start-up benchmark."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.slow
def test_the_pefll_paper_configuration_benchmark_runs_on_cpu(tmp_path):
    proc = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "pefll_paper_run.py"), "--device", "cpu", "--rounds", "1",
         "--eval-every", "1", "--images", "5000", "--out", str(tmp_path)],
        env={**os.environ, "OMP_NUM_THREADS": "1"}, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr
    assert "1 rounds, evaluation every 1, 5,000 + 1,000 synthetic 3x32x32 images, on CPU" in proc.stdout
    assert "target n/a: only a full 5000-round run on CUDA" in proc.stdout  # no verdict from a short run
    assert (tmp_path / "data" / "cifar-10-batches-py" / "data_batch_5").is_file()
    assert (tmp_path / "train" / "model.pt").is_file() and (tmp_path / "part" / "manifest.json").is_file()


@pytest.mark.slow
def test_the_hyperfl_lpm_measurement_runs_on_cpu():
    proc = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "hyperfl_lpm_round.py"), "--device", "cpu", "--rounds", "1",
         "--backbone", "vit-micro", "--images", "2000", "--local-epochs", "1"],
        env={**os.environ, "OMP_NUM_THREADS": "1"}, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr
    assert "backbone vit-micro (random weights), 1 rounds of 20 clients x 1 local epochs" in proc.stdout
    assert "seconds per round" in proc.stdout and "n/a (CPU)" in proc.stdout


@pytest.mark.slow
def test_startup_benchmark_prints_every_figure_beside_its_target():
    """Timing verdicts depend on the machine; the script must run and report all four figures."""
    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "run.py"), "startup"],
                          env={**os.environ, "PYTHONPATH": str(ROOT)}, capture_output=True, text=True, timeout=600)
    assert proc.returncode in (0, 1), proc.stderr
    for label, target in (("pflx --help", "<= 3x numpy"), ("pflx show PART", "<= 3x numpy"),
                          ("privacy-account query (RDP)", "<= 1.3x dp_accounting"),
                          ("predict, 10 digits clients (pefll)", "< 3 s")):
        line = next(ln for ln in proc.stdout.splitlines() if ln.strip().startswith(label))
        assert f"target {target}" in line and (line.rstrip().endswith(" ok") or line.rstrip().endswith("MISSED"))
    assert ("startup.py: ok" in proc.stdout) == (proc.returncode == 0)
