"""Plot PeFLL's descriptor analysis (thesis §4.4, Fig. 4.1): recipes/pefll/descriptor-analysis.yaml.

Left: the mean Spearman correlation between descriptor distances and label-distribution distances of
the unseen clients at every evaluation (``train --set track_descriptors=true`` logs it in metrics.csv).
Right: a t-SNE of every client's descriptor, coloured by the client's dominant class.

    python recipes/pefll/descriptor_analysis.py --model runs/da-pefll --partition runs/da --out runs/da-descriptors.png
"""

from __future__ import annotations

import argparse
import csv
from pathlib import Path

import numpy as np


def correlation_curve(model: Path) -> tuple[list[int], list[float]]:
    rounds, values = [], []
    with open(model / "metrics.csv", newline="") as fh:
        for row in csv.DictReader(fh):
            if row["metric"] == "descriptor_spearman" and row["value"] not in ("", "nan"):
                rounds.append(int(row["round"]))
                values.append(float(row["value"]))
    if not rounds:
        raise SystemExit(f"{model}/metrics.csv has no descriptor_spearman rows; train with --set track_descriptors=true.")
    return rounds, values


def descriptors(model: Path, partition: Path):
    """Every client's evaluation descriptor under the trained model, its dominant class and role."""
    from pfl_cli.cli.common import load_partition_dataset
    from pfl_cli.cli.predict_run import read_model
    from pfl_cli.fl.api import make_algorithm
    from pfl_cli.fl.descriptors import label_distributions
    from pfl_cli.fl.store import build_store
    from pfl_cli.rng import torch_generator

    _, payload, cfg, _ = read_model(model)
    part, _, _, ds = load_partition_dataset(partition)
    norm = payload["normalization"]
    store = build_store(ds.x, ds.y, ds.num_classes, part, val_fraction=0.0, rng=None, device="cpu",
                        stats=(norm["mean"].numpy(), norm["std"].numpy()), labeled=ds.labeled, hidden_labels=True)
    alg = make_algorithm(cfg, store, arch=payload["arch"])
    alg.load_weights(payload["weights"])
    everyone = np.arange(store.num_clients)
    v = alg.descriptors(everyone, torch_generator(cfg.seed, "descriptor-analysis")).detach().numpy()
    return v, label_distributions(store, everyone).argmax(1), np.asarray(part.role)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", type=Path, required=True)
    parser.add_argument("--partition", type=Path, required=True)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from sklearn.manifold import TSNE

    rounds, rho = correlation_curve(args.model)
    v, dominant, role = descriptors(args.model, args.partition)
    xy = TSNE(2, perplexity=min(30.0, (len(v) - 1) / 3), init="pca", random_state=0).fit_transform(v)
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4.5))
    left.plot(rounds, rho, marker="o")
    left.set_xlabel("round")
    left.set_ylabel("mean Spearman correlation (unseen clients)")
    left.set_title("descriptor vs label-distribution distances")
    left.set_ylim(min(0.0, min(rho) - 0.05), 1.0)
    left.grid(alpha=0.3)
    cmap = plt.get_cmap("tab10")
    for marker, r, name in (("o", 0, "train clients"), ("^", 1, "unseen clients")):
        sel = role == r
        right.scatter(xy[sel, 0], xy[sel, 1], c=[cmap(c % 10) for c in dominant[sel]], marker=marker, s=28,
                      edgecolors="k", linewidths=0.3, label=name)
    right.set_title("t-SNE of descriptors, coloured by dominant class")
    right.set_xticks([])
    right.set_yticks([])
    right.legend(loc="best", fontsize=8)
    fig.tight_layout()
    args.out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(args.out, dpi=100, metadata={"Software": None})
    print(f"{args.out}: Spearman {rho[0]:.3f} (round {rounds[0]}) -> {rho[-1]:.3f} (round {rounds[-1]})")


if __name__ == "__main__":
    main()
