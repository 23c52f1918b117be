"""Experiment loggers of `pflx train --log tensorboard|csv|jsonl`: per-round metrics where those tools read them.

They write while training runs (a dashboard follows the run), into ``--log-dir`` (default: ``OUT.logs``
beside ``--out``), never into the artifact, which is written atomically at the end:

- ``tensorboard``: event files under ``LOG_DIR/tensorboard`` (``tensorboard --logdir LOG_DIR``), through
  the ``tensorboard`` package (optional extra ``pflx[tensorboard]``);
- ``csv``: ``LOG_DIR/metrics.csv`` with columns round, metric, value (pandas, spreadsheets);
- ``jsonl``: ``LOG_DIR/metrics.jsonl``, one JSON object per round (round, elapsed_s, the metrics).

Metric names are ``GROUP/METRIC``: ``train/cohort_loss`` every round (the mean training loss of the
round's cohort), ``train|holdout|val/accuracy`` at every evaluation (the headline: label-masked when
``label_mask``). Under ``--dp`` nothing computed from private data is logged -- the DP artifact
releases no per-round value -- so a DP run logs ``time/elapsed_s`` per round and nothing else.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Sequence

from pfl_cli.errors import ConfigError, InputError

KINDS = ("tensorboard", "csv", "jsonl")


def check_loggers(kinds: Sequence[str]) -> tuple[str, ...]:
    """The requested loggers, each once; refused before any work when unknown or not installed (exit 2)."""
    chosen = tuple(dict.fromkeys(kinds))
    for kind in chosen:
        if kind not in KINDS:
            raise ConfigError(f"--log must be one of {', '.join(KINDS)} (repeat it for several); got {kind!r}.")
    if "tensorboard" in chosen:
        import importlib.util

        if importlib.util.find_spec("tensorboard") is None:
            raise InputError("--log tensorboard writes through the tensorboard package, which is not installed; "
                             "install the extra: pip install 'pflx[tensorboard]'.")
    return chosen


def default_log_dir(out: Path) -> Path:
    return out.parent / f"{out.name}.logs"


class RunLoggers:
    """The loggers of one train run; ``log(round, values)`` after every round, ``close()`` at the end."""

    def __init__(self, kinds: Sequence[str], log_dir: Path, *, private: bool, resume: bool = False) -> None:
        self.kinds, self.log_dir, self.private = tuple(kinds), Path(log_dir), private
        self.start = time.monotonic()
        self._csv = self._jsonl = self._tb = None
        if not self.kinds:
            return
        self.log_dir.mkdir(parents=True, exist_ok=True)
        mode = "a" if resume else "w"  # a resumed run continues its logs; a fresh one starts them over
        if "csv" in self.kinds:
            path = self.log_dir / "metrics.csv"
            fresh = mode == "w" or not path.is_file()
            self._csv = open(path, mode, newline="")
            if fresh:
                self._csv.write("round,metric,value\n")
        if "jsonl" in self.kinds:
            self._jsonl = open(self.log_dir / "metrics.jsonl", mode)
        if "tensorboard" in self.kinds:
            from torch.utils.tensorboard import SummaryWriter  # needs the tensorboard package

            self._tb = SummaryWriter(log_dir=str(self.log_dir / "tensorboard"))

    def log(self, round_: int, values: dict[str, float]) -> None:
        if not self.kinds:
            return
        elapsed = time.monotonic() - self.start
        # Under --dp only what the ledger released may leave the run: no per-round value is released.
        values = {"time/elapsed_s": elapsed} if self.private else {**values, "time/elapsed_s": elapsed}
        if self._csv is not None:
            self._csv.writelines(f"{round_},{name},{value!r}\n" for name, value in values.items())
            self._csv.flush()
        if self._jsonl is not None:
            self._jsonl.write(json.dumps({"round": round_, **values}, allow_nan=True) + "\n")
            self._jsonl.flush()
        if self._tb is not None:
            for name, value in values.items():
                self._tb.add_scalar(name, value, round_)
            self._tb.flush()

    def close(self) -> None:
        for handle in (self._csv, self._jsonl, self._tb):
            if handle is not None:
                handle.close()
        self._csv = self._jsonl = self._tb = None


def round_values(status: dict, evaluated: bool) -> dict[str, float]:
    """The metrics of a round from the round loop's progress status (loss; latest headline accuracies)."""
    values = {"train/cohort_loss": float(status["loss"])} if "loss" in status else {}
    if evaluated:
        values.update({f"{group}/accuracy": float(status[group]) for group in ("train", "holdout", "val")
                       if group in status})
    return values
