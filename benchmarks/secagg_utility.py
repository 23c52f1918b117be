"""The price of not trusting the server: distributed DP (ddg under --secagg) against central DP-FedAvg on digits.

One partition of builtin:digits (100 clients, Dirichlet 0.5, 10 held out), FedAvg with the same round settings
for every row; per epsilon in {1, 4, 8} and two seeds: central DP-FedAvg (Poisson cohorts at q = 20 / 90 from the
public population bound 90, the server adds the Gaussian noise; amplification by subsampling) and the distributed
discrete Gaussian (a fixed cohort of 20 chosen by the server, each client adds its share before secure
aggregation, accounted for all 20 surviving; no amplification). Accuracy: the pooled test accuracy of the train
clients (nonprivate.json, a simulation-study diagnostic), noise=seeded (simulation only), so the table repeats.

    python benchmarks/secagg_utility.py --out runs/secagg-utility   # prints the markdown table (about 10 minutes)
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
from pathlib import Path

ROUND = ["--algorithm", "fedavg", "--rounds", "40", "--clients-per-round", "20", "--local-steps", "10",
         "--batch-size", "16", "--lr", "0.01", "--eval-every", "40", "--set", "normalize=false", "--format", "quiet"]
SEEDS = "0,1"
EPSILONS = (1, 4, 8)


def pflx(*args) -> None:
    subprocess.run([sys.executable, "-m", "pfl_cli", *map(str, args)], check=True)


def accuracy(run: Path) -> list[float]:
    return [json.loads((run / f"seed-{s}" / "nonprivate.json").read_text())["train"]["pooled_accuracy"]
            for s in SEEDS.split(",")]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=Path("runs/secagg-utility"))
    out = ap.parse_args().out
    part = out / "part"
    pflx("partition", "--dataset", "builtin:digits", "--dirichlet", "0.5", "--num-clients", "100",
         "--holdout-clients", "10", "--out", part, "--format", "quiet")
    rows = []
    plain = out / "plain"
    pflx("train", "--partition", part, *ROUND, "--seeds", SEEDS, "--out", plain)
    acc = [json.loads((plain / f"seed-{s}" / "metrics.json").read_text())["train"]["pooled_accuracy"]
           for s in SEEDS.split(",")]
    rows.append(("no DP", "-", acc))
    for eps in EPSILONS:
        central, ddg = out / f"central-eps{eps}", out / f"ddg-eps{eps}"
        pflx("train", "--partition", part, *ROUND, "--seeds", SEEDS, "--write-nonprivate",
             "--dp", f"eps={eps},delta=1e-5,clip=1,population=90,noise=seeded", "--out", central)
        pflx("train", "--partition", part, *ROUND, "--seeds", SEEDS, "--write-nonprivate", "--secagg",
             "--dp", f"eps={eps},delta=1e-5,clip=1,noise=seeded", "--set", "dp_mechanism=ddg", "--out", ddg)
        rows.append(("central DP-FedAvg", eps, accuracy(central)))
        rows.append(("distributed DP (ddg, --secagg)", eps, accuracy(ddg)))
    print("| mechanism | epsilon | seed 0 | seed 1 | mean |")
    print("|---|---|---|---|---|")
    for name, eps, acc in rows:
        print(f"| {name} | {eps} | {acc[0]:.3f} | {acc[1]:.3f} | {statistics.mean(acc):.3f} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
