"""Error hierarchy and exit codes.

Every error a user can cause is a :class:`PflxError`. The CLI's single error boundary
(``pfl_cli.cli.app.main``) turns it into one line on stderr and its ``exit_code``:
2 for bad usage or bad input, 1 for a failure at run time. The input errors also
subclass :class:`ValueError`, so library users can catch them the usual way.
"""

from __future__ import annotations

EXIT_OK = 0
EXIT_RUNTIME = 1
EXIT_USAGE = 2
EXIT_INTERRUPTED = 130  # 128 + SIGINT, as shells report Ctrl-C


class PflxError(Exception):
    """Base class of every error pflx reports to a user."""

    exit_code = EXIT_USAGE


class InputError(PflxError, ValueError):
    """A parameter, file or dataset that cannot be used as given (exit 2)."""


class ConfigError(InputError):
    """A config file, ``--set`` override or option value that is invalid (exit 2)."""


class DatasetError(InputError):
    """A dataset spec or dataset file that cannot be read or is invalid (exit 2)."""


class ArtifactError(InputError):
    """An artifact directory that is missing, of the wrong stage, or corrupt (exit 2)."""


class InfeasibleError(InputError):
    """A request that no result can satisfy, detected before any work (exit 2)."""


class PrivacyBudgetError(InputError):
    """A privacy target that no parameter in the searched range can meet (exit 2)."""


class RunError(PflxError, RuntimeError):
    """A failure while running (diverged training, device failure): exit 1."""

    exit_code = EXIT_RUNTIME


def check_param(name: str, ok: bool, rule: str, got: object, *, fix: str | None = None) -> None:
    """Raise :class:`InputError` as "parameter / rule / got" when ``ok`` is false.

    Examples
    --------
    >>> check_param("alpha", 0.5 > 0, "must be > 0", 0.5)
    >>> check_param("alpha", -1 > 0, "must be > 0", -1)
    Traceback (most recent call last):
    ...
    pfl_cli.errors.InputError: alpha must be > 0; got -1.
    """
    if not ok:
        message = f"{name} {rule}; got {got!r}."
        if fix:
            message += f" {fix}"
        raise InputError(message)


class PflxWarning(UserWarning):
    """A usable but degraded result (a repaired partition, a skipped empty client)."""
