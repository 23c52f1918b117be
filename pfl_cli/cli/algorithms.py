"""`pflx algorithms [NAME]`: every algorithm `pflx train` runs, or one algorithm's keys, defaults and their sources.

Everything printed comes from :mod:`pfl_cli.registry` and the config dataclasses it maps to
(each field's default, its ``doc`` and its ``source`` metadata); ``--format markdown`` renders
the same rows as the tables of ``docs/algorithms/reference.md`` (``--all`` writes that page).
"""

from __future__ import annotations

import dataclasses
import enum
from typing import Annotated, Any, Optional

import typer

from pfl_cli.cli.output import Reporter


class ListFormat(str, enum.Enum):
    human = "human"
    json = "json"
    markdown = "markdown"
    quiet = "quiet"


def algorithms(
    name: Annotated[Optional[str], typer.Argument(help="An algorithm: list its keys, defaults and their sources.",
                                                  show_default=False)] = None,
    every: Annotated[bool, typer.Option("--all", help="The list and every algorithm's keys (with --format markdown: "
                                        "docs/algorithms/reference.md).")] = False,
    fmt: Annotated[ListFormat, typer.Option("--format", help="human | json | markdown | quiet.")] = ListFormat.human,
) -> None:
    """List the algorithms of `pflx train`: paper, DP support, how a new client gets its model,
    whether it serves clients without labels. With NAME: its keys, their defaults and where each
    default comes from (the paper's section, table or equation). Plugins (entry points
    `pflx.algorithms`) are listed beside the built-ins; one that cannot be loaded is named in a warning.

    Examples: pflx algorithms ; pflx algorithms pfedhn ; pflx algorithms --all --format markdown
    """
    from pfl_cli import registry
    from pfl_cli.cli.common import warn_plugin_problems

    warn_plugin_problems()
    if fmt == ListFormat.markdown:
        typer.echo(reference_markdown() if every else
                   (keys_markdown(registry.get(name)) if name else summary_markdown()), nl=False)
        return
    # one algorithm's keys: prose, wrapped off a terminal; the list keeps one line a row (grep-able in a pipe)
    report = Reporter({"human": "human", "json": "json", "quiet": "quiet"}[fmt.value], prose=name is not None)
    if name is not None:
        entry = registry.get(name)
        report.result({"algorithm": entry.name, **summary_row(entry), "keys": key_rows(entry),
                       "search": search_doc(entry)}, _keys_table(entry), _search_table(entry))
        return
    rows = [{"algorithm": e.name, **summary_row(e)} for e in registry.entries().values()]
    doc: dict[str, Any] = {"algorithms": rows, "plugin_problems": registry.plugin_problems()}
    tables = [_summary_table(rows)]
    if every:
        doc["keys"] = {e.name: key_rows(e) for e in registry.entries().values()}
        tables += [_keys_table(e) for e in registry.entries().values()]
    report.result(doc, *tables)


# ---------------------------------------------------------------------------- rows
def summary_row(entry) -> dict[str, str]:
    cls = entry.algorithm
    return {"paper": cls.paper or (cls.__doc__ or "").strip().splitlines()[0], "dp": entry.dp,
            "new_clients": cls.new_client_protocol or "as in training", "unlabeled_clients": "yes" if cls.serves_unlabeled
            else "no", "conditions": conditions_doc(cls), "asynchronous": async_doc(cls), "origin": entry.origin}


def async_doc(cls) -> str:
    """Whether the algorithm aggregates asynchronously (docs/algorithms/async.md), from what it declares."""
    if cls.asynchronous:
        return "yes: its server aggregates client updates as they arrive on the simulated clock"
    if cls.async_ready:
        return f"could (declared, not built: pflx runs it in synchronous rounds): {cls.async_ready}"
    return "no (synchronous rounds)"


def conditions_doc(cls) -> str:
    """What the algorithm does under federation conditions (docs/federation-conditions.md), from what it declares."""
    from pfl_cli.fl.conditions.settings import refusal

    why = refusal(cls)
    if why:
        return f"refused: {why}"
    late = "kept as partial work" if cls.partial_work else "dropped"
    return f"late work {late}; compression {'topk, qsgd, sign' if cls.compressible_upload else 'refused'}"


def key_rows(entry) -> list[dict[str, Any]]:
    """One row per key: name, default, meaning, and where the default comes from ("pflx" when no paper says)."""
    return [{"key": f.name, "default": _plain(f.default), "doc": f.metadata.get("doc", ""),
             "source": f.metadata.get("source") or "pflx"} for f in dataclasses.fields(entry.config)
            if f.name in entry.keys]  # not the keys it refuses as without effect (Algorithm.inert_keys)


def _plain(value):
    return list(value) if isinstance(value, tuple) else value


def _show(value) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, list):
        return "[" + ", ".join(map(_show, value)) + "]"
    return repr(value) if isinstance(value, str) else f"{value:g}" if isinstance(value, float) else str(value)


# ---------------------------------------------------------------------------- human
def _summary_table(rows):
    from rich.table import Table

    table = Table(title="algorithms of pflx train", title_justify="left", caption="pflx algorithms NAME: its keys",
                  caption_justify="left")
    for col in ("algorithm", "paper", "DP", "new clients", "unlabeled clients"):
        table.add_column(col, overflow="fold")
    for r in rows:
        table.add_row(r["algorithm"], r["paper"], r["dp"], r["new_clients"], r["unlabeled_clients"])
    return table


