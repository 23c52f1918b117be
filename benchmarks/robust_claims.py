"""Byzantine clients vs robust aggregators on builtin:digits: the numbers of docs/robustness.md (issue 48, item 5).

Each cell is the run of

    pflx partition --dataset builtin:digits --dirichlet 1.0 --num-clients 30 --seed 0 --out part
    pflx train --partition part --algorithm ALG --rounds 30 --eval-every 10 --clients-per-round 15 \\
        --local-steps 10 --lr 0.05 --val-fraction 0 --seed S --set mlp_hidden=[32] \\
        --set attack=ATTACK --set aggregator=AGG

(attack none: the clean run), trained here through the library (``train_federated``, the same engine) to keep
the grid fast. It prints, per algorithm, attack and aggregator, the honest train clients' mean test accuracy
(metrics.json's ``byzantine.honest.mean_accuracy``; the clean run's train clients all count) and, for the
backdoor, its success rate, for each seed. ``--json PATH`` also writes the numbers.

    python benchmarks/robust_claims.py --seeds 0 1
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

RUN = {"rounds": 30, "eval_every": 10, "clients_per_round": 15, "local_steps": 10, "lr": 0.05, "val_fraction": 0.0,
       "mlp_hidden": (32,)}
ATTACKS = ("none", "sign-flip", "backdoor", "alie")
AGGREGATORS = ("mean", "median", "trimmed-mean", "krum", "bulyan", "centered-clip", "norm-bound")
GRID = [("fedavg", a, g) for a in ATTACKS for g in AGGREGATORS] + [("ditto", a, "mean") for a in ATTACKS]


def partition():
    from pfl_cli.data import load_dataset
    from pfl_cli.partition import PartitionConfig, partition_labels
    from pfl_cli.rng import make_rng

    ds = load_dataset("builtin:digits")
    part = partition_labels(ds.y, PartitionConfig(scheme="dirichlet", alpha=1.0, num_clients=30),
                            num_classes=ds.num_classes, rng=make_rng(0, "partition"), pool=ds.pool)
    return ds, part


def cell(ds, part, alg: str, attack: str, aggregator: str, seed: int, **extra) -> dict:
    import torch

    from pfl_cli.fl.api import train_federated
    from pfl_cli.registry import train_config

    keys = {**RUN, "seed": seed, "attack": attack, "aggregator": aggregator, **extra}
    if attack == "none":
        keys.pop("attack")
    run = train_federated(ds.x, ds.y, ds.num_classes, part, train_config(alg, **keys), device=torch.device("cpu"))
    if run.algorithm.byzantine is None:
        return {"honest": run.outcome.best.summaries()["train"]["mean_accuracy"]}
    m = run.algorithm.byzantine.metrics(run.outcome, run.outcome.history)
    return {"honest": m["honest"]["mean_accuracy"], "asr": m.get("backdoor_attack_success_rate")}


def _value(kv: str):
    k, v = kv.split("=", 1)
    return k, float(v)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1])
    ap.add_argument("--json", default=None)
    ap.add_argument("--only", default=None, help="comma-separated attacks to run (default: all)")
    ap.add_argument("--cell", action="append", default=[], metavar="ALG,ATTACK,AGG[,KEY=VALUE...]",
                    help="run these cells instead of the grid (repeatable), e.g. fedavg,alie,krum,attack_scale=3")
    args = ap.parse_args(argv)
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    ds, part = partition()
    grid = [(*c, {}) for c in GRID if args.only is None or c[1] in args.only.split(",")]
    if args.cell:
        grid = [(*c.split(",")[:3], dict(_value(kv) for kv in c.split(",")[3:])) for c in args.cell]
    out = {}
    for alg, attack, agg, extra in grid:
        t0 = time.perf_counter()
        res = [cell(ds, part, alg, attack, agg, s, **extra) for s in args.seeds]
        tag = ",".join(f"{k}={v}" for k, v in extra.items())
        agg = f"{agg} {tag}".strip()
        out[f"{alg}|{attack}|{agg}"] = res
        acc = " ".join(f"{100 * r['honest']:5.1f}" for r in res)
        asr = " ".join(f"{100 * r['asr']:5.1f}" for r in res if r.get("asr") is not None)
        print(f"{alg:7s} {attack:10s} {agg:30s} honest acc % {acc}" + (f"  backdoor ASR % {asr}" if asr else "")
              + f"  ({time.perf_counter() - t0:.0f} s)", flush=True)
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(out, fh, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
