"""What the train core says while it runs, to whoever called it.

:func:`pfl_cli.train.run.run_train` and :func:`pfl_cli.train.stack.train_stack` report through one object
with the methods of :class:`TrainEvents`. This class is the Python user's default: silent but for warnings
(:class:`pfl_cli.errors.PflxWarning`, through :mod:`warnings`). The command (``pfl_cli.cli.train_run``) answers
the same methods with its reporter: lines on stderr, a progress bar, the summary table, what Ctrl-C leaves
behind, the experiment trackers of ``--log``.
"""

from __future__ import annotations

import time
import warnings
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator, Sequence

from pfl_cli.errors import InputError, PflxWarning

RESUME_HINT = "run the same command with --resume"


def default_log_dir(out: Path) -> Path:
    """Where a run's experiment loggers write unless told: ``OUT.logs`` beside the artifact ``OUT``."""
    out = Path(out)
    return out.parent / f"{out.name}.logs"


class _Silent:
    def advance(self, n: int = 1, status: str = "", total: int | None = None) -> None:
        pass


class NoLoggers:
    """The loggers of a run logging nothing."""

    def __init__(self) -> None:
        self.start = time.monotonic()

    def log(self, round_: int, status: dict, evaluated: bool) -> None:
        pass

    def close(self) -> None:
        pass


class TrainEvents:
    """The train core's reporter interface; every method has a default, so a caller overrides what it shows."""

    def note(self, message: str) -> None:
        """A status line (e.g. "resuming from round 50", "up to date")."""

    def warn(self, message: str) -> None:
        """A warning the run goes on after (a size clamped, a checkpoint discarded with ``force``)."""
        warnings.warn(message, PflxWarning, stacklevel=2)

    @contextmanager
    def progress(self, description: str, total: int | None, unit: str = "step") -> Iterator[Any]:
        """A context manager yielding a bar with ``advance(n, status=)``: the rounds trained."""
        yield _Silent()

    def kept(self, message: str) -> None:
        """What an interruption from now on would leave (the checkpoint and how to continue from it)."""

    def continue_hint(self) -> str:
        """How the caller continues an interrupted training (ends the :meth:`kept` lines)."""
        return RESUME_HINT

    def loggers(self, kinds: Sequence[str], log_dir: Path, *, private: bool, resume: bool, name: str,
                group: str | None, params: dict):
        """The experiment loggers of one run: ``log(round, status, evaluated)`` after every round (``status``: the
        round loop's progress status; with ``private`` nothing computed from it may be logged), ``close()`` at the
        end, and a settable ``start`` (monotonic seconds). The core's loggers log nothing: ``kinds`` are the
        command's (``pflx train --log``), refused here."""
        if kinds:
            raise InputError(f"logs {', '.join(kinds)}: the experiment loggers are the command's (pflx train "
                             "--log); "
                             "pass events that build them (pfl_cli.cli.train_run.ReporterEvents), or no logs.")
        return NoLoggers()

    def trained(self, out: Path, metrics: dict, *, private: bool, nonprivate: bool = False) -> None:
        """A run's artifact was written to ``out``: its ``metrics`` (under --dp the public ones, with ``dp``: what the
        ledger released; ``nonprivate``: the nonprivate* files were written too)."""
