"""Benchmark: where FLowDUP helps. FLowDUP - FedAvg on unlabeled new clients against the number of labeled train clients.

The thesis (ch. 5, Table 5.2) measures FLowDUP on 600 clients, 60 of them labeled at p = 0.1.
A review run on held-out rotated digits with 48 train clients (about 10 labeled) had FLowDUP
tuned at 0.602 on the unlabeled new clients against FedAvg's 0.667 tuned. This script
measures the gap as the federation grows, at a fixed label prevalence p = 0.2 (the review's
share), on a task no test of pflx contains:

**Permuted digits.** scikit-learn's 8x8 digits; every client's pixels are shuffled by one of
``styles`` = 4 fixed random pixel permutations (drawn from the seed), one per client, uniform: a
feature shift that the client's unlabeled inputs reveal (as a rotation does in the thesis's
Rotated MNIST, §5.6.1) but no rotation, so none of the rotated stand-ins the tests train on. Clients
of 50 samples (35 fit, 15 test) drawn with replacement from pools of source images; a fifth of the
images is held out for the 60 new clients (half for their fit samples, half for their test
samples), so a new client is scored on images no one trained on and that are not among its own
unlabeled samples. ``labeled`` labeled train clients among 5 x ``labeled`` train clients (p = 0.2):
10, 30, 100, 300 labeled of 50, 150, 500, 1,500.

Both methods are tuned by pflx tune's study (``pfl_cli.tune``) on the draw's own train clients,
each in its own declared space (FLowDUP: eta_l and lambda; FedAvg: eta_l), ``--trials`` TPE trials
with the median pruner, for the new clients (FedAvg too). Validation clients: pflx tune's default
carve for a study of unlabeled new clients (``--validation-clients 0.2``, stratified so the clients
left to train keep the partition's labeled share: 2 labeled and 8 unlabeled of 50 train clients),
labels hidden from the method, scored on their held-back half. The best config then trains on the whole draw and is scored once, after its last round,
on the 60 new clients, which the study never read. Every run: the thesis's C.1.2 protocol (E = 1,
B = 50, FLowDUP alpha = 0.9, e = 256, k = d) except ``--rounds`` and a cohort of 10 (CPU).

    python benchmarks/flowdup_curve.py                                   # the curve of the doc
    python benchmarks/flowdup_curve.py --lr 0.3                          # both untuned, at FLowDUP's default lr
    python benchmarks/flowdup_curve.py --labeled 10 --seeds 0 --trials 2 --rounds 50   # a smoke run

It prints one row per (labeled clients, seed) and writes the table (``--json``) and the plot (``--png``).
"""

from __future__ import annotations

import argparse
import json
import sys
import time

import numpy as np

METHODS = ("fedavg", "flowdup")
P = 0.2  # the review's label prevalence (about 10 labeled of 48 train clients)
HEADER = "labeled  train  seed        FedAvg        FLowDUP  FLowDUP - FedAvg   (values: tuned, or --lr; CPU s)"
COMMON = dict(local_epochs=1, batch_size=50, clients_per_round=10, evaluate_hidden_labels=True, val_fraction=0.0)


