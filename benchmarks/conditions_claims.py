"""Measurement: what federation conditions do to learning, two seeds (issue 47, item 5).

1. Stragglers (Li et al., FedProx, MLSys 2020, §5.2 and Fig. 1): with 0 %, 50 % and 90 % of the clients too slow
   for the round deadline, FedAvg drops them and FedProx keeps their partial work. Clients' speeds are drawn once
   from uniform:1:10 local steps a second; with k local steps a client needs k / speed seconds, so the deadline
   k / (1 + 9 f) leaves a share f of the clients late (FedProx's stragglers). Claim: at 90 % stragglers FedProx
   with partial work ends above FedAvg dropping them.
2. Compression (Stich et al., NeurIPS 2018, §4; Karimireddy et al., ICML 2019): FedAvg with top-k at 1 % density
   and error feedback ends within 2 points of uncompressed FedAvg; without error feedback it ends lower.

Digits over 40 train clients (Dirichlet 0.3), MLP 64-32-10, ``--rounds`` rounds of 10 clients, ``--local-steps``
steps at lr 0.05; the figure is the final mean test accuracy of the train clients (the global model), mean over
the seeds. Each claim is printed beside its target; exit 1 on a miss.

    python benchmarks/conditions_claims.py [--rounds 150] [--local-steps 20] [--seeds 0,1]
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from verdict import Verdicts  # noqa: E402


def accuracy(name: str, seed: int, args, **keys) -> float:
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
    cfg = train_config(name, rounds=args.rounds, eval_every=args.rounds, clients_per_round=10,
                       local_steps=args.local_steps, lr=0.05, batch_size=16, val_fraction=0.0, seed=seed, **keys)
    run = train_federated(ds.x, ds.y, ds.num_classes, part, cfg, device=torch.device("cpu"))
    return float(run.outcome.best.summaries()["train"]["mean_accuracy"])


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=150)
    ap.add_argument("--local-steps", type=int, default=20)
    ap.add_argument("--seeds", default="0,1")
    args = ap.parse_args(argv)
    seeds = [int(s) for s in args.seeds.split(",")]
    v = Verdicts()

    def mean(name, **keys):
        values = [accuracy(name, s, args, **keys) for s in seeds]
        label = f"{name} {' '.join(f'{k}={x}' for k, x in keys.items() if k != 'compute_speed')}".strip()
        v.note(label, f"{100 * statistics.mean(values):.1f} % ({', '.join(f'{100 * x:.1f}' for x in values)})")
        return statistics.mean(values)

    print(f"digits, 40 clients (Dirichlet 0.3), 10 per round, {args.rounds} rounds x {args.local_steps} local steps, "
          f"seeds {seeds}; final mean test accuracy")
    got = {}
    for share in (0.0, 0.5, 0.9):
        keys = {} if share == 0 else {"compute_speed": "uniform:1:10",
                                      "round_deadline": round(args.local_steps / (1 + 9 * share), 4)}
        for name in ("fedavg", "fedprox"):
            got[(name, share)] = mean(name, **keys)
    v.check("90 % stragglers: fedprox (partial) - fedavg (drop)",
            f"{100 * (got[('fedprox', 0.9)] - got[('fedavg', 0.9)]):+.1f} points", "> 0",
            got[("fedprox", 0.9)] > got[("fedavg", 0.9)])
    plain = got[("fedavg", 0.0)]
    ef = mean("fedavg", compression="topk", compression_density=0.01)
    no_ef = mean("fedavg", compression="topk", compression_density=0.01, error_feedback=False)
    v.check("top-k 1 % with error feedback - uncompressed", f"{100 * (ef - plain):+.1f} points", ">= -2",
            ef - plain >= -0.02)
    v.check("top-k 1 %: with - without error feedback", f"{100 * (ef - no_ef):+.1f} points", "> 0", ef > no_ef)
    return v.finish()


if __name__ == "__main__":
    sys.exit(main())
