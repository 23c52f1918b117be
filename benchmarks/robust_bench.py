"""Robust aggregators' cost per round against plain averaging (issue 48, item 6).

One round's server step on a cohort of C clients' models of P parameters (default: 50 clients of the MLP
3072-32-10 a CIFAR-sized input gives, P = 98,666): ``pfl_cli.fl.robust.robust_mean`` under each aggregator, timed
like for like against plain averaging on the same path -- the cohort's deltas gathered into the
``[clients, params]`` matrix, averaged with FedAvg's weights (one matrix-vector product) and added back -- in the
same process on the same stacked models. Each figure is the fastest of ``--repeats`` timings (the least disturbed
by other load on a shared machine), aggregator and baseline timed in alternation. FedAvg's own average
(``weighted_mean``, which needs no delta matrix) is printed beside it for scale. Every aggregator is torch ops
over the matrix (sorts along the client axis, Krum's distances from one Gram matrix), with no loop over clients.

Targets (the ratio to plain averaging on the matrix), from what each kernel adds: norm-bound and centered-clip
take the rows' norms and scale them (a few passes) -- at most 4x; krum and multi-krum one Gram matrix
(C x C x P multiply-adds) -- at most 20x; median and trimmed-mean sort every coordinate's C values with
Batcher's network (about C log^2 C / 4 = 400 min / max passes at C = 50) -- at most 60x; bulyan Krum's
selections and a sort of the chosen -- at most 80x. Exit 1 when one is missed.

    python benchmarks/robust_bench.py
    python benchmarks/robust_bench.py --clients 20 --params 20000 --repeats 3
"""

from __future__ import annotations

import argparse
import os
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

TARGETS = {"median": 60.0, "trimmed-mean": 60.0, "krum": 20.0, "multi-krum": 20.0, "bulyan": 80.0,
           "centered-clip": 4.0, "norm-bound": 4.0}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--clients", type=int, default=50)
    ap.add_argument("--params", type=int, default=98_666)
    ap.add_argument("--repeats", type=int, default=7)
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

    def matrix_mean():  # robust_mean's path with FedAvg's weighted mean as the combine
        keys = list(theta)
        X = torch.cat([(theta[k] - reference[k]).reshape(c, -1) for k in keys], dim=1)
        size = Store.fit.length[cohort].to(X.dtype)
        out = (size / size.sum()) @ X
        return {k: reference[k] + part.view_as(reference[k])
                for k, part in zip(keys, out.split([reference[k].numel() for k in keys]))}

    def timed(fn, base) -> tuple[float, float]:
        fn(), base()  # warm-up
        runs, bases = [], []
        for _ in range(args.repeats):
            for f, into in ((base, bases), (fn, runs)):
                t0 = time.perf_counter()
                f()
                into.append(time.perf_counter() - t0)
        return min(runs), min(bases)

    fedavg, plain = timed(lambda: weighted_mean(Store, cohort, theta), matrix_mean)
    print(f"cohort {c} clients x {p} parameters; plain averaging on the delta matrix {1e3 * plain:.2f} ms per round "
          f"(FedAvg's weighted_mean {1e3 * fedavg:.2f} ms)")
    missed = []
    for name in AGGREGATORS:
        if name == "mean":
            continue
        cfg = Cfg()
        cfg.aggregator = name
        t, base = timed(lambda: robust_mean(cfg, Store, cohort, theta, reference, center=center), matrix_mean)
        ratio = t / base
        ok = ratio <= TARGETS[name]
        missed += [] if ok else [name]
        print(f"{name:14s} {1e3 * t:9.2f} ms  {ratio:6.1f}x plain averaging  (target <= {TARGETS[name]:.0f}x)  "
              f"{'ok' if ok else 'MISS'}")
    if missed:
        print(f"missed: {', '.join(missed)}")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
