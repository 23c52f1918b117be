"""Benchmark: a cohort's local SGD on LEAF's Shakespeare LSTM, vmapped against client by client.

``cohort_exec=auto`` (:func:`pfl_cli.fl.cohort.resolve_cohort_exec`) must pick the faster path for
the LSTM on a CPU. Under ``vmap`` the LSTM runs its recurrence written out (vmap has no rule for the
fused kernel, :mod:`pfl_cli.models.sequence`); the loop runs the fused kernel once per client. Both
give the same numbers (tests/models/test_sequence.py). Random codes stand in for the text: the cost of
a step does not depend on the characters.

    python benchmarks/lstm_cohort_bench.py [--cohort 5] [--steps 5] [--batch 10] [--widths 16,64,256]
"""

from __future__ import annotations

import argparse
import time

import numpy as np


def bench(width: int, cohort: int, steps: int, batch: int, repeats: int) -> dict:
    import torch

    from pfl_cli.fl.batches import draw_batches
    from pfl_cli.fl.cohort import local_sgd, resolve_cohort_exec
    from pfl_cli.fl.store import build_store
    from pfl_cli.models import build, client_spec, stacked_params
    from pfl_cli.partition import PartitionConfig, partition_labels
    from pfl_cli.rng import make_rng

    rng = np.random.default_rng(0)
    n = cohort * batch * steps * 2
    x = rng.integers(0, 80, size=(n, 80))
    y = rng.integers(0, 80, size=n)
    part = partition_labels(y, PartitionConfig(scheme="iid", num_clients=cohort, test_fraction=0.1),
                            num_classes=80, rng=make_rng(0, "bench"))
    store = build_store(x, y, 80, part, val_fraction=0.0, rng=None, device="cpu", vocab_size=80)
    net = build(client_spec("auto", (80,), 80, vocab=80, lstm_hidden=width))
    params = stacked_params(net, cohort)
    clients = torch.arange(cohort)
    out = {"width": width, "parameters": sum(p.numel() for p in net.parameters()),
           "auto": resolve_cohort_exec("auto", net, "cpu")}
    for how in ("vmap", "loop"):
        times = []
        for r in range(repeats + 1):  # the first is a warm-up
            gen = torch.Generator().manual_seed(r)
            batches = draw_batches(store.fit, clients, steps, batch, gen)
            start = time.perf_counter()
            local_sgd(net, params, store, batches, lr=0.1, momentum=0.9, clip=50.0, cohort_exec=how)
            times.append(time.perf_counter() - start)
        out[how] = 1000 * min(times[1:]) / steps  # ms per cohort step
    return out


def main() -> None:
    import torch

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--cohort", type=int, default=5)
    p.add_argument("--steps", type=int, default=5)
    p.add_argument("--batch", type=int, default=10)
    p.add_argument("--widths", default="16,64,256")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--threads", type=int, default=1)
    a = p.parse_args()
    torch.set_num_threads(a.threads)
    print(f"cohort {a.cohort}, batch {a.batch}, {a.steps} steps, {a.threads} thread(s); ms per cohort step")
    print("width  parameters    vmap    loop  vmap/loop  auto")
    ok = True
    for w in (int(s) for s in a.widths.split(",")):
        r = bench(w, a.cohort, a.steps, a.batch, a.repeats)
        faster = "loop" if r["loop"] < r["vmap"] else "vmap"
        ok &= r["auto"] == faster or abs(r["vmap"] - r["loop"]) < 0.1 * min(r["vmap"], r["loop"])
        print(f"{w:5d} {r['parameters']:11,d} {r['vmap']:7.1f} {r['loop']:7.1f} {r['vmap'] / r['loop']:9.2f}x  "
              f"{r['auto']}")
    print("auto picks the faster path (within 10%):", "yes" if ok else "NO")
    raise SystemExit(0 if ok else 1)


if __name__ == "__main__":
    main()
