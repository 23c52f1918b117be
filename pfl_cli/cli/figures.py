"""Figures drawn from an artifact's own CSV/JSON files, so `pflx show --plot` redraws what
`train --plot` and `predict --plot` wrote (matplotlib, the optional `plot` extra)."""

from __future__ import annotations

import csv
import json
from collections import defaultdict
from pathlib import Path

from pfl_cli.errors import InputError

GROUP_STYLE = {  # group -> (label, colour)
    "train": ("train clients (test data)", "tab:blue"),
    "holdout": ("holdout clients (never trained)", "tab:orange"),
    "val": ("train clients (validation)", "tab:green"),
}


def _pyplot():
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise InputError("--plot needs matplotlib; install it with `pip install 'pflx[plot]'`.") from None
    return plt


def _save(fig, path: Path) -> None:
    fig.tight_layout()
    # No software/date metadata: the PNG bytes depend on the data only.
    fig.savefig(path, dpi=100, metadata={"Software": None})
    import matplotlib.pyplot as plt

    plt.close(fig)


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
    plt = _pyplot()
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
        ax.set_xlabel("round")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    kind = "with label masking" if metric.endswith("_lm") else "no label masking"
    acc_ax.set_ylabel("accuracy (%), mean over clients")
    acc_ax.set_title(f"{meta.get('algorithm', '?')}: accuracy ({kind})")
    if losses and min(losses) > 0:
        loss_ax.set_yscale("log")  # the cohort's training loss and the test losses differ by orders of magnitude
    loss_ax.set_ylabel("cross-entropy loss (log scale)" if loss_ax.get_yscale() == "log" else "cross-entropy loss")
    loss_ax.set_title(f"{meta.get('algorithm', '?')}: loss")
    _save(fig, out)
    return out


def client_accuracy_histogram(clients_csv: Path, metrics_json: Path, out: Path) -> Path:
    """A histogram of per-client test accuracy (``predict``'s ``clients.csv``), both without and with label masking."""
    plt = _pyplot()
    meta = json.loads(Path(metrics_json).read_text())
    with open(clients_csv, newline="") as fh:
        rows = list(csv.DictReader(fh))
    fig, ax = plt.subplots(figsize=(7, 4.2))
    bins = [i * 5 for i in range(21)]
    for column, label, colour in (("accuracy", "no label masking", "tab:blue"),
                                  ("accuracy_lm", "label masking", "tab:orange")):
        values = [100 * float(r[column]) for r in rows if r.get(column) not in (None, "")]
        if values:
            mean = sum(values) / len(values)
            ax.hist(values, bins=bins, alpha=0.55, color=colour, edgecolor="white", label=f"{label} (mean {mean:.1f}%)")
            ax.axvline(mean, color=colour, ls="--", lw=1.5)
    ax.set_xlabel("test accuracy of a client (%)")
    ax.set_ylabel("clients")
    from matplotlib.ticker import MaxNLocator

    ax.yaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_xlim(0, 100)
    ax.set_title(f"{meta.get('algorithm', '?')}: per-client accuracy of {len(rows)} {meta.get('clients', '')} clients")
    ax.legend(fontsize=8, loc="upper left")
    ax.grid(alpha=0.3)
    _save(fig, out)
    return out


# stage -> (figure file, function, the artifact files it reads)
FIGURES = {
    "train": ("curves.png", training_curves, ("metrics.csv", "metrics.json")),
    "predict": ("clients.png", client_accuracy_histogram, ("clients.csv", "metrics.json")),
}
