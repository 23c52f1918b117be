"""What Ctrl-C leaves behind, said in one line by the error boundary.

A command that keeps something worth resuming (``train``'s checkpoint) says so with
:func:`kept` as soon as it exists; the boundary prints :func:`message` when the user
interrupts, and exits 130.
"""

from __future__ import annotations

_DEFAULT = "interrupted; nothing was written to --out."
_note = [_DEFAULT]


def reset() -> None:
    _note[0] = _DEFAULT


def kept(note: str) -> None:
    """Record what an interruption from now on would leave, e.g. the checkpoint and how to resume."""
    _note[0] = note


def message() -> str:
    return _note[0]
