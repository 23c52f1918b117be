"""Measurement: FedAsync's regularizer rho and FedBuff's server momentum, each against its default, two seeds
(issue 47).

The task is one no test contains: the ring (``ring:?train_per_class=60&test_per_class=30``, 10 classes on a circle
plus 62 noise features) over 30 train clients (Dirichlet 0.3), client speeds ``lognormal:1:1.5`` (a few clients ~20x
slower than the median, so updates arrive stale), the MLP 64-32-10, 10 local steps at lr 0.05, ``--rounds`` rounds of
10 arrivals (FedBuff: server steps of K = 10), 30 clients in flight. Printed per setting: the final mean test
accuracy of the train clients under the global model, per seed and the mean. No claim is tested (exit 0): the
figures show what each key does on a task the tests do not tune for.

    python benchmarks/async_keys.py [--rounds 40] [--seeds 0,1]
"""

from __future__ import annotations

import argparse
import statistics

SETTINGS = [
    ("fedasync", {}),
    ("fedasync", {"rho": 0.01}),
    ("fedasync", {"rho": 0.1}),
    ("fedbuff", {}),
    ("fedbuff", {"server_momentum": 0.5}),
    ("fedbuff", {"server_momentum": 0.9, "server_lr": 0.1}),
]


def final_accuracy(name: str, seed: int, rounds: int, **keys) -> float:
    import torch

    from pfl_cli.data import load_dataset
    from pfl_cli.fl import train_federated
    from pfl_cli.partition import PartitionConfig, partition_labels
    from pfl_cli.registry import train_config
    from pfl_cli.rng import make_rng

    ds = load_dataset("ring:?train_per_class=60&test_per_class=30")
    part = partition_labels(ds.y, PartitionConfig(scheme="dirichlet", alpha=0.3, num_clients=30, holdout_clients=0,
                                                  seed=0, test_fraction=0.3),
                            num_classes=ds.num_classes, rng=make_rng(0, "partition"), pool=ds.pool)
    cfg = train_config(name, rounds=rounds, eval_every=rounds, clients_per_round=10, concurrency=30,
                       local_steps=10, lr=0.05, batch_size=16, val_fraction=0.0, seed=seed, mlp_hidden=(32,),
                       compute_speed="lognormal:1:1.5", **keys)
    run = train_federated(ds.x, ds.y, ds.num_classes, part, cfg, device=torch.device("cpu"))
    acc = [float(r[3]) for r in run.outcome.history if r[1] == "train" and r[2] == "mean_accuracy"]
    return acc[-1]


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=40)
    p.add_argument("--seeds", default="0,1")
    a = p.parse_args(argv)
    import torch

    torch.set_num_threads(1)
    seeds = [int(s) for s in a.seeds.split(",")]
    print("| algorithm | keys | final mean test accuracy (seeds " + ", ".join(map(str, seeds)) + ") | mean |")
    print("|---|---|---|---|")
    for name, keys in SETTINGS:
        accs = [final_accuracy(name, s, a.rounds, **keys) for s in seeds]
        shown = ", ".join(f"{k}={v}" for k, v in keys.items()) or "defaults"
        print(f"| {name} | {shown} | {', '.join(f'{100 * x:.1f}' for x in accs)} | {100 * statistics.mean(accs):.1f} |",
              flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
