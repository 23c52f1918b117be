"""`pflx show`: what an artifact is, its headline numbers and where it came from."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any, Optional

import typer

from pfl_cli.cli.options import Format, FormatOpt
from pfl_cli.cli.output import Reporter


def show(
    path: Annotated[Path, typer.Argument(metavar="PATH", help="An artifact directory written by any pflx command (--out).", show_default=False)],
    lineage: Annotated[bool, typer.Option("--lineage", help="Also list the chain of artifacts it came from, back to the datasets.")] = False,
    plot: Annotated[bool, typer.Option("--plot", help="Redraw the stage's figure from the artifact's CSVs (partition: partition.png, train: curves.png, predict and compare: clients.png) into --plot-dir.")] = False,
    plot_dir: Annotated[Optional[Path], typer.Option("--plot-dir", help="Where --plot writes NAME-partition.png / NAME-curves.png / NAME-clients.png (default: beside the artifact, in its parent directory; the artifact itself is never modified). A different figure already there is not overwritten.", show_default=False)] = None,
    fmt: FormatOpt = Format.human,
) -> None:
    """Show an artifact: stage, version, config, inputs (with their stages, still matching or not),
    outputs (every sha256 verified), and headline numbers. Refuses a directory that is not an
    artifact, or one with a missing or edited file (named).

    Examples: pflx show runs/part ; pflx show runs/pred --lineage ; pflx show runs/pefll --format json | jq .headline ;
    pflx show runs/pefll --plot --plot-dir figs
    """
    from pfl_cli import show as core

    if plot:
        from pfl_cli.cli.figures import require_matplotlib

        require_matplotlib("show --plot")
    report = Reporter(fmt)
    doc = core.describe(path)
    if lineage:
        doc["lineage"] = core.lineage(path)
    if plot:
        doc["figure"] = str(_redraw(Path(doc["path"]), doc["stage"], plot_dir))
    report.result(doc, *_tables(doc))


def _redraw(path: Path, stage: str, plot_dir: Path | None) -> Path:
    """Draw the stage's figure to ``plot_dir``/NAME-FIGURE (default: beside the artifact). A file already there
    is replaced only by the same bytes: two runs of one name (runs/s0/pefll, runs/s1/pefll) drawn into one
    --plot-dir would otherwise overwrite each other's figure silently."""
    import os
    import tempfile

    from pfl_cli.cli.figures import FIGURES
    from pfl_cli.errors import InputError

    if stage not in FIGURES:
        raise InputError(f"--plot draws partition, train, predict and compare artifacts; {path} is a {stage} artifact.")
    name, draw, sources = FIGURES[stage]
    plot_dir = path.resolve().parent if plot_dir is None else plot_dir
    plot_dir.mkdir(parents=True, exist_ok=True)
    target = plot_dir / f"{path.resolve().name}-{name}"
    fd, scratch = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".png", dir=plot_dir)
    os.close(fd)
    try:
        draw(*(path / s for s in sources), Path(scratch))
        if target.exists() and target.read_bytes() != Path(scratch).read_bytes():
            raise InputError(f"--plot-dir {plot_dir}: {target.name} is already there and is another figure (of "
                             "another run of that name, or an older one); remove it or pass another --plot-dir.")
        os.replace(scratch, target)
    finally:
        Path(scratch).unlink(missing_ok=True)
    return target


def _fmt(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.4g}"
    if isinstance(value, list) and value and isinstance(value[0], float):
        return "[" + ", ".join(f"{v:.3g}" for v in value[:12]) + (", ..." if len(value) > 12 else "") + "]"
    text = str(value)
    return text if len(text) <= 100 else text[:97] + "..."


def _tables(doc: dict) -> list:
    # Cells are Text, not markup: "[ok]" or a config list must print as written.
    from rich.table import Table
    from rich.text import Text

    about = Table(title=f"{doc['path']}: {doc['stage']} artifact (pflx {doc['tool_version']}, {doc['created_utc']})",
                  show_header=False, title_justify="left")
    about.add_column(style="bold")
    about.add_column()
    for key, value in doc["headline"].items():
        about.add_row(key, Text(_fmt(value)))
    if doc["seed"] is not None:  # a compare artifact has none: its runs' seeds are in its table
        about.add_row("seed", str(doc["seed"]))
    config = Table(title="config", show_header=False, title_justify="left")
    config.add_column(style="bold")
    config.add_column()
    for key, value in sorted(doc["config"].items()):
        config.add_row(key, Text(_fmt(value)))
    inputs = Table("input", "stage", "sha256", "status", title="inputs", title_justify="left")
    for ref in doc["inputs"]:
        inputs.add_row(Text(ref["path"]), ref["stage"], str(ref.get("sha256"))[:12], Text(ref["status"]))
    outputs = Table("output", "bytes", "sha256 (verified)", title="outputs", title_justify="left")
    for out in doc["outputs"]:
        outputs.add_row(Text(out["path"]), str(out["bytes"]), out["sha256"][:12])
    tables = [about, config, inputs, outputs]
    if "lineage" in doc:
        lines = ["lineage (each artifact, then what it was made from):"]
        for entry in doc["lineage"]:
            numbers = ", ".join(f"{k}={_fmt(v)}" for k, v in entry.get("headline", {}).items())
            lines.append(f"{'  ' * entry['depth']}- {entry['stage']}: {entry['path']} [{entry['status']}]"
                         + (f" {numbers}" if numbers else ""))
        tables.append(Text("\n".join(lines)))
    if "figure" in doc:
        tables.append(Text(f"figure: {doc['figure']}"))
    return tables
