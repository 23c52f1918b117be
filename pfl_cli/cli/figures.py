"""Figures drawn from an artifact's own CSV/JSON files, so `pflx show --plot` redraws what
`train --plot` and `predict --plot` wrote (matplotlib, the optional `plot` extra)."""

from __future__ import annotations

import csv
import json
import re
from collections import defaultdict
from pathlib import Path

from pfl_cli.errors import InputError

GROUP_STYLE = {  # group -> (label, colour)
    "train": ("train clients (test data)", "tab:blue"),
    "holdout": ("holdout clients (never trained)", "tab:orange"),
    "val": ("train clients (validation)", "tab:green"),
}


PLOT_EXTRA_HINT = "install the plot extra: pip install 'pflx[plot]'"


def require_matplotlib(what: str) -> None:
    """Refuse a drawing request before any work when matplotlib is not installed (exit 2).

    The one rule of a plain install (matplotlib is the optional ``plot`` extra): every command that
    draws -- ``attack``, ``--plot`` anywhere, ``show --plot``, ``cluster --k-candidates`` -- calls
    this first, so nothing is computed or written before the refusal. ``find_spec`` costs no import.
    """
    import importlib.util

    try:
        found = importlib.util.find_spec("matplotlib") is not None
    except (ImportError, ValueError):
        found = False
    if not found:
        raise InputError(f"{what} draws with matplotlib, which is not installed; {PLOT_EXTRA_HINT}.")


