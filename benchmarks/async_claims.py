"""Measurement: FedBuff's simulated time to a target accuracy against synchronous FedAvg under heavy-tailed client
latency, two seeds (issue 47, item 5).

Nguyen et al. (AISTATS 2022, §6, Fig. 2-3) report FedBuff reaching a target accuracy several times faster in
wall-clock time than synchronous FedAvg when client durations are heavy-tailed: a synchronous round waits for its
slowest client, an asynchronous server does not. Here client speeds are drawn once per client from
``compute_speed=lognormal:1:1.5`` (median 1 local step a simulated second, sigma 1.5: a few clients ~20x slower);
FedAvg takes rounds of 10 clients and waits for all; FedBuff takes server steps of K = 10 buffered updates with
30 clients in flight. Same client SGD, same local steps, same data. The figure: the simulated seconds
(``metrics.csv``'s ``sim_seconds``) at the first evaluation whose mean test accuracy of the train clients (the
global model) reaches ``--target``, mean over the seeds; the claim: FedBuff's time is less than FedAvg's divided by
``--speedup`` (default 2). Exit 1 on a miss.

Digits over 40 train clients (Dirichlet 0.3), MLP 64-32-10, ``--rounds`` rounds (server steps) of ``--local-steps``
steps at lr 0.05, evaluated every ``--eval-every`` rounds.

    python benchmarks/async_claims.py [--rounds 60] [--eval-every 3] [--target 0.85] [--seeds 0,1]
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from verdict import Verdicts  # noqa: E402

LATENCY = "lognormal:1:1.5"


def curve(name: str, seed: int, args, **keys) -> list[tuple[float, float]]:
    """(simulated seconds, mean test accuracy) at every evaluation of one run."""
    import torch

    from pfl_cli.data import load_dataset
    from pfl_cli.fl import train_federated
    from pfl_cli.partition import PartitionConfig, partition_labels
    from pfl_cli.registry import train_config
    from pfl_cli.rng import make_rng

    ds = load_dataset("builtin:digits")
    part = partition_labels(ds.y, PartitionConfig(scheme="dirichlet", alpha=0.3, num_clients=40, holdout_clients=0,
                                                  seed=0, test_fraction=0.3),
                            num_classes=ds.num_classes, rng=make_rng(0, "partition"), pool=ds.pool)
    cfg = train_config(name, rounds=args.rounds, eval_every=args.eval_every, clients_per_round=10,
                       local_steps=args.local_steps, lr=0.05, batch_size=16, val_fraction=0.0, seed=seed,
                       compute_speed=LATENCY, **keys)
    run = train_federated(ds.x, ds.y, ds.num_classes, part, cfg, device=torch.device("cpu"))
    rows = run.outcome.history
    clock = {r[0]: float(r[3]) for r in rows if r[1] == "train" and r[2] == "sim_seconds"}
    acc = {r[0]: float(r[3]) for r in rows if r[1] == "train" and r[2] == "mean_accuracy"}
    return [(clock[t], acc[t]) for t in sorted(acc) if t in clock]


def time_to(points, target: float) -> float:
    return next((t for t, a in points if a >= target), float("inf"))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=60)
    ap.add_argument("--eval-every", type=int, default=3)
    ap.add_argument("--local-steps", type=int, default=20)
    ap.add_argument("--target", type=float, default=0.85)
    ap.add_argument("--speedup", type=float, default=2.0)
    ap.add_argument("--seeds", default="0,1")
    args = ap.parse_args(argv)
    seeds = [int(s) for s in args.seeds.split(",")]
    v = Verdicts()
    print(f"digits, 40 clients (Dirichlet 0.3), compute_speed={LATENCY}, {args.rounds} rounds x {args.local_steps} "
          f"local steps, seeds {seeds}; simulated seconds to {100 * args.target:.0f} % mean test accuracy")
    got = {}
    for name, keys in (("fedavg", {"momentum": 0.0}), ("fedbuff", {"momentum": 0.0, "concurrency": 30})):
        times, finals = [], []
        for s in seeds:
            points = curve(name, s, args, **keys)
            times.append(time_to(points, args.target))
            finals.append(points[-1][1])
        got[name] = statistics.mean(times)
        v.note(f"{name}: seconds to target", f"{got[name]:.0f} ({', '.join(f'{t:.0f}' for t in times)})")
        v.note(f"{name}: final accuracy", f"{100 * statistics.mean(finals):.1f} % "
                                          f"({', '.join(f'{100 * a:.1f}' for a in finals)})")
    ratio = got["fedavg"] / got["fedbuff"] if got["fedbuff"] > 0 else float("inf")
    v.check("fedavg / fedbuff simulated time to target", f"{ratio:.2f}x", f">= {args.speedup}x",
            ratio >= args.speedup and got["fedbuff"] < float("inf"))
    return v.finish()


if __name__ == "__main__":
    sys.exit(main())
