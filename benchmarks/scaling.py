"""How cost grows with the problem size: partition, mdm-fit and a train round, measured, on a log-log plot.

Stages (each point is the best of a few runs, measured in this run):

- partition, labels: Dirichlet(0.1) split of N labels (100 classes) into 1,000 clients, N = 1e5 .. 1e8;
- partition, clients: 1e7 labels into J = 1e3 .. 1e6 clients;
- mdm-fit: K = 3, C = 10, 20 full-batch rounds on 1e3 .. 1e6 clients;
- train: one PeFLL round (digits-sized MLP, k = 50, vmap cohort) with cohort 1 .. 256.

A sweep stops early when one point takes longer than ``--max-seconds`` (the larger sizes are
reported as skipped, never extrapolated). The slope of log(time) on log(size) over each
stage's points is its growth exponent (1 = linear); a stage whose slope exceeds
``--max-slope`` (default 1.2) misses its target and the script exits 1. Writes
``scaling.csv`` and ``scaling.png`` (log-log, each stage's slope over all its points and over its last step in the legend) to ``--out``.

    python benchmarks/scaling.py [--out benchmarks/results] [--max-seconds 60] [--quick]
"""

from __future__ import annotations

import argparse
import csv
import pathlib
import sys

import numpy as np
from verdict import Verdicts, best_of

HERE = pathlib.Path(__file__).resolve().parent


def partition_point(num_labels: int, num_clients: int):
    from pfl_cli.partition import PartitionConfig, partition_labels, validate_config

    labels = np.random.default_rng(0).integers(0, 100, size=num_labels)
    cfg = validate_config(PartitionConfig(num_clients=num_clients, alpha=0.1, min_size=0, test_fraction=0.0),
                          num_samples=num_labels, num_classes=100, has_labels=True, has_clients=False,
                          has_test_pool=False)
    return lambda: partition_labels(labels, cfg, num_classes=100, rng=np.random.default_rng(1))


def mdm_point(num_clients: int):
    from pfl_cli.mdm import MDMParams, fit_mdm, sample_clients
    from pfl_cli.mdm.model import integer_size_edges

    probs = np.zeros((3, 20))
    probs[:, 19] = 1.0
    alpha = np.random.default_rng(2).uniform(0.2, 5.0, size=(3, 10))
    true = MDMParams(np.array([0.5, 0.2, 0.3]), alpha, probs, integer_size_edges(20))
    counts = sample_clients(true, num_clients, rng=np.random.default_rng(0)).counts
    return lambda: fit_mdm(counts, num_components=3, rounds=20, rng=np.random.default_rng(1))


def train_point(cohort: int):
    import torch

    from pfl_cli.algorithms import PeFLL
    from pfl_cli.registry import train_config
    from pfl_cli.fl.store import build_store
    from pfl_cli.partition import PartitionConfig, partition_labels
    from pfl_cli.rng import make_rng

    rng = np.random.default_rng(0)
    n = 256 * 60
    x = rng.normal(size=(n, 64)).astype(np.float32)
    y = rng.integers(0, 10, size=n)
    part = partition_labels(y, PartitionConfig(scheme="iid", num_clients=256, test_fraction=0.1), num_classes=10,
                            rng=make_rng(0, "scaling"))
    store = build_store(x, y, 10, part, val_fraction=0.0, rng=None, device=torch.device("cpu"))
    cfg = train_config(algorithm="pefll", local_steps=50, lr=0.05, model_arch="mlp", embedding="mlp", embed_dim=8,
                      cohort_exec="vmap")
    alg = PeFLL(cfg, store)
    clients = torch.arange(cohort)
    alg.run_round(0, clients, torch.Generator().manual_seed(0))  # warm-up
    return lambda: alg.run_round(1, clients, torch.Generator().manual_seed(1))


