"""The body of `pflx compare`: read the runs, compute the table (:mod:`pfl_cli.compare`), write the artifact, print.

The ``compare`` artifact (DESIGN.md section 3): ``table.md``, ``table.csv``, ``table.json`` (per
configuration and client group: mean and interval over seeds, fairness across clients),
``clients.csv`` (label, group, seed, client_id, accuracy, accuracy_lm of every run) and, with
``--plot``, ``clients.png``. With ``--nonprivate`` over --dp runs every file is named
``nonprivate-*``: the numbers are diagnostics on private clients, not releases.
"""

from __future__ import annotations

from pathlib import Path
from typing import Sequence

from pfl_cli.cli.output import Reporter


def run_compare(runs: Sequence[Path], *, out: Path, nonprivate: bool, level: float, plot: bool, force: bool,
                report: Reporter) -> None:
    from pfl_cli.artifacts import ArtifactWriter
    from pfl_cli.compare import compare, read_runs
    from pfl_cli.compare.table import CLIENT_COLUMNS, CSV_COLUMNS

    config = {"level": level, "nonprivate": nonprivate, "plot": plot}
    ArtifactWriter(out, stage="compare", config=config, seed=None, force=force)  # --out problems first
    groups = read_runs(runs, nonprivate=nonprivate)
    table = compare(groups, level=level)
    inputs = list({g.input_ref["sha256"]: dict(g.input_ref) for g in groups}.values())
    writer = ArtifactWriter(out, stage="compare", config=config, seed=None, inputs=inputs, force=force)
    if writer.up_to_date():
        report.note(f"{out} is up to date (same runs and options); nothing to do.")
        report.result({"out": str(out), "up_to_date": True})
        return
    prefix = "nonprivate-" if table.nonprivate else ""
    with writer:
        writer.save_text(f"{prefix}table.md", table.markdown())
        writer.save_csv(f"{prefix}table.csv", CSV_COLUMNS, table.csv_rows())
        writer.save_json(f"{prefix}table.json", table.document())
        writer.save_csv(f"{prefix}clients.csv", CLIENT_COLUMNS, table.client_rows())
        if plot:
            from pfl_cli.cli.figures import comparison_boxes

            comparison_boxes(writer.path(f"{prefix}clients.csv"), writer.path(f"{prefix}table.json"),
                             writer.path(f"{prefix}clients.png"))
    _print(report, out, table, prefix)


def _print(report: Reporter, out: Path, table, prefix: str) -> None:
    from rich.table import Table

    from pfl_cli.compare.table import GROUP_NAMES, format_interval, format_pct

    runs = len({g.path for g in table.groups})
    title = f"compare -> {out}: {len({r['label'] for r in table.rows})} configurations, {runs} runs"
    rich_table = Table(title=title, title_justify="left", caption=table.markdown().split("\n\n", 1)[1].strip(),
                       caption_justify="left")
    for name, justify in (("algorithm", "left"), ("clients", "left"), ("seeds", "right"), ("accuracy %", "right"),
                          ("std", "right"), ("worst 10%", "right"), ("min", "right"), ("label-masked %", "right")):
        rich_table.add_column(name, justify=justify)
    for r in table.rows:
        rich_table.add_row(r["label"], GROUP_NAMES[(r["group"], r["source"])], str(r["num_seeds"]),
                           format_interval(r["accuracy"], r["accuracy_ci"]), format_pct(r["accuracy_std"]),
                           format_pct(r["accuracy_worst10"]), format_pct(r["accuracy_min"]),
                           format_interval(r["accuracy_lm"], r["accuracy_lm_ci"]))
    doc = table.document()
    rows = [{k: v for k, v in row.items() if k not in ("config", "predict_config")} for row in doc["rows"]]
    report.result({"out": str(out), "up_to_date": False, "files_prefix": prefix, **doc, "rows": rows}, rich_table)
