"""Writing the partition artifact (DESIGN.md section 3); shared by `partition` and `simulate`."""

from __future__ import annotations

from typing import Any

import numpy as np

from pfl_cli.artifacts import ArtifactWriter
from pfl_cli.data import Dataset
from pfl_cli.data.location import source_record
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
    # The path resolved, relative to the artifact, and digested: the data are found from anywhere (data/location.py).
    writer.save_json("dataset.json", {**dataset.info(), **source_record(dataset, writer.out)})
    writer.save_npz("clients.npz", **part.to_arrays())
    header = ["client_id", "role", "n_train", "n_test", *[f"class_{c}" for c in range(hist.shape[1])]]
    rows = np.column_stack([part.client_id, part.role, part.train_sizes, part.test_sizes, hist]).astype(np.int64)
    writer.save_csv("stats.csv", header, rows.tolist())
    writer.save_json("stats.json", stats)
    if plot:  # drawn from the CSV just written, exactly as `pflx show --plot` redraws it
        from pfl_cli.cli.figures import partition_heatmap

        partition_heatmap(writer.path("stats.csv"), writer.path("stats.json"), writer.path("partition.png"))
    return hist, stats
