"""PeFLL client extrapolation (thesis Fig. B.1) on CPU: recipes/pefll/extrapolation.yaml.

PeFLL is trained once on Dir(0.1) clients; for every alpha of the grid, new clients with Dir(alpha)
label distributions get their models from one forward pass (no fine-tuning), against Local (each new
client trains alone on its own train split). Writes ``extrapolation.csv`` and ``extrapolation.png``.

The new clients' samples must be unseen by training. The script writes builtin:digits twice as npz with
the same samples and labels (so predict accepts the trained model for both) and complementary pools: the
training partition's clients come from one half (their test samples from the other half's pool, which
training never fits), every new-client partition from the other half.

    python recipes/pefll/extrapolation.py --config recipes/pefll/extrapolation.yaml --out runs/extrapolation
"""

from __future__ import annotations

import argparse
import csv
import json
from pathlib import Path

import numpy as np

from pfl_cli.cli.app import main as pflx


def run(cmd: list[str]) -> None:
    code = pflx([str(c) for c in cmd])
    if code != 0:
        raise SystemExit(f"pflx {' '.join(map(str, cmd))} failed with exit code {code}")


def halves(out: Path, seed: int) -> tuple[str, str]:
    """Two npz copies of digits with swapped train/test pools (same x and y, so the same labels hash)."""
    from pfl_cli.data import load_dataset
    from pfl_cli.rng import make_rng

    ds = load_dataset("builtin:digits")
    pool = np.zeros(ds.num_samples, dtype=np.uint8)
    pool[make_rng(seed, "extrapolation-halves").permutation(ds.num_samples)[ds.num_samples // 2:]] = 1
    out.mkdir(parents=True, exist_ok=True)
    np.savez(out / "train-half.npz", x=ds.x, y=ds.y, pool=pool)
    np.savez(out / "new-half.npz", x=ds.x, y=ds.y, pool=1 - pool)
    return f"npz:{out / 'train-half.npz'}", f"npz:{out / 'new-half.npz'}"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", type=Path, default=Path("recipes/pefll/extrapolation.yaml"))
    ap.add_argument("--out", type=Path, default=Path("runs/extrapolation"))
    ap.add_argument("--alphas", default="0.1,0.2,0.3,0.4,0.5,0.6,0.7,0.8,0.9,1.0")
    ap.add_argument("--new-clients", type=int, default=20)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    seed = ["--seed", args.seed]
    train_spec, new_spec = halves(args.out, args.seed)
    part = args.out / "train-part"
    run(["partition", "--config", args.config, "--dataset", train_spec, "--out", part, "--format", "quiet", *seed])
    models = {"PeFLL": args.out / "pefll", "Local": args.out / "local"}
    run(["train", "--config", args.config, "--partition", part, "--out", models["PeFLL"], "--format", "quiet", *seed])
    # Local owns other keys than PeFLL (no server, no rounds): the recipe's client settings, given as flags.
    run(["train", "--partition", part, "--out", models["Local"], "--algorithm", "local", "--local-epochs", "50",
         "--lr", "0.05", "--batch-size", "32", "--model-arch", "mlp", "--set", "mlp_hidden=[32]",
         "--val-fraction", "0.1", "--device", "cpu", "--format", "quiet", *seed])
    rows = []
    for alpha in (float(a) for a in args.alphas.split(",")):
        new = args.out / f"new-alpha{alpha:g}"
        run(["partition", "--dataset", new_spec, "--dirichlet", alpha, "--num-clients", args.new_clients,
             "--test-fraction", "0.3", "--min-size", "5", "--out", new, "--format", "quiet", *seed])
        row = {"alpha": alpha}
        for name, model in models.items():
            pred = args.out / f"{name.lower()}-alpha{alpha:g}"
            run(["predict", "--config", args.config, "--model", model, "--partition", new, "--clients", "all",
                 "--no-predictions", "--out", pred, "--format", "quiet", *seed])
            row[name] = json.loads((pred / "metrics.json").read_text())["mean_accuracy"]
        rows.append(row)
        print(f"alpha {alpha:.1f}: " + "  ".join(f"{k} {100 * row[k]:.1f}" for k in models), flush=True)
    with open(args.out / "extrapolation.csv", "w", newline="") as fh:
        writer = csv.DictWriter(fh, ["alpha", *models])
        writer.writeheader()
        writer.writerows(rows)
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    for name in models:
        ax.plot([r["alpha"] for r in rows], [100 * r[name] for r in rows], marker="o", label=name)
    ax.set_xlabel("alpha of the new clients' Dir(alpha) label distributions (training: 0.1)")
    ax.set_ylabel("mean test accuracy of new clients (%)")
    ax.set_title("PeFLL extrapolation to new label distributions (digits)")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(args.out / "extrapolation.png", dpi=100, metadata={"Software": None})


if __name__ == "__main__":
    main()
