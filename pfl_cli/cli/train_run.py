"""The body of `pflx train`: the train core (:mod:`pfl_cli.train`) called with a reporter, its results printed.

The core reads the partition, trains with checkpoints and writes the artifact (:mod:`pfl_cli.train.run`, the
files: :mod:`pfl_cli.train.files`, ``--seeds``' stack: :mod:`pfl_cli.train.stack`); it says what it does through
:class:`ReporterEvents`: notes and warnings on stderr, the progress bar, what Ctrl-C leaves behind
(:mod:`pfl_cli.cli.interrupt`), the ``--log`` loggers (:mod:`pfl_cli.cli.loggers`), the summary table.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Sequence

from pfl_cli.cli import interrupt
from pfl_cli.cli.loggers import RunLoggers, round_values
from pfl_cli.cli.output import Reporter
from pfl_cli.train.events import TrainEvents
from pfl_cli.train.files import METRIC_NAMES


class ReporterEvents(TrainEvents):
    """The train core's events answered by the command's reporter."""

    def __init__(self, report: Reporter) -> None:
        self.report = report

    def note(self, message: str) -> None:
        self.report.note(message)

    def warn(self, message: str) -> None:
        self.report.warn(message)

    def progress(self, description: str, total: int | None, unit: str = "step"):
        return self.report.progress(description, total, unit=unit)

    def kept(self, message: str) -> None:
        interrupt.kept(message)

    def continue_hint(self) -> str:
        return interrupt.how_to_continue()

    def loggers(self, kinds: Sequence[str], log_dir: Path, *, private: bool, resume: bool, name: str,
                group: str | None, params: dict):
        return _RoundLoggers(kinds, log_dir, private=private, resume=resume, name=name, group=group, params=params)

    def trained(self, out: Path, metrics: dict, *, private: bool, nonprivate: bool = False) -> None:
        if private:
            _print_dp_summary(self.report, out, metrics, nonprivate)
        else:
            _print_summary(self.report, out, metrics)


class _RoundLoggers(RunLoggers):
    """:class:`pfl_cli.cli.loggers.RunLoggers` taking the round loop's status, as the core gives it (the values
    logged: :func:`pfl_cli.cli.loggers.round_values`)."""

    def log(self, round_: int, status: dict, evaluated: bool) -> None:  # type: ignore[override]
        super().log(round_, round_values(status, evaluated))


def run_train(cfg, *, partition: Path, out: Path, resume: bool, force: bool, report: Reporter,
              plot: bool = False, logs: tuple[str, ...] = (), log_dir: Path | None = None, study=(None, None),
              log_as: tuple[str | None, str | None] = (None, None), **config_source) -> None:
    """`pflx train`: :func:`pfl_cli.train.run.run_train` reporting to ``report``; ``plot``: curves.png drawn as
    `pflx show --plot` draws it; ``config_source``: ``config_file`` and ``allow_nonprivate_config``."""
    from pfl_cli.train.run import run_train as train

    result = train(cfg, partition=partition, out=out, resume=resume, force=force, events=ReporterEvents(report),
                   plot=_curves() if plot else None, logs=logs, log_dir=log_dir, study=study, log_as=log_as,
                   **config_source)
    if result.up_to_date:
        report.result({"out": str(out), "up_to_date": True})


def run_train_seeds(cfg, seeds: list[int], *, partition: Path, out: Path, resume: bool, force: bool,
                    report: Reporter, plot: bool = False, logs: tuple[str, ...] = (), log_dir: Path | None = None,
                    study=(None, None), **config_source) -> None:
    """`pflx train --seeds`: :func:`pfl_cli.train.stack.run_train_seeds` reporting to ``report``."""
    from pfl_cli.train.stack import run_train_seeds as train

    done = train(cfg, seeds, partition=partition, out=out, resume=resume, force=force, events=ReporterEvents(report),
                 plot=_curves() if plot else None, logs=logs, log_dir=log_dir, study=study, **config_source)
    if not done:
        report.result({"out": str(out), "runs": [str(out / f"seed-{s}") for s in seeds], "up_to_date": True})


def train_stack(members, *, partition: Path, resume: bool | None, force: bool, report: Reporter,
                plot: bool = False, logs: tuple[str, ...] = (), label: str = "train") -> list[Path]:
    """:func:`pfl_cli.train.stack.train_stack` reporting to ``report`` (``compare --spec``'s seeds)."""
    from pfl_cli.train.stack import train_stack as train

    return train(members, partition=partition, resume=resume, force=force, events=ReporterEvents(report),
                 plot=_curves() if plot else None, logs=logs, label=label)


def _curves():
    from pfl_cli.cli.figures import training_curves

    return training_curves


# ---------------------------------------------------------------------------- printing (shared with predict)
def accuracy_table(title: str, groups: dict[str, dict], label_mask: bool, caption_extra: str = ""):
    """Mean and pooled accuracy, plain and label-masked, per group; the headline pair starred."""
    from rich.table import Table

    star = lambda masked: "*" if masked == label_mask else ""  # noqa: E731
    table = Table(title=title, title_justify="left",
                  caption=f"test accuracy; lm: label masking (classes absent from a client's train data never "
                  f"predicted); * headline (--{'' if label_mask else 'no-'}label-mask){caption_extra}",
                  caption_justify="left")
    table.add_column("group", style="bold")
    table.add_column("clients", justify="right")
    table.add_column("samples", justify="right")
    table.add_column(f"mean{star(False)}", justify="right")
    table.add_column(f"pooled{star(False)}", justify="right")
    table.add_column(f"mean lm{star(True)}", justify="right")
    table.add_column(f"pooled lm{star(True)}", justify="right")

    def pct(v):
        return "-" if v is None or not math.isfinite(v) else f"{100 * v:.2f}%"

    for name, s in groups.items():
        table.add_row(name, str(s["num_clients"]), str(s["num_samples"]), *(pct(s[m]) for m in METRIC_NAMES))
    return table




def _print_summary(report: Reporter, out: Path, m: dict) -> None:
    groups = {g: m[g] for g in ("train", "holdout", "val") if g in m}
    if m["rounds"] == 0:  # a non-federated algorithm (local): no rounds, nothing selected
        which = "no federated rounds (each client trains alone)"
    else:
        which = (f"model of round {m['best_round']} of {m['rounds']} "
                 f"(selected by {'validation accuracy' if m['selection'] == 'val' else 'last evaluation'})")
    title = f"train -> {out}: {m['algorithm']}, {which}, {m['device']}"
    table = accuracy_table(title, groups, m["label_mask"])
    data = {"out": str(out), "up_to_date": False,
            **{k: m[k] for k in ("algorithm", "best_round", "rounds", "selection", "label_mask", "headline_metric",
                                 "device")},
            **groups}
    report.result(data, table)
    from pfl_cli.cli.chance import near_chance

    warning = near_chance({g: m[g].get("mean_accuracy") for g in ("train", "holdout") if g in m},
                          m["dataset"]["num_classes"], m["algorithm"])
    if warning:  # issue 33: a run whose settings did not learn says so (never under --dp: nothing released)
        report.warn(warning)



def _print_dp_summary(report: Reporter, out: Path, m: dict, nonprivate: bool) -> None:
    from rich.table import Table

    dp = m["dp"]
    table = Table(title=f"train --dp -> {out}: {m['algorithm']}, model of the last round ({m['rounds']}), "
                  f"{m['device']}", title_justify="left")
    total = "epsilon_total" in dp  # composed with the private study that chose the config
    for col in ("unit", "epsilon", *(["with study"] if total else []), "delta", "clip", "noise multiplier",
                "sampling rate", "accountant"):
        table.add_column(col, justify="right")
    table.add_row(dp["unit"], f"{dp['epsilon']:g}", *([f"{dp['epsilon_total']:.4g}"] if total else []),
                  f"{dp['delta']:g}", f"{dp['clip']:g}", f"{dp['noise_multiplier']:.4g}",
                  f"{dp.get('sampling_rate', float('nan')):.4g}", dp["accountant"])
    data = {"out": str(out), "up_to_date": False, "dp": dp,
            **{k: m[k] for k in ("algorithm", "rounds", "selection", "device")}}
    from pfl_cli.privacy.randomness import stamp

    table.caption, table.caption_justify = stamp(dp["noise"]), "left"
    if "surviving_cohort_assumption" in dp:  # distributed DP (pfl_cli.privacy.distributed)
        table.caption += f"\n{dp['mechanism']}: accounted for {dp['surviving_cohort_assumption']}"
    # Printing is releasing too: accuracies on the private clients stay in the nonprivate* files.
    if nonprivate:
        data["nonprivate_files"] = ["nonprivate.json", "nonprivate-metrics.csv", "nonprivate-clients.csv"]
        report.note(f"accuracies on the private clients (not covered by DP): {out}/nonprivate.json")
    report.result(data, table)

