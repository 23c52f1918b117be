"""Accuracy against epsilon of DP-FedAvg and DP-PeFLL (client-level DP) on simulated digits clients.

Writes ``accuracy-vs-epsilon.csv`` and ``accuracy-vs-epsilon.png`` under ``--out``:

    python recipes/dp/accuracy_vs_epsilon.py --out runs/dp-eps [--eps 0.5,1,2,4,8]

1. ``digits.npz``: scikit-learn's digits scaled by the public pixel bound 16, with a fixed
   split into a train pool (1200 samples) and a test pool (597) so that no test image is ever
   trained on (``--set normalize=false`` under --dp: no statistics of private data).
2. ``pflx partition`` (Dirichlet 0.5, 50 clients) and ``pflx mdm-fit`` (K = 3): the simulation's
   generator of client label histograms. This is the experiment's setup, not a private release.
3. ``pflx simulate``: 1000 clients from the train pool (with replacement), 300 of them holdout;
   their test samples come from the test pool (without replacement), matched to each client's labels.
4. ``pflx train --config recipes/dp/accuracy-vs-epsilon.yaml`` for each algorithm, without DP
   and at every epsilon, with ``--write-nonprivate``: the accuracies plotted are nonprivate
   diagnostics, the pooled accuracy on all 597 test images (each client's model on its own test
   images; holdout clients never trained) and, dotted, on the holdout clients' images alone.

Each point is checked against the recipe's targets; a miss exits with status 1.
"""

from __future__ import annotations

import argparse
import csv
import json
import sys
from pathlib import Path

import numpy as np

from pfl_cli.cli.app import main as pflx

RECIPE = Path(__file__).with_name("accuracy-vs-epsilon.yaml")
ALGORITHMS = {  # label -> (train flags, extra flags under --dp, client-level clip C)
    "DP-FedAvg": (["--algorithm", "fedavg"], [], 1.0),
    # DP-PeFLL steps the server with SGD (lr 1) on the clipped, noised mean gradient; Adam's
    # per-coordinate scaling would blow the noise up. Without DP, PeFLL's default (Adam 2e-4).
    "DP-PeFLL": (["--algorithm", "pefll", "--no-standardize-descriptor", "--embed-dim", "8", "--set",
                  "hyper_hidden=32"], ["--set", "server_optimizer=sgd", "--server-lr", "1.0"], 0.2),
}
# Lowest acceptable pooled test accuracy over all clients per (label, epsilon); None = no DP.
TARGETS = {("DP-FedAvg", None): 0.9, ("DP-FedAvg", 1.0): 0.8, ("DP-FedAvg", 4.0): 0.9,
           ("DP-PeFLL", None): 0.9, ("DP-PeFLL", 1.0): 0.7, ("DP-PeFLL", 4.0): 0.85}
TRAIN_POOL = 1200


def run(cmd: list[str]) -> None:
    code = pflx(cmd)
    if code != 0:
        raise SystemExit(f"pflx {' '.join(cmd)} failed with exit code {code}")


def write_digits(path: Path, seed: int) -> None:
    from sklearn.datasets import load_digits

    d = load_digits()
    pool = np.zeros(len(d.target), np.uint8)
    pool[np.random.default_rng(seed).permutation(len(d.target))[TRAIN_POOL:]] = 1
    np.savez(path, x=(d.data / 16.0).astype(np.float32), y=d.target.astype(np.int64), pool=pool)


def setup(out: Path, seed: int) -> tuple[str, Path]:
    out.mkdir(parents=True, exist_ok=True)
    npz = out / "digits.npz"
    if not npz.exists():
        write_digits(npz, seed)
    spec = f"npz:{npz}"
    q = ["--format", "quiet", "--seed", str(seed)]
    run(["partition", "--dataset", spec, "--dirichlet", "0.5", "--num-clients", "50", "--out", str(out / "part"), *q])
    run(["mdm-fit", "--partition", str(out / "part"), "--components", "3", "--out", str(out / "mdm"), *q])
    run(["simulate", "--model", str(out / "mdm"), "--dataset", spec, "--num-clients", "1000", "--holdout-clients",
         "300", "--out", str(out / "sim"), *q])
    return spec, out / "sim"


