"""Where things are printed: results on stdout, everything else on stderr.

``--format json`` prints exactly one JSON object on stdout (for ``jq``); ``human`` prints
rich tables; ``quiet`` prints nothing but errors. Progress bars and notes go to stderr
and switch off when stderr is not a terminal.
"""

from __future__ import annotations

import json
import sys
import warnings
from contextlib import contextmanager
from typing import Any, Iterator

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

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


class Reporter:
    """Prints one command's results and notes in the chosen format."""

    def __init__(self, fmt: Format | str = Format.human) -> None:
        self.fmt = Format(fmt)
        self.out = Console(file=sys.stdout, highlight=False, soft_wrap=True)
        self.err = Console(file=sys.stderr, highlight=False, soft_wrap=True)

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
    def progress(self, description: str, total: int | None) -> Iterator[Any]:
        """A progress bar on stderr; a no-op object when stderr is not a terminal."""
        enabled = self.fmt is Format.human and self.err.is_terminal
        bar = Progress(
            TextColumn("{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("{task.fields[status]}"),
            TimeElapsedColumn(),
            console=self.err,
            disable=not enabled,
            transient=True,
        )
        with bar:
            task = bar.add_task(description, total=total, status="")

            class _Handle:
                def advance(self, n: int = 1, status: str = "") -> None:
                    bar.update(task, advance=n, status=status)

            yield _Handle()