def _keys_table(entry):
    from rich.table import Table

    table = Table(title=f"{entry.name}: keys (--set key=value, --config, or the flag of the same name)",
                  title_justify="left")
    for col in ("key", "default", "source", "meaning"):
        table.add_column(col, overflow="fold")
    for r in key_rows(entry):
        table.add_row(r["key"], _show(r["default"]), r["source"], r["doc"])
    return table


def search_doc(entry) -> dict[str, Any]:
    """What `pflx tune` searches for ``entry``: its declared space, the source, and the clients it is scored on."""
    from pfl_cli.tune.space import declared_space

    cls = entry.algorithm
    own = bool(getattr(cls, "search_space", None))
    return {"space": declared_space(cls),
            "source": cls.search_space_source if own else "pflx: the client lr (the algorithm declares no space)",
            "scored_on": "validation clients (clients unseen in training)" if cls.tune_group == "new"
            else "the train clients' validation samples"}


def _search_table(entry):
    from rich.table import Table

    import textwrap

    from pfl_cli.cli.output import PROSE_WIDTH

    doc = search_doc(entry)
    fill = lambda text: textwrap.fill(text, PROSE_WIDTH)  # noqa: E731 - a title wider than its table stays one line
    table = Table(title=fill(f"{entry.name}: search space of `pflx tune` (--space KEY=SPEC replaces or adds a key); "
                             f"scored on {doc['scored_on']}"), title_justify="left",
                  caption=fill(f"source: {doc['source']}"), caption_justify="left")
    table.add_column("key")
    table.add_column("spec", overflow="fold")
    for key, spec in doc["space"].items():
        table.add_row(key, spec)
    return table


# ---------------------------------------------------------------------------- markdown
def _cell(text: str) -> str:
    return str(text).replace("|", "\\|")


def summary_markdown() -> str:
    from pfl_cli import registry

    lines = ["| algorithm | paper | DP | new clients | unlabeled clients |", "|---|---|---|---|---|"]
    for e in registry.entries().values():
        r = summary_row(e)
        lines.append(f"| [`{e.name}`](#{e.name}) | {_cell(r['paper'])} | {r['dp']} | {_cell(r['new_clients'])} | "
                     f"{r['unlabeled_clients']} |")
    return "\n".join(lines) + "\n"


def keys_markdown(entry, *, own: bool = False) -> str:
    """``entry``'s keys as a markdown table; ``own``: only those it adds to the common keys or whose default
    differs from theirs (the reference page lists the common keys once)."""
    from pfl_cli.fl.config import TrainConfig

    common = {f.name: f.default for f in dataclasses.fields(TrainConfig)}
    rows = [r for r in key_rows(entry) if not own or r["key"] not in common or
            (r["key"] != "algorithm" and _plain(common[r["key"]]) != r["default"])]
    lines = [f"### {entry.name}", "", f"{_cell(summary_row(entry)['paper'])}. DP: {entry.dp}. Federation "
             f"conditions: {_cell(summary_row(entry)['conditions'])}. Asynchronous: "
             f"{_cell(summary_row(entry)['asynchronous'])}.", "",
             "| key | default | source | meaning |", "|---|---|---|---|"]
    for r in rows:
        lines.append(f"| `{r['key']}` | `{_show(r['default'])}` | {_cell(r['source'])} | {_cell(r['doc'])} |")
    search = search_doc(entry)
    lines += ["", "Search space of `pflx tune` (scored on " + search["scored_on"] + "): "
              + ", ".join(f"`{k}` `{v}`" for k, v in search["space"].items()) + ". Source: "
              + _cell(search["source"]) + "."]
    return "\n".join(lines) + "\n"


def reference_markdown() -> str:
    """``docs/algorithms/reference.md``: the list, then every built-in algorithm's keys (plugins are left out,
    so the page is the same on every machine)."""
    from pfl_cli import registry

    builtins = [e for e in registry.entries().values() if e.origin == "built-in"]
    head = ["# Algorithms reference", "",
            "<!-- Generated by `pflx algorithms --all --format markdown`; do not edit by hand "
            "(tests/cli/test_algorithms_command.py checks it). -->", "",
            "Every algorithm owns its keys: `pflx train --algorithm NAME` with no other option runs the paper's "
            "setting, and a key the algorithm does not take is refused. Sources cite the papers by the short "
            "names of the [bibliography](../bibliography.md) (section, table, equation; \"official code\": the "
            "authors' published code where the paper is silent; \"pflx\": a default of this tool, not from a "
            "paper).", "",
            "| algorithm | paper | DP | new clients | unlabeled clients |", "|---|---|---|---|---|"]
    for e in builtins:
        r = summary_row(e)
        head.append(f"| [`{e.name}`](#{e.name}) | {_cell(r['paper'])} | {r['dp']} | {_cell(r['new_clients'])} | "
                    f"{r['unlabeled_clients']} |")
    from pfl_cli.fl.config import TrainConfig

    common_rows = "\n".join(["| key | default | meaning |", "|---|---|---|"] + [
        f"| `{f.name}` | `{_show(_plain(f.default))}` | {_cell(f.metadata.get('doc', ''))} |"
        for f in dataclasses.fields(TrainConfig) if f.name != "algorithm"]) + "\n"
    return ("\n".join(head) + "\n\n## Common keys\n\nEvery algorithm takes these (its own default where its "
            "table below lists the key again).\n\n" + common_rows + "\n## Each algorithm's own keys\n\n"
            + "\n".join(keys_markdown(e, own=True) for e in builtins))
