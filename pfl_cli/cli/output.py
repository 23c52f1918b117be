"""Where things are printed: results on stdout, everything else on stderr.

``--format json`` prints exactly one JSON object on stdout (for ``jq``); ``human`` prints
rich tables; ``quiet`` prints nothing but errors. Progress goes to stderr: a rich bar with the
time left in a terminal, one plain line at a steady cadence when stderr is a file or a pipe
(Makefiles, CI logs, ``nohup``), nothing with ``quiet``.
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time
import warnings
from contextlib import contextmanager
from typing import Any, Callable, Iterator, TextIO

from pfl_cli.cli.options import Format
from pfl_cli.errors import PflxWarning


def _jsonable(obj: Any) -> Any:
    import numpy as np

    if isinstance(obj, dict):
        return {str(k): _jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_jsonable(v) for v in obj]
    if isinstance(obj, np.generic):
        return obj.item()
    if isinstance(obj, np.ndarray):
        return obj.tolist()
    if hasattr(obj, "__fspath__"):
        return str(obj)
    return obj


# Seconds between two plain progress lines off a terminal; PFLX_PROGRESS_EVERY overrides it.
PROGRESS_EVERY_S = 10.0


def _clock(seconds: float) -> str:
    seconds = int(round(seconds))
    return f"{seconds // 3600}:{seconds // 60 % 60:02d}:{seconds % 60:02d}"


def _progress_every() -> float:
    """PFLX_PROGRESS_EVERY seconds when it is a number >= 0, else the default (a bad value is not worth a failed run)."""
    try:
        every = float(os.environ.get("PFLX_PROGRESS_EVERY", PROGRESS_EVERY_S))
    except ValueError:
        return PROGRESS_EVERY_S
    return every if every >= 0 else PROGRESS_EVERY_S


class PlainProgress:
    """Progress as plain lines on a stream that is not a terminal, like the logs of Lightning or Flower.

    One line on the first step, then at most one every ``every`` seconds, and one when the work is
    done: ``train: round 12/400 (3%), elapsed 0:00:31, left ~0:16:40, loss 0.431``. The time left
    is the mean time per step since the first step ended times the steps left: the first step also
    holds the set-up (reading the data, building the model, torch's first calls), which would make
    the first estimates 10-20x too long, so the first line says no time left. ``status`` is whatever
    the caller may show (under ``--dp`` the callers pass nothing computed from private data).
    """

    def __init__(self, description: str, total: int | None, unit: str, stream: TextIO, every: float,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.description, self.total, self.unit, self.stream, self.every = description, total, unit, stream, every
        self.clock = clock
        self.start = clock()
        self.done = 0
        self.first = 0  # steps already done when timing started (a resumed run)
        self.timed_from: tuple[float, int] | None = None  # (time, steps done) at the end of the first step run here
        self.last_line: float | None = None
        self.finished = False
        self.status = ""
        self.lock = threading.Lock()  # advance() and the heartbeat's tick() write from two threads

    def advance(self, n: int = 1, status: str = "", total: int | None = None) -> None:
        with self.lock:
            if total is not None:  # known once the work is resolved (predict's client set)
                self.total = total
            if status == "resumed" and self.done == self.first:
                self.first += n  # a resumed run (or a protocol's finished steps): steps that took no time here
            self.done += n
            self.status = status
            now = self.clock()
            if self.timed_from is None and self.done > self.first:
                self.timed_from = (now, self.done)
            final = self.total is not None and self.done >= self.total
            if final and self.finished:
                return
            if self.last_line is None or now - self.last_line >= self.every or final:
                self.finished = final
                self._write(now)

    def tick(self) -> None:
        """The heartbeat: a line when none was written for ``every`` seconds, so that a log never stays silent
        longer than that while one step (a slow round, a trial's start) takes long."""
        with self.lock:
            now = self.clock()
            since = self.start if self.last_line is None else self.last_line
            if not self.finished and now - since >= self.every:
                self._write(now)

    def _write(self, now: float) -> None:
        self.last_line = now
        self.stream.write(self.line(now, self.status) + "\n")
        self.stream.flush()

    def line(self, now: float, status: str = "") -> str:
        elapsed = now - self.start
        parts = [f"{self.description}: {self.unit} {self.done}" + (f"/{self.total}" if self.total else "")
                 + (f" ({100 * self.done // self.total}%)" if self.total else ""), f"elapsed {_clock(elapsed)}"]
        if self.total and self.done >= self.total:
            parts.append(f"left ~{_clock(0)}")
        elif self.total and self.timed_from is not None and self.done > self.timed_from[1]:
            since, base = self.timed_from
            parts.append(f"left ~{_clock((now - since) / (self.done - base) * (self.total - self.done))}")
        if status and status != "resumed":
            parts.append(status)
        return ", ".join(parts)


# Off a terminal rich lays tables out in 80 columns, wrapping ``48.8 ±`` / ``2.8`` over two lines and
# cutting ``algorit…``; a file or pipe has no width, so tables keep their natural one (they never expand).
OFF_TERMINAL_WIDTH = 10_000
# Tables of prose (`pflx algorithms NAME`: each key's meaning and source) would be one line per row, 1,000
# characters long, in a file: off a terminal they wrap at the width of `--help` instead.
PROSE_WIDTH = 100


def _width(stream: TextIO, prose: bool = False) -> int | None:
    """The console width for ``stream``: rich's own choice on a terminal or with COLUMNS set, else unbounded
    (``prose``: :data:`PROSE_WIDTH`)."""
    if os.environ.get("COLUMNS") or (hasattr(stream, "isatty") and stream.isatty()):
        return None
    return PROSE_WIDTH if prose else OFF_TERMINAL_WIDTH


class Reporter:
    """Prints one command's results and notes in the chosen format."""

    def __init__(self, fmt: Format | str = Format.human, *, prose: bool = False) -> None:
        """``prose``: the results are tables of text, wrapped at :data:`PROSE_WIDTH` off a terminal."""
        self.fmt = Format(fmt)
        self._prose = prose
        self._consoles: dict[str, Any] = {}

    def _console(self, name: str):
        # rich costs ~50-100 ms of CPU: imported when something is printed, not by a quiet run found up to date
        if name not in self._consoles:
            from rich.console import Console

            stream = sys.stdout if name == "out" else sys.stderr
            self._consoles[name] = Console(file=stream, highlight=False, soft_wrap=True,
                                           width=_width(stream, self._prose and name == "out"))
        return self._consoles[name]

    @property
    def out(self):
        return self._console("out")

    @property
    def err(self):
        return self._console("err")

    def result(self, data: dict[str, Any], *human: Any) -> None:
        """Print the command's result: ``data`` as JSON, or the ``human`` renderables."""
        if self.fmt is Format.json:
            sys.stdout.write(json.dumps(_jsonable(data), allow_nan=False) + "\n")
        elif self.fmt is Format.human:
            for item in human:
                self.out.print(item)

    def note(self, message: str) -> None:
        """A progress or status line on stderr (human format only)."""
        if self.fmt is Format.human:
            self.err.print(message, markup=False)

    def warn(self, message: str) -> None:
        """A warning, printed by the error boundary when the command ends, unless it fails: a failed
        command says one line, why it failed."""
        if self.fmt is not Format.quiet:
            warnings.warn(message, PflxWarning, stacklevel=2)

    @contextmanager
    def progress(self, description: str, total: int | None, unit: str = "step") -> Iterator[Any]:
        """Progress of ``total`` steps (``unit``) on stderr: a rich bar with time left in a terminal,
        :class:`PlainProgress` lines when stderr is a file or pipe, nothing with ``--format quiet``.

        ``--format json`` keeps stdout one object: its progress goes to stderr as well.
        """
        if self.fmt is Format.quiet:
            yield _Silent()
            return
        if not self.err.is_terminal:
            plain = PlainProgress(description, total, unit, sys.stderr, _progress_every())
            stop = threading.Event()

            def beat() -> None:
                while not stop.wait(plain.every):
                    plain.tick()

            heart = threading.Thread(target=beat, name="pflx-progress", daemon=True)
            if plain.every > 0:
                heart.start()
            try:
                yield plain
            finally:
                stop.set()
                if heart.is_alive():
                    heart.join()
            return
        from rich.progress import (BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn,
                                   TimeRemainingColumn)

        bar = Progress(
            TextColumn("{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("{task.fields[status]}"),
            TimeElapsedColumn(),
            TextColumn("left"),
            TimeRemainingColumn(),
            console=self.err,
            transient=True,
        )
        with bar:
            task = bar.add_task(description, total=total, status="")

            class _Handle:
                def advance(self, n: int = 1, status: str = "", total: int | None = None) -> None:
                    bar.update(task, advance=n, status=status, **({} if total is None else {"total": total}))

            yield _Handle()


def core_progress(bar: Any, describe: Callable[[Any], str] | None = None) -> Callable[..., None]:
    """A core function's ``on_progress(done, total[, status])`` driving a :meth:`Reporter.progress` bar.

    Cores count the steps done in all; the bar takes increments. ``describe(status)`` is the text
    shown beside the count (none without it): the command decides what may be shown (under
    ``--dp`` nothing computed from private data).
    """
    seen = [0]

    def on_progress(done: int, total: int | None, status: Any = None) -> None:
        bar.advance(done - seen[0], status=describe(status) if describe is not None else "", total=total)
        seen[0] = done

    return on_progress


class _Silent:
    def advance(self, n: int = 1, status: str = "", total: int | None = None) -> None:
        pass
