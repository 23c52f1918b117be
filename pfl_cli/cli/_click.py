"""The click that typer runs on: typer >= 0.2x vendors its own copy as ``typer._click``.

Exceptions must be caught from the copy typer actually raises, so import them from here.
"""

from __future__ import annotations

try:  # vendored click (typer 0.2x and later)
    from typer._click import exceptions as exceptions
except ImportError:  # pragma: no cover - older typer on upstream click
    from click import exceptions as exceptions  # type: ignore[no-redef]

UsageError = exceptions.UsageError
# click >= 8.4 raises NoSuchCommand, which already ends "Did you mean 'train'?"; typer's own
# suggestion (TyperGroup.suggest_commands) would then append the same sentence a second time.
CLICK_SUGGESTS_COMMANDS = hasattr(exceptions, "NoSuchCommand")
NoArgsIsHelpError = getattr(exceptions, "NoArgsIsHelpError", ())
Exit = exceptions.Exit if hasattr(exceptions, "Exit") else __import__("typer").Exit
Abort = exceptions.Abort if hasattr(exceptions, "Abort") else __import__("typer").Abort


def given_on_command_line(ctx, name: str) -> bool:
    """Whether option ``name`` was typed by the user (compared by name: enums differ per copy)."""
    source = ctx.get_parameter_source(name)
    return source is not None and source.name == "COMMANDLINE"
