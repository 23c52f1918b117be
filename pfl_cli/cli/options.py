"""Options shared by every command, so a flag means the same thing everywhere."""

from __future__ import annotations

import enum
from pathlib import Path
from typing import Annotated, Optional

import typer


class Format(str, enum.Enum):
    human = "human"
    json = "json"
    quiet = "quiet"


OutOpt = Annotated[Path, typer.Option("--out", "-o", help="Artifact directory to write.", show_default=False)]
SeedOpt = Annotated[int, typer.Option("--seed", help="Seed of every random stream of this stage.")]
ConfigOpt = Annotated[
    Optional[Path], typer.Option("--config", "-c", help="YAML config or recipe file (flags and --set win).")
]
SetOpt = Annotated[
    Optional[list[str]],
    typer.Option("--set", help="Override one config key: --set key=value (repeatable; wins over flags)."),
]
ForceOpt = Annotated[bool, typer.Option("--force", help="Replace an existing, different output directory.")]
FormatOpt = Annotated[
    Format, typer.Option("--format", help="human: tables; json: one JSON object on stdout; quiet: nothing.")
]

# Parameters that drive the command itself rather than the stage's computation.
COMMAND_PARAMS = ("out", "config", "set_", "force", "fmt")
