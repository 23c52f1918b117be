"""Reproduce the thesis's synthetic recovery experiment (Figure 3.2 style) on CPU.

For each Table A.1 setting: draw 10,000 synthetic clients of 20 samples, write their
histograms, fit them with ``pflx mdm-fit`` (Algorithm 5 on a 1000-client cohort, then 100
rounds of Algorithm 6 with 1000-client cohorts, the thesis's app. A.3.3 protocol), re-run
the same fit through the library to record the parameters after every round, and plot
NMSE(A) and NMSE(tau) (thesis Eq. A.31, components matched by the best permutation)
against the rounds. Writes ``recovery.csv`` and ``recovery.png`` under ``--out``.

    python recipes/mdm/recovery.py --out runs/mdm-recovery [--settings med1,med2,med3]
"""

from __future__ import annotations

import argparse
import csv
import itertools
import json
from pathlib import Path

import numpy as np

from pfl_cli.cli.app import main as pflx
from pfl_cli.mdm import MDMParams, fit_mdm, sample_clients
from pfl_cli.mdm.api import MDMFitConfig, run_mdm_fit
from pfl_cli.mdm.model import integer_size_edges
from pfl_cli.rng import make_rng

RECIPE = Path(__file__).with_name("synthetic-recovery.yaml")
TABLE_A1 = {  # thesis Table A.1 (C = 10); Pi is not given: 20 samples per client (pflx's choice)
    "low1": ([1.0], [[1.0] * 10]),
    "low2": ([0.5, 0.5], [[0.5] * 10, [2.5] * 10]),
    "med1": ([1.0], [[0.1, 0.2, 0.6, 1.0, 2.0, 0.1, 1.0, 2.0, 0.5, 0.5]]),
    "med2": ([0.4, 0.6], [[0.1, 0.2, 0.6, 1.0, 2.0, 0.1, 1.0, 2.0, 0.5, 0.5], [2.5, 2.6, 2.7, 2.8, 3.0, 2.5, 2.0, 3.0, 1.0, 0.9]]),
    "med3": ([0.5, 0.2, 0.3], [[5.0, 4.0, 5.0, 1.0, 1.0, 1.0, 5.0, 4.0, 5.0, 1.0],
                               [0.1, 0.2, 0.6, 1.0, 2.0, 0.1, 1.0, 2.0, 0.5, 0.5],
                               [2.5, 2.6, 2.7, 2.8, 3.0, 2.5, 2.0, 3.0, 1.0, 0.9]]),
    "high1": ([1.0], [[0.1, 0.2, 0.15, 0.18, 0.1, 0.05, 0.08, 0.4, 0.2, 0.12]]),
    "high2": ([0.1, 0.9], [[0.1, 0.2, 0.15, 0.18, 0.1, 0.05, 0.08, 0.4, 0.2, 0.12], [2.5, 2.6, 2.0, 3.2, 1.5, 0.9, 0.8, 1.3, 3.1, 2.4]]),
}


def nmse(x: np.ndarray, y: np.ndarray) -> float:
    return float(np.sqrt(np.sum(((x - y) / y) ** 2)))  # thesis Eq. (A.31)


def errors(params: MDMParams, true: MDMParams) -> tuple[float, float]:
    best = None
    for perm in itertools.permutations(range(true.num_components)):
        p = list(perm)
        err = (nmse(params.alpha[p], true.alpha), nmse(params.tau[p], true.tau))
        best = err if best is None or err[0] < best[0] else best
    return best


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=Path("runs/mdm-recovery"))
    ap.add_argument("--settings", default="med1,med2,med3", help=f"comma-separated, of {', '.join(TABLE_A1)}")
    ap.add_argument("--clients", type=int, default=10_000)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    rows, curves = [], {}
    for name in args.settings.split(","):
        tau, alpha = (np.array(x, dtype=float) for x in TABLE_A1[name])
        probs = np.zeros((len(tau), 20))
        probs[:, 19] = 1.0
        true = MDMParams(tau, alpha, probs, integer_size_edges(20))
        counts = sample_clients(true, args.clients, rng=make_rng(args.seed, f"recipe/{name}")).counts
        np.save(args.out / f"{name}.npy", counts)
        out = args.out / f"fit-{name}"
        code = pflx(["mdm-fit", "--counts", str(args.out / f"{name}.npy"), "--config", str(RECIPE), "--components",
                     str(len(tau)), "--seed", str(args.seed), "--out", str(out), "--format", "quiet", "--force"])
        if code != 0:
            raise SystemExit(f"pflx mdm-fit failed for {name} (exit {code})")
        # The same fit through the library, keeping every round's parameters.
        from pfl_cli.config import load_config_file, resolve_config

        cfg = resolve_config(MDMFitConfig, file_values=load_config_file(RECIPE, "mdm-fit"),
                             flag_values={"components": len(tau), "seed": args.seed}, ignore=("out_root",))
        kw = dict(rounds=cfg.rounds, cohort_size=cfg.cohort_size, init_cohort_size=cfg.init_cohort_size,
                  restarts=cfg.restarts, moment_category=cfg.moment_category)
        fit = fit_mdm(counts, num_components=len(tau), rng=make_rng(args.seed, "mdm-fit"), keep_history=True, **kw)
        written = json.loads((out / "mdm.json").read_text())
        assert np.allclose(written["alpha"], fit.params.alpha), "CLI and library fits differ"
        curves[name] = [errors(p, true) for p in fit.history]
        for t, (ea, et) in enumerate(curves[name]):
            rows.append([name, t, ea, et])
        print(f"{name}: NMSE(A) round 10 {curves[name][10][0]:.3f} -> round {cfg.rounds} {curves[name][-1][0]:.3f}; "
              f"NMSE(tau) {curves[name][-1][1]:.3f}")
    with open(args.out / "recovery.csv", "w", newline="") as fh:
        csv.writer(fh).writerows([["setting", "round", "nmse_alpha", "nmse_tau"], *rows])
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(10, 4))
    for name, curve in curves.items():
        arr = np.array(curve)
        axes[0].plot(arr[:, 0], label=name)
        axes[1].plot(arr[:, 1], label=name)
    for ax, what in zip(axes, ("A", "tau")):
        ax.set_xlabel("rounds T")
        ax.set_ylabel(f"NMSE of {what} (Eq. A.31)")
        ax.set_yscale("log")
        ax.legend()
    fig.suptitle("MDM parameter recovery (thesis Figure 3.2 style; cohort 1000, m = 20)")
    fig.tight_layout()
    fig.savefig(args.out / "recovery.png", dpi=100, metadata={"Software": None})
    print(f"wrote {args.out / 'recovery.csv'} and {args.out / 'recovery.png'}")


if __name__ == "__main__":
    main()
