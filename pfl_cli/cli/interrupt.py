"""What Ctrl-C leaves behind, said in one line by the error boundary.

A command that keeps something worth resuming (``train``'s checkpoint) says so with
:func:`kept` as soon as it exists; the boundary prints :func:`message` when the user
interrupts, and exits 130.
"""

from __future__ import annotations

_DEFAULT = "interrupted; nothing was written to --out."
_note = [_DEFAULT]
# How the running command continues an interrupted training: `train` with --resume; a command that trains inside
# itself and continues on its own (compare --spec) says its own way with :func:`continue_with`.
_RESUME = "run the same command with --resume"
_continue = [_RESUME]


def reset() -> None:
    _note[0] = _DEFAULT
    _continue[0] = _RESUME


def continue_with(text: str) -> None:
    """How to continue an interrupted training of this command (default: "run the same command with --resume")."""
    _continue[0] = text


def how_to_continue() -> str:
    return _continue[0]


def kept(note: str) -> None:
    """Record what an interruption from now on would leave, e.g. the checkpoint and how to resume."""
    _note[0] = note


def message() -> str:
    return _note[0]


def finish(code: int) -> None:
    """End the pflx process with ``code`` (the console script and ``python -m pfl_cli``). Once the command has
    finished, a Ctrl-C during the interpreter's exit changes nothing; after an interruption (130, its line
    printed) the process ends at once: CPython re-raises SIGINT at exit when a KeyboardInterrupt went through code
    it ran, and the shell would see a kill instead of exit 130."""
    import os
    import signal
    import sys

    signal.signal(signal.SIGINT, signal.SIG_IGN)
    if code == 130:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(130)
    raise SystemExit(code)