def pyplot():
    """``matplotlib.pyplot`` on the file-only Agg backend (after :func:`require_matplotlib`)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise InputError(f"drawing needs matplotlib, which is not installed; {PLOT_EXTRA_HINT}.") from None
    return plt


def _save(fig, path: Path) -> None:
    fig.tight_layout()
    # No software/date metadata: the PNG bytes depend on the data only.
    fig.savefig(path, dpi=100, metadata={"Software": None})
    import matplotlib.pyplot as plt

    plt.close(fig)


def run_name(source: Path) -> str:
    """The run a figure is drawn for: the name of the artifact directory holding ``source``, also while its
    writer still builds it in the temporary sibling ``.NAME.tmp-XXXX`` (``train --plot``, ``predict --plot``)."""
    folder = Path(source).absolute().parent.name
    match = re.fullmatch(r"\.(.+)\.tmp-\w+", folder)
    return match.group(1) if match else folder


def _integer_rounds(ax) -> None:
    """Round numbers on the x axis are whole (two evaluations would otherwise get ticks at 1.2, 1.4, ...)."""
    from matplotlib.ticker import MaxNLocator

    ax.xaxis.set_major_locator(MaxNLocator(integer=True, steps=[1, 2, 5, 10]))


def read_history(metrics_csv: Path) -> dict[tuple[str, str], tuple[list[int], list[float]]]:
    """``metrics.csv`` (round, group, metric, value) as (group, metric) -> (rounds, values)."""
    series: dict[tuple[str, str], tuple[list[int], list[float]]] = defaultdict(lambda: ([], []))
    with open(metrics_csv, newline="") as fh:
        for row in csv.DictReader(fh):
            rounds, values = series[(row["group"], row["metric"])]
            rounds.append(int(row["round"]))
            values.append(float(row["value"]))
    return dict(series)


def training_curves(metrics_csv: Path, metrics_json: Path, out: Path) -> Path:
    """``curves.png``: headline accuracy of each client group and the losses against rounds, the selected round marked."""
    plt = pyplot()
    meta = json.loads(Path(metrics_json).read_text())
    history = read_history(metrics_csv)
    metric = "mean_accuracy_lm" if meta.get("label_mask") else "mean_accuracy"
    fig, (acc_ax, loss_ax) = plt.subplots(1, 2, figsize=(11, 4.2))
    losses: list[float] = []
    for group, (label, colour) in GROUP_STYLE.items():
        if (group, metric) in history:
            rounds, values = history[(group, metric)]
            acc_ax.plot(rounds, [100 * v for v in values], marker="o", ms=3, color=colour, label=label,
                        ls="--" if group == "val" else "-")
        if (group, "loss") in history:
            rounds, values = history[(group, "loss")]
            losses += values
            loss_ax.plot(rounds, values, marker="o", ms=3, color=colour, label=f"{label}: test loss",
                         ls="--" if group == "val" else "-")
    if ("train", "train_loss") in history:
        rounds, values = history[("train", "train_loss")]
        losses += values
        loss_ax.plot(rounds, values, color="tab:gray", lw=1, label="cohort training loss")
    best = meta.get("best_round")
    for ax in (acc_ax, loss_ax):
        if best is not None:
            ax.axvline(best, color="tab:red", ls=":", lw=1.5, label=f"selected round {best}")
        _integer_rounds(ax)
        ax.set_xlabel("round")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    kind = "with label masking" if metric.endswith("_lm") else "no label masking"
    acc_ax.set_ylabel("accuracy (%), mean over clients")
    run = f"{run_name(metrics_csv)} ({meta.get('algorithm', '?')})"  # the run: two runs of one algorithm differ
    acc_ax.set_title(f"{run}: accuracy ({kind})")
    if losses and min(losses) > 0:
        loss_ax.set_yscale("log")  # the cohort's training loss and the test losses differ by orders of magnitude
    loss_ax.set_ylabel("cross-entropy loss (log scale)" if loss_ax.get_yscale() == "log" else "cross-entropy loss")
    loss_ax.set_title(f"{run}: loss")
    _save(fig, out)
    return out


def client_accuracy_histogram(clients_csv: Path, metrics_json: Path, out: Path) -> Path:
    """A histogram of per-client test accuracy (``predict``'s ``clients.csv``), both without and with label masking."""
    plt = pyplot()
    meta = json.loads(Path(metrics_json).read_text())
    with open(clients_csv, newline="") as fh:
        rows = list(csv.DictReader(fh))
    fig, ax = plt.subplots(figsize=(7, 4.2))
    series, labels, colours, means = [], [], [], []
    for column, label, colour in (("accuracy", "no label masking", "tab:blue"),
                                  ("accuracy_lm", "label masking", "tab:orange")):
        values = [100 * float(r[column]) for r in rows if r.get(column) not in (None, "")]
        if values:
            mean = sum(values) / len(values)
            series.append(values)
            labels.append(f"{label} (mean {mean:.1f}%)")
            colours.append(colour)
            means.append((mean, colour))
    # The axis spans the clients' accuracies (from a multiple of 10 below the lowest, to 100), in 20 bins:
    # clients between 80 and 100 % would otherwise share four bars at the right fifth of a 0-100 axis.
    low = min((min(v) for v in series), default=0.0)
    start = max(0.0, 10.0 * (low // 10.0) - (10.0 if low % 10.0 < 2.5 else 0.0))
    bins = [start + i * (100.0 - start) / 20 for i in range(21)]
    for mean, colour in means:
        ax.axvline(mean, color=colour, ls="--", lw=1.5)
    if series:  # side-by-side bars, opaque: every colour drawn is one the legend names
        ax.hist(series, bins=bins, color=colours, edgecolor="white", label=labels)
    ax.set_xlabel("test accuracy of a client (%)")
    ax.set_ylabel("clients")
    from matplotlib.ticker import MaxNLocator

    ax.yaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_xlim(start, 100)
    ax.set_title(f"{run_name(clients_csv)} ({meta.get('algorithm', '?')}): per-client accuracy of {len(rows)} "
                 f"{meta.get('clients', '')} clients")
    ax.legend(fontsize=8, loc="upper left")
    ax.grid(alpha=0.3)
    _save(fig, out)
    return out


def partition_heatmap(stats_csv: Path, stats_json: Path, out: Path) -> Path:
    """``partition.png``: train samples per client and class (``stats.csv``), train clients then holdout."""
    plt = pyplot()
    del stats_json  # the figure needs the table only; the signature matches the other figures'
    with open(stats_csv, newline="") as fh:
        rows = list(csv.DictReader(fh))
    classes = [c for c in (rows[0].keys() if rows else ()) if c.startswith("class_")]
    rows.sort(key=lambda r: int(r["role"]))  # stable: train clients first, then holdout
    hist = [[int(r[c]) for c in classes] for r in rows]
    fig, ax = plt.subplots(figsize=(8, max(3.0, min(12.0, 0.12 * len(rows) + 2))))
    image = ax.imshow(hist, aspect="auto", interpolation="nearest", cmap="viridis")
    trained = sum(1 for r in rows if int(r["role"]) == 0)
    if 0 < trained < len(rows):  # where the train clients end and the holdout clients begin
        ax.axhline(trained - 0.5, color="white", lw=2)
        ax.text(0.01, trained - 0.5, "holdout clients", color="white", fontsize=8, va="top", ha="left",
                transform=ax.get_yaxis_transform())
    from matplotlib.ticker import MaxNLocator

    ax.yaxis.set_major_locator(MaxNLocator(integer=True))  # client rows, not 2.5
    ax.set_xlabel("class")
    ax.set_ylabel(f"client ({trained} train clients, then {len(rows) - trained} holdout)")
    ax.set_title(f"{run_name(stats_csv)}: train samples per client and class ({len(rows)} clients)")
    fig.colorbar(image, ax=ax, label="samples")
    _save(fig, out)
    return out


def comparison_boxes(clients_csv: Path, table_json: Path, out: Path) -> Path:
    """``compare``'s ``clients.png``: per-client accuracy (no label masking) of every configuration, one box for
    its training clients and one for its new clients, the clients of all seeds pooled; the mean over seeds marked."""
    plt = pyplot()
    doc = json.loads(Path(table_json).read_text())
    with open(clients_csv, newline="") as fh:
        rows = list(csv.DictReader(fh))
    labels = list(dict.fromkeys(r["label"] for r in doc["rows"]))
    groups = [g for g in ("train", "new") if any(r["group"] == g for r in doc["rows"])]
    style = {"train": ("training clients", "tab:blue"), "new": ("new clients", "tab:orange")}
    width = 0.8 / max(len(groups), 1)
    boxes_drawn = len(labels) * max(len(groups), 1)
    fig, ax = plt.subplots(figsize=(min(16.0, max(6.0, 0.75 * boxes_drawn + 2)), 4.8))
    lowest = 100.0
    for k, group in enumerate(groups):
        data, where = [], []
        for i, label in enumerate(labels):
            values = [100 * float(r["accuracy"]) for r in rows
                      if r["label"] == label and r["group"] == group and r["accuracy"] not in ("", None)]
            if values:
                data.append(values)
                where.append(i + (k - (len(groups) - 1) / 2) * width)
                lowest = min(lowest, min(values))
        if not data:
            continue
        name, colour = style[group]
        boxes = ax.boxplot(data, positions=where, widths=width * 0.85, patch_artist=True, showmeans=True,
                           meanprops={"marker": "D", "markerfacecolor": "white", "markeredgecolor": "black",
                                      "markersize": 5}, medianprops={"color": "black"},
                           flierprops={"marker": "o", "markersize": 3, "markerfacecolor": colour, "alpha": 0.6})
        for patch in boxes["boxes"]:
            patch.set_facecolor(colour)
            patch.set_alpha(0.75)
        boxes["boxes"][0].set_label(name)
    seeds = {r["label"]: r["num_seeds"] for r in doc["rows"]}
    ticks = [f"{label}\n({seeds[label]} seed{'s' if seeds[label] != 1 else ''})" for label in labels]
    long = max(map(len, labels), default=0) > 12 or len(labels) > 8
    ax.set_xticks(range(len(labels)))
    ax.set_xticklabels(ticks, rotation=20 if long else 0, ha="right" if long else "center", fontsize=9)
    # From 0 unless every client is far above it: then from the decade below the lowest client, so that
    # boxes near 100 % stay readable (the axis says where it starts).
    ax.set_ylim(max(0.0, 10 * ((lowest - 5) // 10)) - 2, 102)
    ax.set_ylabel("test accuracy of a client (%)")
    ax.set_xlabel("box: quartiles; line: median; diamond: mean; the clients of every seed pooled", fontsize=9)
    ax.set_title("per-client test accuracy, no label masking", fontsize=11)
    ax.grid(axis="y", alpha=0.3)
    if groups:
        ax.legend(fontsize=8, loc="best")
    _save(fig, out)
    return out


# stage -> (figure file, function, the artifact files it reads)
FIGURES = {
    "partition": ("partition.png", partition_heatmap, ("stats.csv", "stats.json")),
    "train": ("curves.png", training_curves, ("metrics.csv", "metrics.json")),
    "predict": ("clients.png", client_accuracy_histogram, ("clients.csv", "metrics.json")),
    "compare": ("clients.png", comparison_boxes, ("clients.csv", "table.json")),
}
