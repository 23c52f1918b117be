"""Robust aggregators' cost per round against plain averaging (issue 48, item 6).

One round's server step on a cohort of C clients' models of P parameters (default: 50 clients of the MLP
3072-32-10 a CIFAR-sized input gives, P = 98,666): ``pfl_cli.fl.robust.robust_mean`` under each aggregator, timed
against ``pfl_cli.fl.params.weighted_mean`` (FedAvg's average) in the same process on the same stacked models;
each figure is the median of ``--repeats`` timings. Every aggregator is torch ops over the ``[clients, params]``
matrix (sorts along the client axis, Krum's distances from one Gram matrix), with no loop over clients.

Targets (the ratio to plain averaging, one run, like for like), from what each kernel must do beyond the
average's one read of the cohort: centered-clip and norm-bound build the cohort's delta matrix and its norms (a few
passes) -- at most 60x; krum and multi-krum add one Gram matrix (C x C x P multiply-adds) -- at most 150x;
median and trimmed-mean sort every coordinate's C values with Batcher's network (about C log^2 C / 4 = 400
min / max passes at C = 50) -- at most 400x; bulyan adds Krum's selections to a sort -- at most 500x.
Exit 1 when one is missed.

    python benchmarks/robust_bench.py
    python benchmarks/robust_bench.py --clients 20 --params 20000 --repeats 3
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

TARGETS = {"median": 400.0, "trimmed-mean": 400.0, "krum": 150.0, "multi-krum": 150.0, "bulyan": 500.0,
           "centered-clip": 60.0, "norm-bound": 60.0}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--clients", type=int, default=50)
    ap.add_argument("--params", type=int, default=98_666)
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args(argv)

    import torch

    from pfl_cli.fl.params import weighted_mean
    from pfl_cli.fl.robust import AGGREGATORS, robust_mean
    from pfl_cli.fl.store import Padded

    torch.manual_seed(0)
    c, p = args.clients, args.params
    shapes = {"w1": (p - p // 4,), "w2": (p // 4,)}
    reference = {k: torch.randn(s) for k, s in shapes.items()}
    theta = {k: v + 0.01 * torch.randn(c, *v.shape) for k, v in reference.items()}
    cohort = torch.arange(c)

    class Store:  # the one field the averages read: the clients' fit sizes
        fit = Padded(index=torch.zeros((c, 1), dtype=torch.long), length=torch.randint(10, 100, (c,)))

    class Cfg:
        robust_fraction, robust_clip = 0.2, None

    center = {k: torch.zeros_like(v) for k, v in reference.items()}

    def timed(fn) -> float:
        fn()  # warm-up
        runs = []
        for _ in range(args.repeats):
            t0 = time.perf_counter()
            fn()
            runs.append(time.perf_counter() - t0)
        return statistics.median(runs)

    base = timed(lambda: weighted_mean(Store, cohort, theta))
    print(f"cohort {c} clients x {p} parameters; plain averaging {1e3 * base:.2f} ms per round")
    missed = []
    for name in AGGREGATORS:
        if name == "mean":
            continue
        cfg = Cfg()
        cfg.aggregator = name
        t = timed(lambda: robust_mean(cfg, Store, cohort, theta, reference, center=center))
        ratio = t / base
        ok = ratio <= TARGETS[name]
        missed += [] if ok else [name]
        print(f"{name:14s} {1e3 * t:9.2f} ms  {ratio:7.1f}x averaging  (target <= {TARGETS[name]:.0f}x)  "
              f"{'ok' if ok else 'MISS'}")
    if missed:
        print(f"missed: {', '.join(missed)}")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
