"""Measurement: seconds per round of FedFomo and APPLE beside FedAvg's (same clients, cohort, model and steps).

Issue 40's speed target: a new algorithm's round within 1.2x FedAvg's round times the work its method adds,
counted here in forward-pass sample-equivalents of the client net (a training step on b samples is ~3 b: one
forward, two for the backward):

- FedFomo adds, per cohort client, the M received models gathered beside its own and their M + 1 evaluations on
  its validation split (Eq. 3), then a weighted sum of M models: its added work is timed as the engine's own
  routines doing the same (the gather of the (c, M + 1) models from the per-client store and
  ``pfl_cli.fl.evaluate.evaluate`` of those c (M + 1) models on the clients' validation splits, the same
  interleaved rounds), so its target is ``1.2 (FedAvg + that work) / FedAvg``; the forward-pass count alone,
  ``1 + (M + 1) n_val / (3 K b)``, is printed beside it (it leaves out the M model copies, which on a CPU cost
  as much as the evaluations);
- APPLE adds, at every local step, the weighted sum of the N core models and its backward (the inner products
  of the DR gradient): two passes over N models against ~3 b sample-passes of one model, work factor
  ``1 + 2 N / (3 b)``.

Each runs ``--rounds`` interleaved rounds of ``--cohort`` clients on the digits clients of
``benchmarks/round_timing.py`` (40 train clients, Dirichlet 0.3) with 10 % of each client's samples carved for
validation (FedFomo reads it; every algorithm gets the same store), plain SGD at one lr; the median round is
printed with its ratio to FedAvg's and its target. Exit 1 on a missed target.

    python benchmarks/fomo_apple_round.py [--cohort 16] [--local-steps 10] [--hidden 256] [--rounds 20]
"""

from __future__ import annotations

import round_timing  # benchmarks/ is the script's own folder, first on sys.path


def digits_store_with_validation():
    """round_timing's digits clients, 10 % of each train client's samples carved for validation."""
    from pfl_cli.data import load_dataset
    from pfl_cli.fl.store import build_store
    from pfl_cli.partition import PartitionConfig, partition_labels
    from pfl_cli.rng import make_rng

    ds = load_dataset("builtin:digits")
    part = partition_labels(ds.y, PartitionConfig(scheme="dirichlet", alpha=0.3, num_clients=40, holdout_clients=0,
                                                  seed=0), num_classes=ds.num_classes, rng=make_rng(0, "partition"),
                            pool=ds.pool)
    return build_store(ds.x, ds.y, ds.num_classes, part, val_fraction=0.1, rng=make_rng(0, "validation-split"),
                       device="cpu")


class FomoWork:
    """The work FedFomo adds to a FedAvg round, done by the engine's own routines: gather each cohort client's model
    and M others from the per-client store, evaluate the c (M + 1) models on the clients' validation splits."""

    def __init__(self, fomo) -> None:
        self.fomo = fomo

    def run_round(self, t, cohort, gen):
        import torch

        from pfl_cli.fl.evaluate import evaluate

        fomo = self.fomo
        others = torch.stack([torch.randperm(len(fomo.pool), generator=gen)[:fomo.models_down()]
                              for _ in range(len(cohort))])
        rows = torch.cat([cohort[:, None], fomo.pool[others]], 1)
        models = {k: v[rows].flatten(0, 1) for k, v in fomo.private.values.items()}
        evaluate(fomo.net, models, fomo.store, cohort.repeat_interleave(rows.shape[1]).numpy(), "val",
                 personalized=True)


def main(argv=None) -> int:
    from pfl_cli.fl.api import make_algorithm
    from pfl_cli.fl.store import ROLE_TRAIN
    from pfl_cli.registry import train_config

    ap = round_timing.parser(__doc__)
    ap.add_argument("--batch-size", type=int, default=32)
    args = ap.parse_args(argv)
    store = digits_store_with_validation()
    common = dict(local_steps=args.local_steps, local_epochs=None, lr=0.05, batch_size=args.batch_size,
                  mlp_hidden=(args.hidden,), clients_per_round=args.cohort, momentum=0.0)
    algs = {k: make_algorithm(train_config(k, **common), store) for k in ("fedavg", "fedfomo", "apple")}
    algs["fomo-work"] = FomoWork(algs["fedfomo"])
    medians = round_timing.median_round_seconds(algs, store, args)
    k, b = args.local_steps, min(args.batch_size, int(store.fit.length.max()))
    m = algs["fedfomo"].models_down()
    n_val = float(store.val.length[store.clients(ROLE_TRAIN)].float().mean())
    n = len(algs["apple"].pool)
    base = medians["fedavg"]
    added = medians.pop("fomo-work")
    work = {"fedavg": 1.0, "fedfomo": (base + added) / base, "apple": 1 + 2 * n / (3 * b)}
    print(f"FedFomo: M = {m}, mean validation samples {n_val:.1f}, its added work timed by the engine's gather and "
          f"evaluate: {1e3 * added:.2f} ms/round (forward-pass count alone: {1 + (m + 1) * n_val / (3 * k * b):.2f}x); "
          f"APPLE: N = {n} core models; K = {k}, b = {b}")
    missed = False
    for name, med in medians.items():
        target = 1.2 * work[name]
        print(f"{name:8s} {1e3 * med:8.2f} ms/round  {med / base:5.2f}x fedavg  target {target:5.2f}x "
              f"(1.2 x work {work[name]:.2f})  {'ok' if med / base <= target else 'OVER'}")
        missed |= med / base > target
    return 1 if missed else 0  # a missed target is a failed benchmark


if __name__ == "__main__":
    raise SystemExit(main())
