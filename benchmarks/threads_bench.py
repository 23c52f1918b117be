"""Benchmark: torch threads for a CPU round, one against every core, and whether ``auto`` picks the faster.

pflx chooses torch's CPU threads from the model's size (:mod:`pfl_cli.fl.threads`: one thread below
``THREADED_MIN_PARAMETERS`` parameters, every core above). This times FedAvg rounds (cohort 10) of
three models, each with one thread and with every core, interleaved so that a busy machine slows
both alike, and prints each median beside the thread count ``auto`` picks. A miss (exit 1): the
pick is more than 1.2x slower than the other count. Run it on an otherwise idle machine: other
processes make the threaded runs wait for cores, which is what a user's busy laptop does too.

    python benchmarks/threads_bench.py [--rounds 6] [--only digits-mlp,lenet,wide-mlp]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

import numpy as np

TARGET = 1.2


def _workloads() -> dict[str, tuple]:
    """name -> (x, y, train config keys): the digits MLP, LeNet at CIFAR-10's shape, a wide MLP on the same."""
    from pfl_cli.data import load_dataset

    rng = np.random.default_rng(0)
    digits = load_dataset("builtin:digits")
    n = 10 * 400
    images = rng.integers(0, 256, size=(n, 3, 32, 32), dtype=np.uint8)
    labels = np.repeat(np.arange(10), n // 10)
    return {
        "digits-mlp": (digits.x, digits.y, {"local_steps": 20}),
        "lenet": (images, labels, {"model_arch": "lenet", "local_steps": 5}),
        "wide-mlp": (images.reshape(n, -1), labels, {"model_arch": "mlp", "mlp_hidden": [1024, 1024],
                                                     "local_steps": 5}),
    }


def _algorithm(x, y, keys):
    from pfl_cli.fl.api import make_algorithm
    from pfl_cli.fl.store import build_store
    from pfl_cli.partition import PartitionConfig, partition_labels
    from pfl_cli.registry import train_config
    from pfl_cli.rng import make_rng

    part = partition_labels(y, PartitionConfig(scheme="dirichlet", alpha=0.5, num_clients=20, holdout_clients=0,
                                               seed=0), num_classes=10, rng=make_rng(0, "partition"))
    store = build_store(x, y, 10, part, val_fraction=0.0, rng=make_rng(0, "validation-split"), device="cpu")
    cfg = train_config("fedavg", clients_per_round=10, **keys)
    return make_algorithm(cfg, store), store


def main(argv=None) -> int:
    import torch

    from pfl_cli.fl.store import ROLE_TRAIN
    from pfl_cli.fl.threads import choose_threads

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--only", default="", help="comma-separated workloads (default: all)")
    args = ap.parse_args(argv)
    cores = os.cpu_count() or 1
    counts = sorted({1, cores})
    print(f"FedAvg rounds, cohort 10, {cores} cores, load {os.getloadavg()[0]:.1f}; median of {args.rounds - 1} "
          f"rounds (first dropped); target: auto's pick within {TARGET}x of the faster count")
    misses = 0
    for name, (x, y, keys) in _workloads().items():
        if args.only and name not in args.only.split(","):
            continue
        alg, store = _algorithm(x, y, keys)
        params = sum(p.numel() for m in vars(alg).values() if isinstance(m, torch.nn.Module) for p in m.parameters())
        clients = store.clients(ROLE_TRAIN)
        times: dict[int, list[float]] = {c: [] for c in counts}
        for t in range(args.rounds):
            cohort = torch.as_tensor(clients[:10])
            for c in counts:
                torch.set_num_threads(c)
                start = time.perf_counter()
                alg.run_round(t, cohort, torch.Generator().manual_seed(t))
                times[c].append(time.perf_counter() - start)
        median = {c: statistics.median(ts[1:]) for c, ts in times.items()}
        pick = choose_threads(params, cores)
        best = min(median.values())
        ok = median[pick] <= TARGET * best
        misses += not ok
        cells = ", ".join(f"{c} thread(s) {1000 * m:.0f} ms" for c, m in median.items())
        print(f"  {name:<11} {params:>10,} params: {cells}; auto picks {pick}: {median[pick] / best:.2f}x the faster "
              f"(target <= {TARGET}) {'ok' if ok else 'MISS'}")
    return 1 if misses else 0


if __name__ == "__main__":
    sys.exit(main())
