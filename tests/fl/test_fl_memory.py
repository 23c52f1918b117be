"""Long local training holds memory flat: `pflx train --algorithm local --local-epochs 200` on one 3,060-sample client.

Each run is a child process that reports its own peak resident set size (torch's CPU
allocations are invisible to tracemalloc); the 200-epoch run may use no more than a few MiB
beyond the 1-epoch run of the same command. The batch sampler before the lazy one built a
(clients x steps x width) key table: +106 MiB at batch 256, +0.9 GiB at batch 32.
"""

import json
import os
import subprocess
import sys

import numpy as np
import pytest

PEAK = """
import resource, runpy, sys
sys.argv = ["pflx", *sys.argv[1:]]
try:
    runpy.run_module("pfl_cli", run_name="__main__")
finally:
    print("peak_kib", resource.getrusage(resource.RUSAGE_SELF).ru_maxrss, file=sys.stderr)
"""


@pytest.fixture(scope="module")
def partition(tmp_path_factory):
    from pfl_cli.cli.app import main

    root = tmp_path_factory.mktemp("memory")
    rng = np.random.default_rng(0)
    x = rng.normal(size=(3400, 4)).astype(np.float32)
    np.savez(root / "big.npz", x=x, y=(x[:, 0] > 0).astype(np.int64))
    assert main(["partition", "--dataset", f"npz:{root / 'big.npz'}", "--scheme", "iid", "--num-clients", "1",
                 "--test-fraction", "0.1", "--out", str(root / "part"), "--format", "quiet"]) == 0
    return root


def _train_peak_kib(root, epochs: int, batch: int) -> int:
    out = root / f"local-{epochs}-{batch}"
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.run(
        [sys.executable, "-c", PEAK, "train", "--partition", str(root / "part"), "--algorithm", "local",
         "--local-epochs", str(epochs), "--batch-size", str(batch), "--val-fraction", "0", "--set", "mlp_hidden=[8]",
         "--out", str(out), "--format", "quiet"], env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    metrics = json.loads((out / "metrics.json").read_text())
    return int(proc.stderr.split("peak_kib")[-1].split()[0]), metrics["train"]


@pytest.mark.parametrize("batch", [pytest.param(256, marks=pytest.mark.slow), pytest.param(32, marks=pytest.mark.slow)])
def test_200_local_epochs_on_a_3000_sample_client_keep_memory_flat(partition, batch):
    one, _ = _train_peak_kib(partition, 1, batch)
    many, test = _train_peak_kib(partition, 200, batch)  # 200 x ceil(3060 / batch) steps
    assert test["num_samples"] == 340 and test["mean_accuracy"] > 0.95  # it trained (labels: x_0 > 0)
    assert many - one < 16 * 1024, f"200 epochs peaked {(many - one) / 1024:.0f} MiB above 1 epoch"
