"""The run axis: K stacked FedAvg runs in one process against K separate runs (``pfl_cli.fl.stack``).

The digits MLP (64-32-10, 2,410 parameters) on 8x8 digits with two classes a client (50 clients, 10 holdout),
cohort 10, 100 rounds of 10 local steps, batch 32, evaluated every 10 rounds. The K runs differ in seed and
client lr, as a study's trials or a table's seeds do. CPU time (``time.process_time``, one thread) of:

- stacked: ``train_stacked`` of K runs in this process (one batched local-SGD call per step over K x 10 rows);
- separate, in process: the same K runs one ``train_federated`` call after another in this process;
- separate processes: K fresh Python processes, each importing pflx, reading the data and training one run (what K
  ``pflx train`` commands cost; their CPU from ``os.times`` of the children).

Target (issue 41): stacked K = 8 in at most 1/3 of the CPU time of 8 separate processes; the curve for
K = 1, 2, 4, 8, 16 is printed beside it.

The study: ``pflx tune``'s loop (:func:`pfl_cli.tune.loop.optimize`, TPE seeded per trial, the median pruner)
of 16 FedAvg trials over lr and momentum on the tuning partition (validation data only; 30 clients of two
classes, 40 rounds, evaluated every 4), with ``stack=8`` against one trial at a time, in this process. Target:
the same best validation score (within half a point) in at most 1/2 of the CPU time.

    python benchmarks/stack_bench.py [--rounds R] [--ks 1,2,4,8,16] [--part runs|tune|both]
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time

from verdict import Verdicts

TARGET = 1 / 3


def _data():
    from pfl_cli.data import load_dataset
    from pfl_cli.partition import PartitionConfig, partition_labels
    from pfl_cli.rng import make_rng

    ds = load_dataset("builtin:digits")
    pcfg = PartitionConfig(scheme="pathological", classes_per_client=2, num_clients=50, holdout_clients=10,
                           test_fraction=0.25)
    return ds, partition_labels(ds.y, pcfg, num_classes=10, rng=make_rng(0, "partition"), pool=ds.pool)


def _config(k: int, rounds: int):
    """Run k of the stack: seed k, a client lr on a log grid between 0.01 and 0.3."""
    from pfl_cli import registry

    lr = float(0.01 * 30 ** ((k % 8) / 7))
    return registry.train_config("fedavg", rounds=rounds, clients_per_round=10, local_steps=10, batch_size=32,
                                 eval_every=10, model_arch="mlp", mlp_hidden=(32,), device="cpu", seed=k, lr=lr)


def _one(k: int, rounds: int) -> None:
    """A separate process's run (``--one K``): what one ``pflx train`` does, minus the artifact's files."""
    from pfl_cli.fl.api import train_federated

    ds, part = _data()
    train_federated(ds.x, ds.y, ds.num_classes, part, _config(k, rounds))


def _tune(stack: int, seed: int = 0):
    """(best value, CPU seconds, trials pruned) of the 16-trial study trained ``stack`` trials at a time."""
    import numpy as np
    import optuna

    from pfl_cli import registry
    from pfl_cli.data import load_dataset
    from pfl_cli.partition import PartitionConfig, partition_labels
    from pfl_cli.rng import make_rng
    from pfl_cli.tune.space import resolve_space
    from pfl_cli.tune.split import validation_partition
    from pfl_cli.tune.loop import Proposals, optimize
    from pfl_cli.tune.study import make_pruner
    from pfl_cli.tune.trial import Objective, TuningData

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    ds = load_dataset("builtin:digits")
    pcfg = PartitionConfig(scheme="pathological", classes_per_client=2, num_clients=30, holdout_clients=6,
                           test_fraction=0.25)
    part = partition_labels(ds.y, pcfg, num_classes=10, rng=make_rng(seed, "partition"), pool=ds.pool)
    vpart = validation_partition(part, val_fraction=0.2, val_clients=0.0, rng=make_rng(seed, "tune-validation"))
    cfg = registry.train_config("fedavg", rounds=40, eval_every=4, local_steps=10, clients_per_round=6,
                                mlp_hidden=(32,), device="cpu", seed=seed)
    params = resolve_space(registry.get("fedavg"), {"lr": "log:1e-4:1", "momentum": "choice:0,0.5,0.9"})
    study = optuna.create_study(direction="maximize", pruner=make_pruner("median", rounds=cfg.rounds))
    objective = Objective(TuningData(ds.x, ds.y, ds.num_classes, vpart), cfg, params, group="train",
                          metric="mean_accuracy")
    start = time.process_time()
    optimize(study, objective, 16, proposals=Proposals("tpe", params, seed), stack=stack)
    spent = time.process_time() - start
    done = [t for t in study.trials if t.state.name == "COMPLETE"]
    return max(t.value for t in done), spent, sum(t.state.name == "PRUNED" for t in study.trials)


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=100)
    ap.add_argument("--ks", default="1,2,4,8,16")
    ap.add_argument("--part", default="both", choices=("runs", "tune", "both"))
    ap.add_argument("--one", type=int, default=None, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.one is not None:
        _one(args.one, args.rounds)
        return 0
    import torch

    torch.set_num_threads(1)
    v = Verdicts()
    if args.part in ("runs", "both"):
        _runs(args, v)
    if args.part in ("tune", "both"):
        alone, alone_cpu, alone_pruned = _tune(1)
        stacked, stacked_cpu, stacked_pruned = _tune(8)
        v.note("study of 16, one at a time: best, CPU (pruned)",
               f"{100 * alone:.2f} %, {alone_cpu:.1f} s ({alone_pruned})")
        v.note("study of 16, --stack 8: best, CPU (pruned)",
               f"{100 * stacked:.2f} %, {stacked_cpu:.1f} s ({stacked_pruned})")
        v.check("--stack 8 best validation - one at a time", f"{100 * (stacked - alone):+.2f} points", ">= -0.50",
                stacked >= alone - 0.005)
        ratio = stacked_cpu / alone_cpu
        v.check("--stack 8 CPU / one at a time CPU", f"{ratio:.2f}", "<= 0.50", ratio <= 0.5)
    return v.finish()


def _runs(args, v) -> None:
    import torch

    from pfl_cli.fl.api import train_federated
    from pfl_cli.fl.stack import train_stacked

    ks = [int(k) for k in args.ks.split(",")]
    ds, part = _data()
    v.note("device", f"cpu, {torch.get_num_threads()} thread")
    separate = []
    for k in range(max(ks)):  # each run's CPU alone: the in-process baseline of every K is the sum of the first K
        start = time.process_time()
        train_federated(ds.x, ds.y, ds.num_classes, part, _config(k, args.rounds))
        separate.append(time.process_time() - start)
    procs = []
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
    for k in range(8):
        before = os.times()
        subprocess.run([sys.executable, __file__, "--one", str(k), "--rounds", str(args.rounds)], check=True, env=env)
        after = os.times()
        procs.append(after.children_user + after.children_system - before.children_user - before.children_system)
    v.note("one separate process (import, data, 1 run), CPU", f"{sum(procs) / len(procs):.2f} s")
    print(f"  {'K':>3} {'stacked':>10} {'K in process':>13} {'ratio':>7} {'K processes':>12} {'ratio':>7}")
    ratio8 = None
    for k in ks:
        start = time.process_time()
        results = train_stacked(ds.x, ds.y, ds.num_classes, part, [_config(j, args.rounds) for j in range(k)])
        stacked = time.process_time() - start
        failed = [r.error for r in results if r.error is not None]
        if failed:
            raise failed[0]
        inproc = sum(separate[:k])
        each = sum(procs) / len(procs)
        print(f"  {k:>3} {stacked:>9.2f}s {inproc:>12.2f}s {stacked / inproc:>7.2f} {k * each:>11.2f}s "
              f"{stacked / (k * each):>7.2f}", flush=True)
        if k == 8:
            ratio8 = stacked / sum(procs)
    if ratio8 is not None:
        v.check("stacked K=8 / 8 separate processes (CPU)", f"{ratio8:.2f}", f"<= {TARGET:.2f}", ratio8 <= TARGET)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