def accuracy(out: Path, private: bool) -> dict:
    """Pooled test accuracy of the train clients, the holdout clients, and all clients together."""
    doc = json.loads((out / ("nonprivate.json" if private else "metrics.json")).read_text())
    acc = {g: doc[g]["pooled_accuracy"] for g in ("train", "holdout")}
    n = {g: doc[g]["num_samples"] for g in ("train", "holdout")}
    acc["all"] = sum(acc[g] * n[g] for g in n) / sum(n.values())
    return acc


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=Path("runs/dp-eps"))
    ap.add_argument("--eps", default="0.5,1,2,4,8")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--plot-only", action="store_true", help="redraw the PNG from an earlier run's CSV")
    args = ap.parse_args()
    eps_grid = [float(e) for e in args.eps.split(",")]
    if args.plot_only:
        with open(args.out / "accuracy-vs-epsilon.csv", newline="") as fh:
            rows = [{**r, **{k: float(r[k]) for k in r if k.endswith("accuracy")},
                     "epsilon": r["epsilon"] if r["epsilon"] == "inf" else float(r["epsilon"])}
                    for r in csv.DictReader(fh)]
        plot(rows, eps_grid, args.out / "accuracy-vs-epsilon.png")
        return
    _, sim = setup(args.out, args.seed)
    rows = []
    for label, (flags, dp_flags, clip) in ALGORITHMS.items():
        for eps in [None, *eps_grid]:
            out = args.out / f"{label}-{'nodp' if eps is None else f'eps{eps:g}'}"
            # population: the public number of enrolled (train) clients; q = 100 / 700.
            dp = [] if eps is None else ["--dp", f"eps={eps:g},delta=1e-6,clip={clip:g},population=700",
                                         "--write-nonprivate",
                                         *dp_flags]
            run(["train", "--config", str(RECIPE), "--partition", str(sim), *flags, *dp, "--seed", str(args.seed),
                 "--out", str(out), "--format", "quiet", "--force"])
            acc = accuracy(out, eps is not None)
            z = json.loads((out / "metrics.json").read_text())["dp"]["noise_multiplier"] if eps else 0.0
            target = TARGETS.get((label, eps))
            ok = target is None or acc["all"] >= target
            rows.append({"method": label, "epsilon": "inf" if eps is None else eps, "noise_multiplier": z,
                         "train_clients_accuracy": acc["train"], "holdout_clients_accuracy": acc["holdout"],
                         "all_clients_accuracy": acc["all"], "target": "" if target is None else target, "ok": ok})
            print(f"{label:10s} eps {'inf' if eps is None else f'{eps:g}':>4s}  z {z:6.3f}  train clients "
                  f"{acc['train']:.3f}  holdout clients {acc['holdout']:.3f}  all {acc['all']:.3f}  target "
                  f"{'-' if target is None else f'>= {target}'}{'' if ok else '  MISS'}", flush=True)
    with open(args.out / "accuracy-vs-epsilon.csv", "w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    plot(rows, eps_grid, args.out / "accuracy-vs-epsilon.png")
    misses = [r for r in rows if not r["ok"]]
    print(f"wrote {args.out / 'accuracy-vs-epsilon.csv'} and .png; {len(misses)} target miss(es)")
    sys.exit(1 if misses else 0)


def plot(rows: list[dict], eps_grid: list[float], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    for label, color in zip(ALGORITHMS, ("tab:blue", "tab:orange")):
        dp_rows = [r for r in rows if r["method"] == label and r["epsilon"] != "inf"]
        ax.plot([r["epsilon"] for r in dp_rows], [r["all_clients_accuracy"] for r in dp_rows], marker="o",
                color=color, label=f"{label} (client-level, delta 1e-6)")
        ax.plot([r["epsilon"] for r in dp_rows], [r["holdout_clients_accuracy"] for r in dp_rows], marker="x",
                linestyle=":", color=color, label=f"{label}, holdout clients only")
        base = next(r["all_clients_accuracy"] for r in rows if r["method"] == label and r["epsilon"] == "inf")
        ax.axhline(base, color=color, linestyle="--", label=f"{label[3:]} without DP")
    ax.set_xscale("log")
    ax.minorticks_off()
    ax.set_xticks(eps_grid, [f"{e:g}" for e in eps_grid])
    ax.set_xlabel("epsilon (RDP accountant)")
    ax.set_ylabel("pooled test accuracy (unseen test images)")
    ax.set_ylim(0, 1)
    ax.set_title("digits: 700 train + 300 holdout simulated clients, 200 rounds")
    ax.legend(fontsize=8, loc="lower right")
    fig.tight_layout()
    fig.savefig(path, dpi=120)


if __name__ == "__main__":
    main()
