"""Benchmark: PeFLL training rounds, vectorized cohort vs one client at a time.

Targets (issue 5): on CPU, the digits MLP (64-32-10) with a cohort of 10 clients and
k = 50 local steps runs at least 3x more rounds per second vectorized (``vmap`` over
``functional_call``) than with the one-client-at-a-time loop; on a GPU, the CIFAR-10
LeNet (Table B.1) with a cohort of 25 on CIFAR-shaped random data, at least 5x. Both
paths run the same Algorithm 8 round with the same batches (the tests hold their
results equal); the printed ratio is loop time / vectorized time, measured in this run.

    python benchmarks/train_bench.py [--device auto|cpu|cuda] [--rounds 20] [--setup digits|cifar|both]
"""

from __future__ import annotations

import argparse
import time

import numpy as np


def _partition(labels, num_clients, classes_per_client, holdout):
    from pfl_cli.partition import PartitionConfig, partition_labels
    from pfl_cli.rng import make_rng

    cfg = PartitionConfig(scheme="pathological", classes_per_client=classes_per_client, class_shares="equal",
                          num_clients=num_clients, holdout_clients=holdout, test_fraction=0.2)
    return partition_labels(labels, cfg, num_classes=int(labels.max()) + 1, rng=make_rng(0, "bench"))


def _time_rounds(alg, rounds, cohort_size, sequential):
    import torch

    train = torch.as_tensor(alg.store.clients(0), device=alg.device)
    run = alg.run_round_sequential if sequential else alg.run_round
    sync = torch.cuda.synchronize if alg.device.type == "cuda" else (lambda: None)
    run(0, train[:cohort_size], torch.Generator().manual_seed(0))  # warm-up
    sync()
    start = time.perf_counter()
    for t in range(rounds):
        gen = torch.Generator().manual_seed(t + 1)
        run(t, train[torch.randperm(len(train), generator=gen)[:cohort_size].to(alg.device)], gen)
    sync()
    return rounds / (time.perf_counter() - start)


def bench(name, x, y, num_classes, cfg, device, rounds, cohort_size, num_clients, classes_per_client):
    from pfl_cli.algorithms import PeFLL
    from pfl_cli.fl.store import build_store
    from pfl_cli.rng import make_rng

    part = _partition(y, num_clients, classes_per_client, holdout=0)
    store = build_store(x, y, num_classes, part, val_fraction=0.0, rng=make_rng(0, "v"), device=device)
    vec = _time_rounds(PeFLL(cfg, store), rounds, cohort_size, sequential=False)
    loop = _time_rounds(PeFLL(cfg, store), max(2, rounds // 2), cohort_size, sequential=True)
    return vec, loop


def main() -> None:
    import torch

    from pfl_cli.data import load_dataset
    from pfl_cli.fl.config import TrainConfig
    from pfl_cli.fl.device import resolve_device

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="auto")
    ap.add_argument("--rounds", type=int, default=20)
    ap.add_argument("--threads", type=int, default=1,
                    help="torch CPU threads (1: small models gain nothing from more and suffer on a busy machine)")
    ap.add_argument("--setup", choices=("digits", "cifar", "both"), default=None,
                    help="default: digits on CPU, both on a GPU")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    device = resolve_device(args.device)
    setup = args.setup or ("both" if device.type == "cuda" else "digits")
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else f"CPU ({torch.get_num_threads()} threads)"
    print(f"PeFLL rounds/s, vectorized cohort vs per-client loop, k = 50 local steps, on {name}")
    if setup in ("digits", "both"):
        ds = load_dataset("builtin:digits")
        cfg = TrainConfig(algorithm="pefll", local_steps=50, lr=0.05, model_arch="mlp", embedding="mlp")
        vec, loop = bench("digits", ds.x, ds.y, 10, cfg, device, args.rounds, 10, 50, 2)
        print(f"  digits MLP 64-32-10, cohort 10: vectorized {vec:.1f} rounds/s, loop {loop:.1f} rounds/s, "
              f"ratio {vec / loop:.1f}x (target >= 3x on CPU)")
    if setup in ("cifar", "both"):
        rng = np.random.default_rng(0)
        n = 100 * 500
        x = rng.integers(0, 256, size=(n, 3, 32, 32), dtype=np.uint8)
        y = np.repeat(np.arange(10), n // 10)
        cfg = TrainConfig(algorithm="pefll", local_steps=50, model_arch="lenet", embedding="cnn")
        vec, loop = bench("cifar", x, y, 10, cfg, device, args.rounds, 25, 100, 2)
        print(f"  CIFAR-shaped LeNet (121,182 params), cohort 25: vectorized {vec:.2f} rounds/s, loop {loop:.2f} "
              f"rounds/s, ratio {vec / loop:.1f}x (target >= 5x on a GPU)")


if __name__ == "__main__":
    main()
