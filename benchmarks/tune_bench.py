"""`pflx tune` speed: a pruned TPE study reaches a full grid's best validation accuracy in <= 40 % of its CPU time.

The task is one where the bare default does not learn in the budget: FedAvg on 8x8 digits with two classes a
client (30 clients, 6 holdout), 40 rounds, at the default client lr 0.002 with momentum 0 (printed below).
The space is a grid of 8 lrs x 3 momenta (24 configs). Both studies train the same configs on the same
tuning partition (validation data only) with the same seed, one trial at a time in this process, so a config
scores the same in both, and CPU time (``time.process_time``) is summed over trials.

- grid: every one of the 24 configs runs to the end; its best validation accuracy is the target;
- pruned: TPE (Optuna) over the same 24 configs with the median pruner over evaluations every 4 rounds; the
  figure is the CPU time until its first trial at or within half a point of the grid's best (the same config
  scores identically in both studies, so "reached" means it found the grid's best config or one as good).

    python benchmarks/tune_bench.py [--rounds R] [--seed S]
"""

from __future__ import annotations

import argparse
import sys
import time

import numpy as np

from verdict import Verdicts

LRS = "0.0001,0.0003,0.001,0.003,0.01,0.03,0.1,0.3"
MOMENTA = "0,0.5,0.9"
TARGET = 0.40
TOLERANCE = 0.005


def _setup(rounds: int, seed: int):
    from pfl_cli import registry
    from pfl_cli.data import load_dataset
    from pfl_cli.partition import PartitionConfig, partition_labels
    from pfl_cli.rng import make_rng
    from pfl_cli.tune.space import resolve_space
    from pfl_cli.tune.split import validation_partition
    from pfl_cli.tune.trial import TuningData

    ds = load_dataset("builtin:digits")
    pcfg = PartitionConfig(scheme="pathological", classes_per_client=2, num_clients=30, holdout_clients=6,
                           test_fraction=0.25)
    part = partition_labels(ds.y, pcfg, num_classes=10, rng=make_rng(seed, "partition"), pool=ds.pool)
    vpart = validation_partition(part, val_fraction=0.2, val_clients=0.0, rng=make_rng(seed, "tune-validation"))
    cfg = registry.train_config("fedavg", rounds=rounds, eval_every=4, local_steps=10, clients_per_round=6,
                                momentum=0.0, mlp_hidden=(32,), device="cpu", seed=seed)
    params = resolve_space(registry.get("fedavg"), {"lr": f"choice:{LRS}", "momentum": f"choice:{MOMENTA}"})
    return TuningData(ds.x, ds.y, ds.num_classes, vpart), cfg, params


def _study(data, cfg, params, *, sampler, pruner, stop_at: float | None = None):
    """Run trials one by one; return (best value, CPU seconds in all, CPU seconds until stop_at was reached)."""
    import optuna

    from pfl_cli.tune.study import make_pruner, make_sampler
    from pfl_cli.tune.trial import Objective, TrialFailed

    study = optuna.create_study(direction="maximize", sampler=make_sampler(sampler, params, seed=cfg.seed),
                                pruner=make_pruner(pruner, rounds=cfg.rounds))
    objective = Objective(data, cfg, params, group="train", metric="mean_accuracy")
    spent, reached = [0.0], [None]

    def timed(trial) -> float:  # CPU of this process while the trial trains (pruned trials stop early)
        start = time.process_time()
        try:
            return objective(trial)
        finally:
            spent[0] += time.process_time() - start

    def stop_when_reached(study_, trial) -> None:
        if stop_at is not None and trial.value is not None and trial.state.name == "COMPLETE" \
                and trial.value >= stop_at - TOLERANCE and reached[0] is None:
            reached[0] = spent[0]
            study_.stop()

    # the grid runs its 24 configs; the pruned study may draw more (configs drawn again cost nothing)
    study.optimize(timed, n_trials=24 if sampler == "grid" else 48, catch=(TrialFailed,),
                   callbacks=[stop_when_reached])
    spent, reached = spent[0], reached[0]
    best = max((t.value for t in study.trials if t.value is not None and t.state.name == "COMPLETE"), default=None)
    return best, spent, reached, study


def main(argv: list[str]) -> int:
    import optuna

    from pfl_cli.fl.api import train_federated

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=40)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    data, cfg, params = _setup(args.rounds, args.seed)
    v = Verdicts()
    bare = train_federated(data.x, data.y, data.num_classes, data.partition, cfg)
    v.note("bare default (lr 0.002, momentum 0): validation", f"{100 * bare.outcome.best.summaries()['train']['mean_accuracy']:.1f} %")
    grid_best, grid_cpu, _, grid = _study(data, cfg, params, sampler="grid", pruner="none")
    v.note("grid: 24 configs, CPU", f"{grid_cpu:.1f} s")
    v.note("grid: best validation accuracy", f"{100 * grid_best:.2f} %")
    best, spent, reached, study = _study(data, cfg, params, sampler="tpe", pruner="median", stop_at=grid_best)
    pruned = sum(t.state.name == "PRUNED" for t in study.trials)
    v.note("pruned TPE: trials run (pruned)", f"{len(study.trials)} ({pruned})")
    if reached is None:
        v.check("pruned TPE reaches the grid's best", f"best {100 * (best or 0):.2f} %", f">= {100 * grid_best:.2f} %",
                False)
        return v.finish()
    v.note("pruned TPE: CPU to reach the grid's best", f"{reached:.1f} s")
    ratio = reached / grid_cpu
    v.check("pruned CPU / grid CPU (same run)", f"{ratio:.2f}", f"<= {TARGET:.2f}", ratio <= TARGET)
    return v.finish()


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
