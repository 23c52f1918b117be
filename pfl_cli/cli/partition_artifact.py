"""Writing the partition artifact (DESIGN.md section 3); shared by `partition` and `simulate`."""

from __future__ import annotations

from typing import Any

import numpy as np

from pfl_cli.artifacts import ArtifactWriter
from pfl_cli.data import Dataset
from pfl_cli.errors import InputError
from pfl_cli.partition import Partition, partition_stats


def write_partition_artifact(
    writer: ArtifactWriter, part: Partition, dataset: Dataset, *, extra_stats: dict[str, Any] | None = None,
    plot: bool = False,
) -> tuple[np.ndarray, dict[str, Any]]:
    """Write dataset.json, clients.npz, stats.csv, stats.json (and partition.png) into ``writer``.

    Returns the per-client train label counts and the stats document, for printing.
    """
    hist, stats = partition_stats(part, dataset.y, dataset.num_classes)
    if extra_stats:
        stats.update(extra_stats)
    writer.save_json("dataset.json", dataset.info())
    writer.save_npz("clients.npz", **part.to_arrays())
    header = ["client_id", "role", "n_train", "n_test", *[f"class_{c}" for c in range(hist.shape[1])]]
    rows = np.column_stack([part.client_id, part.role, part.train_sizes, part.test_sizes, hist]).astype(np.int64)
    writer.save_csv("stats.csv", header, rows.tolist())
    writer.save_json("stats.json", stats)
    if plot:
        _plot_heatmap(writer.path("partition.png"), hist, part)
    return hist, stats


def _plot_heatmap(path, hist: np.ndarray, part: Partition) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise InputError("--plot needs matplotlib; install it with `pip install 'pflx[plot]'`.") from None
    order = np.argsort(part.role, kind="stable")  # train clients first, then holdout
    fig, ax = plt.subplots(figsize=(8, max(3.0, min(12.0, 0.12 * len(order) + 2))))
    image = ax.imshow(hist[order], aspect="auto", interpolation="nearest", cmap="viridis")
    ax.set_xlabel("class")
    ax.set_ylabel("client (train clients, then holdout)")
    ax.set_title(f"train samples per client and class ({part.num_clients} clients)")
    fig.colorbar(image, ax=ax, label="samples")
    fig.tight_layout()
    # A fixed date keeps the PNG bytes reproducible.
    fig.savefig(path, dpi=100, metadata={"Software": None})
    plt.close(fig)
