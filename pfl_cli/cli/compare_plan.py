"""``pflx compare --spec FILE --dry-run``: the protocol's plan, nothing trained or written.

Every study and run of the spec, its rounds, and whether it is done already (a run whose artifact is up
to date with its config and inputs; a study whose tune artifact is complete), then the rounds left and an
estimate of the time they take: two rounds of each algorithm with work left are timed here, on this
machine, with the config of its first step (the second round's time: the first holds the set-up),
times the rounds left. Stacked seeds (``stack:``) cost less than that; studies' pruned trials too.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any, Callable

from pfl_cli.cli.output import Reporter


def plan_rows(spec, steps, root: Path, train_config: Callable) -> list[dict[str, Any]]:
    """One row per step: kind, algorithm, seed, rounds, status (done | to run | after its study), its path.
    ``train_config(name, config_file, sets, seed, spec)``: a seed's config as the protocol resolves it."""
    from pfl_cli.cli.common import load_partition_dataset
    from pfl_cli.overlap import partition_input
    from pfl_cli.config import config_to_dict

    _, _, part_art, ds = load_partition_dataset(spec.partition, flag=f"--spec {spec.path}: partition")
    inputs = [partition_input(part_art), ds.input_ref()]
    studies_done = {}
    rows = []
    for step in steps:
        if step.kind == "tune":
            path = root / f"tune-{step.name}"
            done = (path / "manifest.json").is_file() and (path / "best.yaml").is_file()
            studies_done[step.name] = path / "best.yaml" if done else None
            rows.append({"kind": "study", "algorithm": step.name, "seed": None, "rounds": step.units,
                         "status": "done" if done else "to run", "path": str(path), "cfg": step.cfg})
            continue
        path = root / step.name / f"seed-{step.seed}"
        cfg = step.cfg
        if step.name in studies_done:  # its config is the study's best.yaml, known once the study is done
            best = studies_done[step.name]
            if best is None:
                rows.append({"kind": "run", "algorithm": step.name, "seed": step.seed, "rounds": step.units,
                             "status": "after its study", "path": str(path), "cfg": cfg})
                continue
            cfg, _ = train_config(step.name, best, step.sets, step.seed, spec)
        rows.append({"kind": "run", "algorithm": step.name, "seed": step.seed, "rounds": step.units,
                     "status": _status(path, config_to_dict(cfg), cfg.seed, inputs), "path": str(path), "cfg": cfg})
    return rows


def _status(path: Path, config: dict, seed: int, inputs: list) -> str:
    """"done" when ``path`` holds the run of this config, seed and inputs (as :meth:`ArtifactWriter.up_to_date`
    says it, read-only: the plan takes no lock and writes nothing); else what training it will do."""
    import json

    from pfl_cli.artifacts import canonical_json

    try:
        manifest = json.loads((path / "manifest.json").read_text())
    except (OSError, ValueError):
        return "to run"
    same = (isinstance(manifest, dict) and manifest.get("stage") == "train"
            and canonical_json(manifest.get("config")) == canonical_json(json.loads(canonical_json(config)))
            and manifest.get("seed") == seed
            and [i.get("sha256") for i in manifest.get("inputs", [])] == [i.get("sha256") for i in inputs])
    return "done" if same else "to run (replaces another run: needs --force)"


def seconds_per_round(cfg, partition: Path) -> float | None:
    """The second of two rounds of ``cfg`` timed here (the first also holds the set-up: data, model, torch)."""
    import dataclasses

    from pfl_cli.cli.common import load_partition_dataset
    from pfl_cli.fl.api import train_federated
    from pfl_cli.fl.device import resolve_device

    part, _, _, ds = load_partition_dataset(partition)
    if not cfg.algorithm_class.federated:
        return None  # local training has no rounds (it counts one unit): not timed
    probe = dataclasses.replace(cfg, rounds=2, eval_every=2, checkpoint_every=0)
    stamps = []
    train_federated(ds.x, ds.y, ds.num_classes, part, probe, device=resolve_device(cfg.device), labeled=ds.labeled,
                    vocab_size=ds.extra.get("vocab_size"), on_progress=lambda *_: stamps.append(time.perf_counter()))
    return stamps[-1] - stamps[-2] if len(stamps) >= 2 else 0.0


def print_plan(spec, steps, root: Path, report: Reporter, *, train_config: Callable,
               estimate: bool = True) -> dict[str, Any]:
    """Print the plan of ``steps`` (and return it as JSON-ready data); ``train_config`` as :func:`plan_rows`."""
    rows = plan_rows(spec, steps, root, train_config)
    left = [r for r in rows if r["status"] != "done"]
    rates: dict[str, float] = {}
    if estimate:
        for r in left:
            if r["algorithm"] not in rates:
                rates[r["algorithm"]] = seconds_per_round(r["cfg"], spec.partition)
    seconds = sum(r["rounds"] * (rates.get(r["algorithm"]) or 0.0) for r in left) if estimate else None
    untimed = sorted({r["algorithm"] for r in left if estimate and rates.get(r["algorithm"]) is None})
    doc = {"studies": sum(r["kind"] == "study" for r in rows),
           "studies_done": sum(r["kind"] == "study" and r["status"] == "done" for r in rows),
           "runs": sum(r["kind"] == "run" for r in rows),
           "runs_done": sum(r["kind"] == "run" and r["status"] == "done" for r in rows),
           "rounds": sum(r["rounds"] for r in rows), "rounds_left": sum(r["rounds"] for r in left),
           "seconds_per_round": {k: None if v is None else round(v, 4) for k, v in rates.items()},
           "not_timed": untimed,
           "estimated_seconds": None if seconds is None else round(seconds, 1),
           "steps": [{k: v for k, v in r.items() if k != "cfg"} for r in rows]}
    report.result({"dry_run": True, **doc}, _table(rows, doc))
    return doc


def _clock(seconds: float) -> str:
    seconds = int(round(seconds))
    return f"{seconds // 3600}:{seconds // 60 % 60:02d}:{seconds % 60:02d}"


def _table(rows, doc):
    from rich.table import Table

    estimate = ("" if doc["estimated_seconds"] is None else
                f"; estimated ~{_clock(doc['estimated_seconds'])} on this machine (the second of two rounds of each "
                "algorithm timed here, times its rounds left; stacked seeds and pruned trials take less"
                + (f"; without {', '.join(doc['not_timed'])}, which has no rounds" if doc["not_timed"] else "") + ")")
    def count(n: int, what: str) -> str:
        return f"{n} {what if n == 1 else what.replace('study', 'studie') + 's'}"

    table = Table(title=f"compare --spec --dry-run: {count(doc['studies'], 'study')} ({doc['studies_done']} done), "
                  f"{count(doc['runs'], 'run')} ({doc['runs_done']} done), {doc['rounds_left']} of {doc['rounds']} rounds "
                  "left; nothing was trained or written", title_justify="left",
                  caption=f"rounds: a study's trials x its rounds, a run's rounds{estimate}", caption_justify="left")
    for col in ("step", "algorithm", "seed", "rounds", "status", "path"):
        table.add_column(col, justify="right" if col in ("seed", "rounds") else "left")
    for r in rows:
        table.add_row(r["kind"], r["algorithm"], "" if r["seed"] is None else str(r["seed"]), str(r["rounds"]),
                      r["status"], r["path"])
    return table
