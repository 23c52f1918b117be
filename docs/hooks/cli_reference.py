"""mkdocs hook: each command page's option reference, generated from the CLI itself at build time.

A page holds the marker ``<!-- pflx-options: COMMAND -->``; the build replaces it with the usage
line and a table of the command's options read from the typer/click command that ``pflx`` runs,
so the reference cannot drift from the code. An unknown command name fails the build.
"""

from __future__ import annotations

import re

MARKER = re.compile(r"<!--\s*pflx-options:\s*([a-z-]+(?: [a-z-]+)*)\s*-->")  # "train", "flower app"


def _cell(text: str, *, code: bool = False) -> str:
    """One table cell: whitespace collapsed; a "|" outside code spans escaped so that it does not end the
    cell. Inside a code span the table extension already keeps "|" and would print a backslash literally."""
    text = " ".join(str(text).split())
    if code:
        return f"`{text}`"
    parts = text.split("`")  # odd-numbered parts lie inside code spans
    return "`".join(p if i % 2 else p.replace("|", "\\|") for i, p in enumerate(parts))


def options_reference(name: str) -> str:
    """The usage line and one table row per option of ``pflx NAME``, as its ``--help`` prints them."""
    try:  # the click that typer runs on (typer >= 0.2x vendors its own copy)
        from typer._click.core import Context
    except ImportError:  # pragma: no cover - older typer on upstream click
        from click import Context

    from pfl_cli.cli.app import _command

    command = _command()  # the tree `pflx` runs: its help records, its --wait
    for part in name.split():  # a subcommand of a group ("flower app") is reached word by word
        group = command
        command = getattr(group, "commands", {}).get(part)
        if command is None:
            raise ValueError(f"pflx-options: no command {name!r}; have {sorted(getattr(group, 'commands', {}))}")
    ctx = Context(command, info_name=f"pflx {name}")
    usage = " ".join(command.collect_usage_pieces(ctx))
    rows = ["| option | what it does |", "|---|---|"]
    for param in command.params:
        record = param.get_help_record(ctx)  # None for hidden options
        if record is None:
            continue
        flags, text = record
        kind = " (argument)" if param.param_type_name == "argument" else ""
        rows.append(f"| {_cell(flags, code=True)}{kind} | {_cell(text)} |")
    return f"```text\nUsage: pflx {name} {usage}\n```\n\n" + "\n".join(rows) + "\n"


def on_page_markdown(markdown, page, config, files):
    return MARKER.sub(lambda m: options_reference(m.group(1)), markdown)
