"""Measurement: seconds per round of FedOpt (adam / yogi / adagrad) and FedExP beside FedAvg's, same cohort and model.

Issue 40's speed target: a new algorithm's round within 1.2x FedAvg's round times the work its method
adds. FedOpt and FedExP add only O(|theta|) server arithmetic to FedAvg's round (the moments; the
clients' delta norms), so the target is 1.2x FedAvg. Each algorithm runs ``--rounds`` rounds of
``--cohort`` clients (``--local-steps`` SGD steps, batch 32) on the digits clients with a ``--hidden``
MLP; the median round of the interleaved repetitions is printed with its ratio to FedAvg's.

    python benchmarks/server_optim_round.py [--cohort 16] [--local-steps 10] [--hidden 256] [--rounds 20]
"""

from __future__ import annotations

import argparse
import statistics
import time


def main(argv=None) -> int:
    import torch

    from pfl_cli.data import load_dataset
    from pfl_cli.fl.api import make_algorithm
    from pfl_cli.fl.store import ROLE_TRAIN, build_store
    from pfl_cli.partition import PartitionConfig, partition_labels
    from pfl_cli.registry import train_config
    from pfl_cli.rng import make_rng

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cohort", type=int, default=16)
    ap.add_argument("--local-steps", type=int, default=10)
    ap.add_argument("--hidden", type=int, default=256)
    ap.add_argument("--rounds", type=int, default=20)
    args = ap.parse_args(argv)

    ds = load_dataset("builtin:digits")
    part = partition_labels(ds.y, PartitionConfig(scheme="dirichlet", alpha=0.3, num_clients=40, holdout_clients=0,
                                                  seed=0), num_classes=ds.num_classes, rng=make_rng(0, "partition"),
                            pool=ds.pool)
    store = build_store(ds.x, ds.y, ds.num_classes, part, val_fraction=0.0, rng=make_rng(0, "validation-split"),
                        device="cpu")
    common = dict(local_steps=args.local_steps, local_epochs=None, lr=0.05, momentum=0.0, batch_size=32,
                  mlp_hidden=(args.hidden,), clients_per_round=args.cohort)
    runs = {"fedavg": ("fedavg", {}), "fedadam": ("fedopt", {"server_optimizer": "adam"}),
            "fedyogi": ("fedopt", {"server_optimizer": "yogi"}), "fedadagrad": ("fedopt", {"server_optimizer": "adagrad"}),
            "fedexp": ("fedexp", {})}
    algs = {k: make_algorithm(train_config(name, **common, **extra), store) for k, (name, extra) in runs.items()}
    clients = store.clients(ROLE_TRAIN)
    times: dict[str, list[float]] = {k: [] for k in runs}
    for t in range(args.rounds):  # interleaved: a busy machine slows every algorithm alike
        cohort = torch.as_tensor(clients[torch.randperm(len(clients), generator=torch.Generator().manual_seed(t))
                                         [:args.cohort].numpy()])
        for k, alg in algs.items():
            start = time.perf_counter()
            alg.run_round(t, cohort, torch.Generator().manual_seed(t))
            times[k].append(time.perf_counter() - start)
    base = statistics.median(times["fedavg"][1:])
    print(f"cohort {args.cohort}, {args.local_steps} local steps, MLP 64-{args.hidden}-10, "
          f"{torch.get_num_threads()} thread(s); median of {args.rounds - 1} rounds (first dropped); target 1.2x")
    for k, ts in times.items():
        med = statistics.median(ts[1:])
        ratio = med / base
        print(f"{k:11s} {1e3 * med:8.2f} ms/round  {ratio:5.2f}x fedavg  {'ok' if ratio <= 1.2 else 'OVER'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
