"""Artifacts travel (DESIGN.md section 7): every stage reads its inputs from any working directory, and after
the artifact directories are moved, together with their input data, to another place (the old one deleted),
with the same result.

The suite is generated from the CLI: :data:`CHAIN` says how each command runs on tiny inputs, and
:func:`test_every_command_is_in_the_chain` fails for a command registered without an entry, so a new stage
joins the suite the day it is added. The chain starts from an ``npz:`` dataset given by a path relative to the
directory ``partition`` ran in (issue 39, defect 11: ``train`` from another directory failed with "no such
file"), goes through ``simulate``'s output, and runs every stage that reads artifacts three times: where it
was made, from another working directory, and after the whole tree has moved. Each run's payload must equal
the first's, file by file (sha256 from its manifest).
"""

from __future__ import annotations

import csv
import io
import json
import os
import shutil
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest

from pfl_cli.cli.app import _subcommand_names, main

SMALL = ["--rounds", "2", "--eval-every", "1", "--local-steps", "2", "--set", "mlp_hidden=[8]", "--device", "cpu"]


@dataclass(frozen=True)
class Step:
    """One command of the chain: its arguments (paths relative to the tree's root) and what it writes."""

    args: tuple[str, ...]
    out: str | None = None       # the artifact it writes (None: it prints its result only)
    reads: bool = True           # it reads an artifact or the dataset (so it runs again from elsewhere)
    slow: bool = False


# Every command of `pflx`, in chain order. A command that writes nothing and reads nothing says why.
CHAIN: dict[str, Step] = {
    "partition": Step(("partition", "--dataset", "npz:data/digits.npz", "--classes-per-client", "2",
                       "--num-clients", "8", "--holdout-clients", "2", "--test-fraction", "0.3"), "part", reads=False),
    "mdm-fit": Step(("mdm-fit", "--partition", "part", "--components", "1", "--rounds", "3", "--restarts", "1"),
                    "mdm"),
    "simulate": Step(("simulate", "--model", "mdm", "--dataset", "npz:data/digits.npz", "--num-clients", "6",
                      "--holdout-clients", "1"), "sim"),
    "train": Step(("train", "--partition", "part", "--algorithm", "fedavg", *SMALL), "model"),
    "train-sim": Step(("train", "--partition", "sim", "--algorithm", "fedavg", *SMALL), "model-sim"),
    "predict": Step(("predict", "--model", "model", "--partition", "part", "--clients", "holdout"), "pred"),
    "compare": Step(("compare", "model", "pred"), "cmp"),
    "cluster": Step(("cluster", "--partition", "part", "--server-data", "npz:data/server.npz", "--k", "3",
                     "--dp", "eps=1,noise=seeded", "--reference-n-init", "1"), "km"),
    "privacy-account": Step(("privacy-account", "km"), "acct"),
    "attack": Step(("attack", "--model", "model", "--partition", "part", "--images", "2", "--batch-size", "1",
                    "--attack", "dlg", "--iterations", "3", "--device", "cpu"), "att"),
    "tune": Step(("tune", "--partition", "part", "--algorithm", "fedavg", "--trials", "2", *SMALL,
                  "--space", "lr=choice:0.01,0.1", "--sampler", "grid"), "tune", slow=True),
    "show": Step(("show", "--lineage", "pred")),
    "flower": Step(("flower", "app", "--partition", "part", "--config", "fedavg.yaml"), "app"),
}
NOT_IN_CHAIN = {"algorithms": "lists the registry: reads no artifact and writes none"}


def test_every_command_is_in_the_chain():
    """A command registered without a CHAIN entry (or a reason in NOT_IN_CHAIN) fails here."""
    commands = {step.args[0] for step in CHAIN.values()}
    assert _subcommand_names() - set(NOT_IN_CHAIN) <= commands, "add the new command to CHAIN"


def _data(root: Path) -> None:
    from pfl_cli.data.builtin import _digits_arrays

    x, y = _digits_arrays()
    (root / "data").mkdir(parents=True)
    np.savez(root / "data" / "digits.npz", x=x[:400], y=y[:400])
    np.savez(root / "data" / "server.npz", x=x[400:460])
    (root / "fedavg.yaml").write_text("algorithm: fedavg\nrounds: 2\nval_fraction: 0\n")


