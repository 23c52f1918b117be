"""Text clients in the engine: the store keeps token codes, and a cohort's local SGD on LEAF's LSTM gives the
same numbers vmapped, client by client, and with one torch.optim.SGD per client."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from pfl_cli.errors import InputError
from pfl_cli.fl.batches import draw_batches
from pfl_cli.fl.cohort import local_sgd, local_sgd_reference, resolve_cohort_exec
from pfl_cli.fl.store import build_store
from pfl_cli.models import build, client_spec, stacked_params
from pfl_cli.partition import PartitionConfig, partition_labels
from pfl_cli.rng import make_rng


def text_store(n=120, length=12, vocab=30, clients=4, **kw):
    rng = np.random.default_rng(0)
    x = rng.integers(0, vocab, size=(n, length))
    y = rng.integers(0, vocab, size=n)
    part = partition_labels(y, PartitionConfig(scheme="iid", num_clients=clients, test_fraction=0.2),
                            num_classes=vocab, rng=make_rng(0, "p"))
    return x, build_store(x, y, vocab, part, val_fraction=0.0, rng=None, device="cpu", vocab_size=vocab, **kw)


def test_the_store_keeps_token_codes():
    x, store = text_store()
    idx = torch.tensor([[3, 7], [0, 119]])
    got = store.inputs(idx)
    assert got.dtype == torch.int64 and torch.equal(got, torch.as_tensor(x[[[3, 7], [0, 119]]]))
    assert float(store.mean.abs().max()) == 0.0 and float(store.std.min()) == 1.0  # nothing standardized
    part = partition_labels(np.zeros(4, dtype=np.int64), PartitionConfig(scheme="iid", num_clients=1),
                            num_classes=2, rng=make_rng(0, "p"))
    with pytest.raises(InputError, match=r"^vocab_size: token codes must lie in \[0, 5\); got codes from 0 to 7"):
        build_store(np.array([[0, 7]] * 4), np.zeros(4, dtype=np.int64), 2, part, val_fraction=0.0, rng=None,
                    device="cpu", vocab_size=5)
    with pytest.raises(InputError, match=r"^vocab_size: text data are integer token codes"):
        build_store(np.zeros((4, 2), dtype=np.float32), np.zeros(4, dtype=np.int64), 2, part, val_fraction=0.0,
                    rng=None, device="cpu", vocab_size=5)


def test_auto_runs_the_lstm_client_by_client_on_cpu():
    lstm = build(client_spec("auto", (12,), 30, vocab=30, lstm_hidden=8))
    assert resolve_cohort_exec("auto", lstm, "cpu") == "loop"
    assert resolve_cohort_exec("auto", lstm, "cuda") == "vmap"
    assert resolve_cohort_exec("auto", build(client_spec("auto", (12,), 30)), "cpu") == "vmap"  # a small MLP


def test_local_sgd_on_the_lstm_vmap_loop_and_reference_agree():
    _, store = text_store()
    torch.manual_seed(0)
    net = build(client_spec("auto", (12,), 30, vocab=30, lstm_hidden=8))
    params = stacked_params(net, 3)
    params = {k: v + 0.01 * torch.randn_like(v) for k, v in params.items()}  # clients start apart
    clients = torch.tensor([0, 2, 3])
    opts = dict(lr=0.3, momentum=0.9, clip=1.0)
    out = {}
    for how in ("vmap", "loop"):
        batches = draw_batches(store.fit, clients, 3, 6, torch.Generator().manual_seed(5))
        out[how] = local_sgd(net, params, store, batches, cohort_exec=how, **opts)
    batches = draw_batches(store.fit, clients, 3, 6, torch.Generator().manual_seed(5))
    ref, ref_loss = local_sgd_reference(net, params, store, batches, **opts)
    for how, (theta, loss) in out.items():
        torch.testing.assert_close(loss, ref_loss.to(loss.dtype), rtol=1e-4, atol=1e-5)
        for k in ref:
            torch.testing.assert_close(theta[k], ref[k], rtol=1e-4, atol=1e-5, msg=f"{how} {k}")
    assert any(not torch.equal(out["loop"][0][k], params[k]) for k in params)  # it did train


@pytest.mark.slow
def test_the_lstm_cohort_benchmark_runs():
    script = Path(__file__).resolve().parents[2] / "benchmarks" / "lstm_cohort_bench.py"
    proc = subprocess.run([sys.executable, str(script), "--widths", "8", "--steps", "2", "--repeats", "1"],
                          env={**os.environ, "OMP_NUM_THREADS": "1"}, capture_output=True, text=True, timeout=300)
    assert proc.returncode in (0, 1), proc.stderr  # 1: auto not the faster path on this machine (it says so)
    assert "width  parameters    vmap    loop" in proc.stdout and "auto picks the faster path" in proc.stdout