def permuted_digits(seed: int, labeled: int, *, p: float = P, styles: int = 4, size: int = 50,
                    new_clients: int = 60, test_share: float = 0.3, held_out: float = 0.2):
    """The task: (x, y, partition) with ``labeled`` labeled train clients of round(labeled / p) train clients.

    Every client's samples are shuffled by one of ``styles`` pixel permutations (seeded); the new
    clients (role 1, unlabeled) draw from a held-out fifth of the source images.
    """
    from pfl_cli.data import load_dataset
    from pfl_cli.partition.base import Partition
    from pfl_cli.rng import make_rng

    ds = load_dataset("builtin:digits")
    rng = make_rng(seed, "flowdup-curve")
    perms = np.stack([rng.permutation(ds.x.shape[1]) for _ in range(styles)])
    order = rng.permutation(len(ds.y))
    h = int(round(held_out * len(order)))
    new_fit, new_test, train_pool = order[: h // 2], order[h // 2: h], order[h:]
    n_train = int(round(labeled / p))
    clients = n_train + new_clients
    n_test = int(round(test_share * size))
    n_fit = size - n_test
    role = np.zeros(clients, np.uint8)
    role[rng.choice(clients, new_clients, replace=False)] = 1
    new = role == 1
    fit = rng.choice(train_pool, (clients, n_fit))
    test = rng.choice(train_pool, (clients, n_test))
    fit[new] = rng.choice(new_fit, (new_clients, n_fit))
    test[new] = rng.choice(new_test, (new_clients, n_test))
    keep = np.zeros(clients, np.uint8)
    keep[rng.choice(np.flatnonzero(~new), labeled, replace=False)] = 1
    style = rng.integers(styles, size=clients)
    pixels = perms[style][:, None, :]  # (clients, 1, 64): client c's pixel j is source pixel pixels[c, 0, j]
    x = np.concatenate([np.take_along_axis(ds.x[idx], pixels, axis=2).reshape(-1, ds.x.shape[1]) for idx in (fit, test)])
    y = np.concatenate([ds.y[fit].ravel(), ds.y[test].ravel()])
    part = Partition(client_id=np.arange(clients, dtype=np.int64), role=role,
                     train_offsets=np.arange(clients + 1, dtype=np.int64) * n_fit,
                     train_indices=np.arange(clients * n_fit, dtype=np.int64),
                     test_offsets=np.arange(clients + 1, dtype=np.int64) * n_test,
                     test_indices=clients * n_fit + np.arange(clients * n_test, dtype=np.int64),
                     labeled=keep)
    part.check(len(y))
    return np.ascontiguousarray(x, dtype=np.float32), y.astype(np.int64), part, style


def untuned_accuracy(method: str, x, y, part, seed: int, *, lr: float, rounds: int) -> dict:
    """``method`` at local lr ``lr`` and its other keys' defaults (FLowDUP: lambda 1e-3), scored on the new clients."""
    from pfl_cli import registry
    from pfl_cli.fl import train_federated

    start = time.process_time()
    cfg = registry.train_config(method, **COMMON, rounds=rounds, seed=seed, eval_every=rounds, lr=lr)
    run = train_federated(x, y, 10, part, cfg, device="cpu")
    return {"accuracy": 100 * run.outcome.best.summaries()["holdout"]["mean_accuracy"], "values": {"lr": lr},
            "cpu_s": time.process_time() - start}


def tuned_accuracy(method: str, x, y, part, seed: int, *, trials: int, rounds: int) -> dict:
    """``method`` tuned by pflx tune's study on ``part``'s train clients, retrained, scored on the new clients."""
    import optuna

    from pfl_cli import registry
    from pfl_cli.fl import train_federated
    from pfl_cli.rng import make_rng
    from pfl_cli.tune.space import resolve_space
    from pfl_cli.tune.split import validation_partition
    from pfl_cli.tune.loop import optimize
    from pfl_cli.tune.study import best_trial, best_values, make_pruner, make_sampler
    from pfl_cli.tune.trial import Objective, TuningData

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    start = time.process_time()
    # pflx tune's default carve for a new-client study (pfl_cli.tune.plan.tuning_data): --validation-fraction
    # 0.2, --validation-clients 0.2, stratified so the labeled share of the clients left to train is kept
    vpart = validation_partition(part, val_fraction=0.2, val_clients=0.2, rng=make_rng(seed, "tune-validation"),
                                 unlabeled_validation_clients=True, x=x, y=y)
    carve = int(np.sum(vpart.role == 1))
    base = dict(COMMON, rounds=rounds, seed=seed)
    cfg = registry.train_config(method, **base, eval_every=max(1, rounds // 4))
    params = resolve_space(registry.get(method))
    study = optuna.create_study(direction="maximize", sampler=make_sampler("tpe", params, seed=seed),
                                pruner=make_pruner("median", rounds=rounds))
    optimize(study, Objective(TuningData(x, y, 10, vpart), cfg, params, group="holdout", metric="mean_accuracy"),
             trials)
    best = best_trial(study)
    values = best_values(best, params)
    final = registry.train_config(method, **base, eval_every=rounds, **values)  # scored once, after its last round
    run = train_federated(x, y, 10, part, final, device="cpu")
    return {"accuracy": 100 * run.outcome.best.summaries()["holdout"]["mean_accuracy"], "values": values,
            "validation": 100 * best.value, "validation_clients": carve,
            "pruned": sum(t.state.name == "PRUNED" for t in study.trials), "cpu_s": time.process_time() - start}


def plot(rows: list[dict], path: str) -> None:
    """FLowDUP - FedAvg per draw and the mean of the seeds against the labeled train clients (log axis)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    sizes = sorted({r["labeled"] for r in rows})
    fig, ax = plt.subplots(figsize=(5.5, 3.6))
    for seed in sorted({r["seed"] for r in rows}):
        pts = sorted((r["labeled"], r["flowdup"] - r["fedavg"]) for r in rows if r["seed"] == seed)
        ax.plot(*zip(*pts), "o", alpha=0.6, label=f"seed {seed}")
    mean = [np.mean([r["flowdup"] - r["fedavg"] for r in rows if r["labeled"] == s]) for s in sizes]
    ax.plot(sizes, mean, "k-", label="mean of seeds")
    ax.axhline(0.0, color="grey", lw=0.8)
    ax.set_xscale("log")
    ax.set_xticks(sizes, [str(s) for s in sizes])
    ax.set_xlabel("labeled train clients (p = 0.2 of the train clients)")
    ax.set_ylabel("FLowDUP - FedAvg (points, new clients)")
    ax.set_title(f"Permuted digits, {rows[0].get('mode', 'both tuned by pflx tune')}")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--labeled", default="10,30,100,300", help="labeled train clients, comma-separated")
    ap.add_argument("--seeds", default="0,1", help="seeds of the draws, comma-separated")
    ap.add_argument("--trials", type=int, default=5, help="study trials per method and draw")
    ap.add_argument("--rounds", type=int, default=150, help="rounds of every trial and final run")
    ap.add_argument("--lr", type=float, default=None,
                    help="instead of tuning: both methods at this local lr, their other keys at their defaults")
    ap.add_argument("--json", default="", help="write the rows here")
    ap.add_argument("--png", default="", help="write the plot here")
    ap.add_argument("--merge", nargs="+", default=(), metavar="JSON",
                    help="instead: the table and plot of the rows of earlier runs' --json files (e.g. one per seed)")
    args = ap.parse_args(argv)
    if args.merge:
        rows = sorted((r for path in args.merge for r in json.load(open(path))), key=lambda r: (r["labeled"], r["seed"]))
        report(rows, args.png)
        return 0
    rows = []
    print(HEADER, flush=True)
    for labeled in (int(v) for v in args.labeled.split(",")):
        for seed in (int(v) for v in args.seeds.split(",")):
            x, y, part, _ = permuted_digits(seed, labeled)
            if args.lr is None:
                res = {m: tuned_accuracy(m, x, y, part, seed, trials=args.trials, rounds=args.rounds) for m in METHODS}
            else:
                res = {m: untuned_accuracy(m, x, y, part, seed, lr=args.lr, rounds=args.rounds) for m in METHODS}
            row = {"labeled": labeled, "train": int(np.sum(part.role == 0)), "seed": seed,
                   "mode": f"both tuned by pflx tune, {args.trials} trials" if args.lr is None else f"both at lr {args.lr:g}",
                   **{m: round(res[m]["accuracy"], 2) for m in METHODS},
                   "detail": {m: {k: v for k, v in res[m].items() if k != "accuracy"} for m in METHODS}}
            rows.append(row)
            print(line(row), flush=True)
            if args.json:
                with open(args.json, "w") as f:
                    json.dump(rows, f, indent=1, default=float)
    report(rows, args.png, table=False)
    return 0


def line(row: dict) -> str:
    d = row["detail"]
    return (f"{row['labeled']:7d}  {row['train']:5d}  {row['seed']:4d}  {row['fedavg']:12.1f}  {row['flowdup']:13.1f}  "
            f"{row['flowdup'] - row['fedavg']:+16.1f}   (FedAvg {fmt(d['fedavg']['values'])}, {d['fedavg']['cpu_s']:.0f} s; "
            f"FLowDUP {fmt(d['flowdup']['values'])}, {d['flowdup']['cpu_s']:.0f} s)")


def fmt(values: dict) -> str:
    return ", ".join(f"{k} {v:.3g}" for k, v in values.items())


def report(rows: list[dict], png: str, *, table: bool = True) -> None:
    if table:
        print(HEADER)
        for row in rows:
            print(line(row))
    for labeled in sorted({r["labeled"] for r in rows}):
        d = [r["flowdup"] - r["fedavg"] for r in rows if r["labeled"] == labeled]
        print(f"labeled {labeled}: mean FLowDUP - FedAvg {np.mean(d):+.1f} over {len(d)} seed(s)")
    if png:
        plot(rows, png)


if __name__ == "__main__":
    sys.exit(main())