STAGES = {
    "partition (labels, 1e3 clients)": ("labels", [10**5, 10**6, 10**7, 10**8], lambda n: partition_point(n, 1000)),
    "partition (clients, 1e7 labels)": ("clients", [10**3, 10**4, 10**5, 10**6], lambda j: partition_point(10**7, j)),
    "mdm-fit (20 rounds)": ("clients", [10**3, 10**4, 10**5, 10**6], mdm_point),
    "train (1 PeFLL round, k=50)": ("cohort", [1, 4, 16, 64, 256], train_point),
}


def slopes(sizes, seconds) -> tuple[float, float]:
    """Least-squares slope of log time on log size over all points, and between the last two.

    The fit over all points understates growth where a fixed overhead dominates the small
    sizes; the last step is the exponent at scale.
    """
    if len(sizes) < 2:
        return float("nan"), float("nan")
    x, y = np.log10(np.asarray(sizes, float)), np.log10(np.asarray(seconds, float))
    return float(np.polyfit(x, y, 1)[0]), float((y[-1] - y[-2]) / (x[-1] - x[-2]))


def stage_slopes(rows: list[dict]) -> dict[str, tuple[float, float]]:
    out = {}
    for stage in dict.fromkeys(r["stage"] for r in rows):
        pts = [(float(r["size"]), float(r["seconds"])) for r in rows if r["stage"] == stage]
        out[stage] = slopes(*zip(*pts))
    return out


def plot(rows: list[dict], path: pathlib.Path) -> None:
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7.5, 5))
    for (stage, (fit, last)), marker in zip(stage_slopes(rows).items(), "osD^"):
        xs, ys = zip(*[(float(r["size"]), float(r["seconds"])) for r in rows if r["stage"] == stage])
        ax.loglog(xs, ys, marker=marker, label=f"{stage}: slope {fit:.2f} (last step {last:.2f})")
    ax.set_xlabel("problem size (labels, clients or cohort size; see legend)")
    ax.set_ylabel("seconds (best of runs)")
    ax.set_title("pflx: cost vs problem size (2-core CPU, 1 thread)")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def measure(quick: bool, max_seconds: float) -> list[dict]:
    rows = []
    for stage, (unit, sizes, make) in STAGES.items():
        sizes = sizes[:2] if quick else sizes
        for i, size in enumerate(sizes):
            run = make(size)
            first = best_of(run, 1)
            secs = min(first, best_of(run, 2)) if first < 1.0 else first
            del run
            rows.append({"stage": stage, "unit": unit, "size": size, "seconds": secs})
            print(f"  {stage:<34} {unit} = {size:>11,}  {secs:9.4f} s", flush=True)
            if secs > max_seconds and i + 1 < len(sizes):
                print(f"  {stage:<34} skipped {sizes[i + 1:]}: the last point took over {max_seconds:g} s")
                break
    return rows


def main() -> int:
    import torch

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=pathlib.Path, default=HERE / "results")
    ap.add_argument("--max-seconds", type=float, default=60.0, help="stop a sweep after a point this slow")
    ap.add_argument("--max-slope", type=float, default=1.2)
    ap.add_argument("--quick", action="store_true", help="the two smallest sizes of each stage (a smoke run)")
    ap.add_argument("--from-csv", type=pathlib.Path, default=None, help="re-draw and re-judge a scaling.csv")
    args = ap.parse_args()
    torch.set_num_threads(1)
    args.out.mkdir(parents=True, exist_ok=True)
    if args.from_csv is not None:
        with open(args.from_csv, newline="") as fh:
            rows = list(csv.DictReader(fh))
    else:
        rows = measure(args.quick, args.max_seconds)
    with open(args.out / "scaling.csv", "w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=["stage", "unit", "size", "seconds"])
        writer.writeheader()
        writer.writerows(rows)
    plot(rows, args.out / "scaling.png")
    print(f"wrote {args.out / 'scaling.csv'} and {args.out / 'scaling.png'}")
    v = Verdicts()
    for stage, (fit, last) in stage_slopes(rows).items():
        v.check(f"{stage}: growth exponent", f"{fit:.2f} (last step {last:.2f})", f"<= {args.max_slope:g}",
                fit <= args.max_slope)
    return v.finish()


if __name__ == "__main__":
    sys.exit(main())
