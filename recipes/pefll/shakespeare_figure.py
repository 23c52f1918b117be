"""PeFLL thesis Figs. B.2 and B.3 (App. B.1.3) from train artifacts: accuracy against rounds and against communication.

Reads each run's ``metrics.csv`` (the mean test accuracy of the train clients and of the holdout clients
at every evaluation, the holdout clients served by each algorithm's own new-client protocol) and its
``metrics.json`` (``communication.bytes_per_round``: the tensors the algorithm really exchanged, both ways,
summed over the cohort), and writes

- ``curves.csv``: algorithm, group (train | holdout), round, gigabytes communicated up to that round, accuracy;
- ``figure-b2-b3.png`` (with matplotlib): the accuracies against rounds (Fig. B.2) and against GB (Fig. B.3).

    python recipes/pefll/shakespeare_figure.py runs/shk-pefll runs/shk-fedavg ... --out runs/shk-figure
"""

from __future__ import annotations

import argparse
import csv
import json
from pathlib import Path

GROUPS = ("train", "holdout")


def curves(run: Path) -> list[dict]:
    """One row per evaluation and group of a train artifact."""
    info = json.loads((run / "metrics.json").read_text())
    algorithm = info.get("algorithm") or json.loads((run / "manifest.json").read_text())["config"]["algorithm"]
    per_round = float(info["communication"]["bytes_per_round"])
    rows = []
    with open(run / "metrics.csv", newline="") as f:
        for r in csv.DictReader(f):
            if r["metric"] == "mean_accuracy" and r["group"] in GROUPS:
                rnd = int(r["round"])
                rows.append({"algorithm": algorithm, "group": r["group"], "round": rnd,
                             "gigabytes": rnd * per_round / 1e9, "accuracy": float(r["value"])})
    return rows


def plot(rows: list[dict], path: Path) -> bool:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    fig, axes = plt.subplots(2, 2, figsize=(10, 7), sharey="row")
    for g, group in enumerate(GROUPS):
        for c, (x, label) in enumerate((("round", "global rounds"), ("gigabytes", "communication (GB)"))):
            ax = axes[g][c]
            for name in dict.fromkeys(r["algorithm"] for r in rows):
                pts = sorted((r[x], r["accuracy"]) for r in rows if r["algorithm"] == name and r["group"] == group)
                if pts:
                    ax.plot([p[0] for p in pts], [100 * p[1] for p in pts], marker=".", label=name)
            ax.set_xlabel(label)
            ax.set_ylabel(f"{group} clients' test accuracy (%)")
            ax.grid(alpha=0.3)
    axes[0][0].legend()
    fig.suptitle("Shakespeare: accuracy against rounds (Fig. B.2) and communication (Fig. B.3)")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    return True


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("runs", nargs="+", type=Path, help="train artifact directories")
    ap.add_argument("--out", type=Path, required=True)
    a = ap.parse_args()
    rows = [row for run in a.runs for row in curves(run)]
    a.out.mkdir(parents=True, exist_ok=True)
    with open(a.out / "curves.csv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=["algorithm", "group", "round", "gigabytes", "accuracy"])
        w.writeheader()
        w.writerows(rows)
    drawn = plot(rows, a.out / "figure-b2-b3.png")
    last = {}
    for r in rows:
        last[(r["algorithm"], r["group"])] = r
    for (name, group), r in sorted(last.items()):
        print(f"{name:10s} {group:8s} round {r['round']:5d}  {r['gigabytes']:9.3f} GB  {100 * r['accuracy']:5.1f}%")
    print(f"{a.out / 'curves.csv'}" + (f", {a.out / 'figure-b2-b3.png'}" if drawn else " (no matplotlib: no figure)"))


if __name__ == "__main__":
    main()
