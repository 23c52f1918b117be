"""Reading client histograms and writing the ``mdm-fit`` artifact; shared by `mdm-fit` and `simulate`."""

from __future__ import annotations

import csv
import io
from pathlib import Path
from typing import Any

import numpy as np

from pfl_cli.artifacts import Artifact, ArtifactWriter, read_utf8, sha256_file
from pfl_cli.errors import ArtifactError, InputError


def partition_histograms(artifact: Artifact, *, flag: str) -> np.ndarray:
    """Train clients' train-label histograms from a partition artifact's ``stats.csv``."""
    from pfl_cli.readers import read_partition_files
    from pfl_cli.readers._rules import listed

    listed(artifact, flag, "stats.csv")
    path = artifact.file("stats.csv")
    try:
        with open(path, newline="") as fh:
            rows = list(csv.reader(fh))
        header, body = rows[0], rows[1:]
        cls = [i for i, name in enumerate(header) if name.startswith("class_")]
        table = np.array([[int(r[i]) for i in [header.index("role"), *cls]] for r in body], dtype=np.int64)
    except (OSError, IndexError, ValueError) as err:  # UnicodeDecodeError is a ValueError
        raise ArtifactError(f"{flag} {artifact.path}: stats.csv is unreadable ({err}); re-create the partition.") from None
    if not cls:
        raise ArtifactError(f"{flag} {artifact.path}: stats.csv has no class columns (a dataset without labels).")
    table = table.reshape(-1, 1 + len(cls))
    _, arrays, _ = read_partition_files(artifact, flag)  # the other files, and stats.csv against them
    if len(table) != len(arrays["role"]) or not np.array_equal(table[:, 0], arrays["role"]) or (table[:, 1:] < 0).any():
        raise ArtifactError(f"{flag} {artifact.path}: stats.csv must hold one row per client of clients.npz, with its "
                            f"role and counts >= 0; got {len(table)} rows for {len(arrays['role'])} clients. "
                            "Re-create the partition.")
    return table[table[:, 0] == 0, 1:]


def _read_table(path: Path) -> np.ndarray:
    if path.suffix == ".npy":
        try:
            return np.load(path, allow_pickle=False)
        except (OSError, ValueError) as err:
            raise InputError(f"--counts {path}: not a readable .npy array ({err}).") from None
    if path.suffix != ".csv":
        raise InputError(f"--counts {path}: expected a .csv or .npy file; got {path.suffix or 'no extension'}.")
    text = read_utf8(path, "--counts")
    rows = [r for r in csv.reader(io.StringIO(text, newline="")) if r and any(c.strip() for c in r)]
    if rows:
        try:
            [float(c) for c in rows[0]]
        except ValueError:
            rows = rows[1:]  # a header row
    try:
        table = np.array([[float(c) for c in r] for r in rows], dtype=np.float64)
    except ValueError as err:
        raise InputError(f"--counts {path}: every cell must be a number ({err}).") from None
    if table.ndim != 2 or len({len(r) for r in rows}) > 1:
        raise InputError(f"--counts {path}: rows have different numbers of columns.")
    return table


def read_counts(path: Path, bins: str | None) -> tuple[np.ndarray, dict[str, str]]:
    """Client histograms from ``--counts FILE``; with ``--bins`` the file holds ``client,value`` rows."""
    from pfl_cli.mdm.binning import counts_from_values, parse_bins

    if not path.is_file():
        raise InputError(f"--counts {path}: no such file.")
    table = _read_table(path)
    ref = {"path": str(path), "stage": "file", "sha256": sha256_file(path)}
    if bins is None:
        return table, ref
    if table.ndim != 2 or table.shape[1] != 2:
        raise InputError(f"--counts {path} with --bins must hold two columns, client and value, one row per sample; "
                         f"got shape {table.shape}.")
    edges = parse_bins(bins, clients=len(np.unique(table[:, 0])))
    counts, _ = counts_from_values(table[:, 0], table[:, 1], edges)
    return counts, ref


def write_mdm_artifact(writer: ArtifactWriter, result, true_counts: np.ndarray, *, plot: bool, seed: int,
                       write_nonprivate: bool = False) -> dict[str, Any]:
    """Write the mdm-fit files; return the ``mdm.json`` document.

    Without DP: mdm.json, trace.csv and mdm.png (``plot``). Under DP (release contract):
    mdm.json (mechanism output: the post-processed noisy sums) and privacy.json; the
    private-data diagnostics -- nonprivate.json, nonprivate_trace.csv and nonprivate.png
    (``plot``) -- only with ``write_nonprivate``.
    """
    from pfl_cli.artifacts import MECHANISM, NONPRIVATE, POST_PROCESSING
    from pfl_cli.mdm.api import mdm_document, nonprivate_document, trace_rows

    doc = mdm_document(result)
    if result.fit.privacy is None:
        writer.save_json("mdm.json", doc)
        writer.save_csv("trace.csv", *trace_rows(result))
        if plot:
            _plot_tsne(writer.path("mdm.png"), result, true_counts, seed)
        return doc
    writer.save_json("mdm.json", doc, release=MECHANISM)
    from pfl_cli.privacy.randomness import statement

    writer.save_json("privacy.json", {**result.fit.privacy.to_dict(accountant=result.dp.accountant),
                                      **statement(result.dp.noise)}, release=POST_PROCESSING)
    if write_nonprivate:
        writer.save_json("nonprivate.json", nonprivate_document(result, true_counts), release=NONPRIVATE)
        writer.save_csv("nonprivate_trace.csv", *trace_rows(result), release=NONPRIVATE)
        if plot:
            _plot_tsne(writer.path("nonprivate.png", release=NONPRIVATE), result, true_counts, seed,
                       note="NONPRIVATE: draws the private histograms (not covered by privacy.json)\n")
    return doc


def _plot_tsne(path: Path, result, true_counts: np.ndarray, seed: int, note: str = "") -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise InputError("--plot needs matplotlib; install it with `pip install 'pflx[plot]'`.") from None
    from pfl_cli.mdm.api import simulated_histograms, tsne_embedding
    from pfl_cli.rng import make_rng

    rng = make_rng(seed, "mdm-fit/plot")
    true = true_counts[true_counts.sum(axis=1) > 0]
    if len(true) > 500:
        true = true[np.sort(rng.choice(len(true), 500, replace=False))]
    marginal = true.sum(axis=0) / true.sum()
    mdm, iid = simulated_histograms(result, len(true), marginal, rng=rng)
    xy = tsne_embedding([true, iid, mdm], seed=seed)
    n = len(true)
    fig, ax = plt.subplots(figsize=(6.5, 5.5))
    for (lo, hi), colour, label in (((0, n), "green", "true clients"), ((n, 2 * n), "blue", "fully IID simulated"),
                                    ((2 * n, 3 * n), "red", "MDM simulated")):
        ax.scatter(xy[lo:hi, 0], xy[lo:hi, 1], s=9, c=colour, alpha=0.6, label=label)
    ax.set_title(f"{note}t-SNE of client histograms (K = {result.fit.params.num_components}; thesis Fig. 3.3)",
                 fontsize=10 if note else None)
    ax.legend(loc="best", fontsize=8)
    ax.set_xticks([])
    ax.set_yticks([])
    fig.tight_layout()
    fig.savefig(path, dpi=100, metadata={"Software": None})
    plt.close(fig)