def _run(name: str, step: Step, cwd: Path, root: Path, out: str | None, monkeypatch, capsys) -> dict:
    """Run ``step`` from ``cwd`` over the tree at ``root`` (given relative to ``cwd``), writing ``out``."""
    monkeypatch.chdir(cwd)
    prefix = Path(os.path.relpath(root, cwd))
    args, read_paths = [], {"part", "mdm", "sim", "model", "pred", "km", "fedavg.yaml"}
    for a in step.args:
        if a in read_paths:
            a = str(prefix / a)
        elif a.startswith("npz:"):
            a = f"npz:{prefix / a[4:]}"
        args.append(a)
    if out is not None:
        args += ["--out", str(out)]
    capsys.readouterr()
    code = main([*args, "--format", "json"])
    captured = capsys.readouterr()
    assert code == 0, f"{name} from {cwd}: {captured.err}"
    return json.loads(captured.out) if captured.out.strip() else {}


def _without_location(doc, name: str, typed: str):
    """A JSON document less where things were: the paths a user typed (``typed``, the tree's root as given, is
    cut from every string: a predict artifact names its model, compare's table its RUNs, privacy-account's
    statement its ledgers, each as typed) and the dataset's location in dataset.json (``spec``, ``spec_given``,
    ``source.path``, ``source.relative_path``; the digests stay)."""
    if isinstance(doc, list):
        return [_without_location(v, name, typed) for v in doc]
    if isinstance(doc, str):
        return doc.replace(typed, "") if typed else doc
    if not isinstance(doc, dict):
        return doc
    drop = {"spec", "spec_given", "path", "relative_path"} if name == "dataset.json" else set()
    return {k: _without_location(v, name, typed) for k, v in doc.items() if k not in drop and not _timing(k)}


def _timing(key: str) -> bool:
    return "seconds" in key  # wall-clock durations (tune's trials): not a result


def _payload(path: Path, typed: str = "") -> dict[str, object]:
    """Each output file's sha256; a JSON document as its content less the locations of its inputs, a CSV table
    less its durations. An SQLite study (tune's study.db) is left out: it stamps the time of every trial, and
    trials.csv holds what it records."""
    manifest = json.loads((path / "manifest.json").read_text())
    files: dict[str, object] = {o["path"]: o["sha256"] for o in manifest["outputs"] if not o["path"].endswith(".db")}
    for name in files:
        if name.endswith(".json"):
            files[name] = _without_location(json.loads((path / name).read_text()), name, typed)
        elif name.endswith(".csv"):
            rows = list(csv.DictReader(io.StringIO((path / name).read_text())))
            files[name] = [{k: v for k, v in row.items() if not _timing(k)} for row in rows]
    return files


def _check_travels(tmp_path, monkeypatch, capsys, names) -> None:
    origin = tmp_path / "origin"
    _data(origin)
    made = {}
    for name in names:  # the chain, from the tree's own directory, paths as a user types them there
        step = CHAIN[name]
        made[name] = _run(name, step, origin, origin, step.out, monkeypatch, capsys)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    moved = tmp_path / "moved" / "tree"
    for where, root in (("another working directory", origin), ("the tree moved", moved)):
        if root is moved:
            shutil.copytree(origin, moved, symlinks=True)
            shutil.rmtree(origin)
        for name in names:
            step = CHAIN[name]
            if not step.reads:
                continue
            out = None if step.out is None else elsewhere / f"{step.out}-{len(list(elsewhere.iterdir()))}"
            result = _run(name, step, elsewhere, root, out, monkeypatch, capsys)
            if step.out is not None and (root / step.out / "manifest.json").is_file():
                typed = f"{os.path.relpath(root, elsewhere)}{os.sep}"
                again, first = _payload(out, typed), _payload(root / step.out)
                differ = sorted(f for f in set(again) | set(first) if again.get(f) != first.get(f))
                assert not differ, f"{name} from {where}: another result in {differ}"
            check = SAME_OUTPUT.get(step.args[0])
            if check is not None:
                check(made[name], result, where)


def _show_inputs_found(first: dict, again: dict, where: str) -> None:
    lineage = again.get("lineage", [])
    assert lineage and all(e["status"] != "missing" for e in lineage), f"show --lineage from {where}: {lineage}"


def _same_epsilon(first: dict, again: dict, where: str) -> None:
    assert again.get("epsilon") == first.get("epsilon"), f"privacy-account from {where}"


SAME_OUTPUT = {"show": _show_inputs_found, "privacy-account": _same_epsilon}
DEFAULT = [n for n, s in CHAIN.items() if not s.slow]


def test_artifacts_travel(tmp_path, monkeypatch, capsys):
    _check_travels(tmp_path, monkeypatch, capsys, DEFAULT)


@pytest.mark.slow
def test_artifacts_travel_with_tune(tmp_path, monkeypatch, capsys):
    _check_travels(tmp_path, monkeypatch, capsys, ["partition", "tune"])
