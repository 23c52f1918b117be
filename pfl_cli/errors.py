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


def physical_memory() -> int:
    """Bytes of physical memory of this machine (a generous 1 TiB where the system does not say)."""
    import os

    try:
        return int(os.sysconf("SC_PAGE_SIZE")) * int(os.sysconf("SC_PHYS_PAGES"))
    except (ValueError, OSError, AttributeError):  # pragma: no cover - non-POSIX
        return 1 << 40


def format_bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB", "PiB"):
        if n < 1024 or unit == "PiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} PiB"  # pragma: no cover


def check_memory(what: str, num_bytes: float, *, fix: str) -> None:
    """Refuse (exit 2) a request whose arrays alone would need more than this machine's memory.

    ``num_bytes`` is what the arrays sized by user input would take; checking it up front turns
    a MemoryError deep in the run into a message that names the request and the size.

    Examples
    --------
    >>> check_memory("--num-clients 10 x 10 classes", 800, fix="")
    >>> check_memory("--max-samples 10**15", 8e15, fix="Lower --max-samples.")
    Traceback (most recent call last):
    ...
    pfl_cli.errors.InputError: --max-samples 10**15 would need 7.1 PiB of memory, ...
    """
    available = physical_memory()
    if num_bytes > available:
        raise InputError(f"{what} would need {format_bytes(num_bytes)} of memory, more than this machine's "
                         f"{format_bytes(available)}. {fix}".strip())


class PflxWarning(UserWarning):
    """A usable but degraded result (a repaired partition, a skipped empty client)."""
