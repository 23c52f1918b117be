"""Interrupted = uninterrupted (DESIGN.md section 7; issue 39, defect 10), for every command of the CLI.

Each command runs as a subprocess on tiny inputs and gets SIGINT (Ctrl-C) at a seeded random point: after its
first progress line plus a random delay for a command that prints progress, else at a random fraction of an
uninterrupted run's duration (not before the interpreter itself is up: a Ctrl-C in Python's own start-up, its
``site`` module, is Python's traceback, not pflx's). The process is stopped (SIGSTOP) before the signal, so the
point is one where it was still running. It must print exactly one line besides its progress lines (no
traceback) and exit 130, leaving no half-written artifact; the same command afterwards (``train`` with
``--resume`` when its line says a checkpoint was kept, ``tune`` by itself: the study continues) gives what the
uninterrupted run gave: every output file the same (JSON and CSV less wall-clock durations), tune's study the
same complete trials and best.yaml.

:data:`CASES` is generated against the CLI: :func:`test_every_command_has_a_case` fails for a command
registered without one, so a new stage joins the suite the day it is added. The default tier interrupts
``tune`` in the middle of a trial (the defect); every command runs under ``slow``.
"""

from __future__ import annotations

import csv
import io
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
import yaml

from pfl_cli.cli.app import _subcommand_names, main

SMALL = ("--eval-every", "1", "--local-steps", "2", "--set", "mlp_hidden=[8]", "--device", "cpu")
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "PFLX_PROGRESS_EVERY": "0.01",
       "PYTHONWARNINGS": "ignore"}
PROGRESS = re.compile(r"^[a-z-]+: [a-z]+ \d+(/\d+)? \(")  # `train: round 3/6 (50%), elapsed ...`


@dataclass(frozen=True)
class Case:
    """One command on the tree's tiny inputs (paths relative to the tree), and what it writes."""

    args: tuple[str, ...]
    out: str | None = None       # the artifact directory (None: the command prints its result only)
    progress: bool = False       # it prints progress lines (the interrupt comes after the first)


TRAIN = ("train", "--partition", "part", "--algorithm", "fedavg", "--rounds", "8", *SMALL)
CASES: dict[str, Case] = {
    "partition": Case(("partition", "--dataset", "builtin:digits", "--classes-per-client", "2", "--num-clients", "8",
                       "--holdout-clients", "2", "--test-fraction", "0.3"), "part"),
    "mdm-fit": Case(("mdm-fit", "--partition", "part", "--components", "3", "--rounds", "400", "--restarts", "3"),
                    "mdm", progress=True),
    "simulate": Case(("simulate", "--model", "mdm", "--dataset", "builtin:digits", "--num-clients", "6",
                      "--holdout-clients", "1"), "sim", progress=True),
    "train": Case(TRAIN, "model", progress=True),
    "predict": Case(("predict", "--model", "model", "--partition", "part", "--clients", "holdout"), "pred",
                    progress=True),
    "compare": Case(("compare", "model", "pred"), "cmp"),
    "cluster": Case(("cluster", "--partition", "part", "--server-data", "builtin:digits", "--k", "3",
                     "--dp", "eps=1,noise=seeded", "--reference-n-init", "1"), "km", progress=True),
    "privacy-account": Case(("privacy-account", "km"), "acct"),
    "attack": Case(("attack", "--model", "model", "--partition", "part", "--images", "2", "--batch-size", "1",
                    "--attack", "dlg", "--iterations", "6", "--device", "cpu"), "att", progress=True),
    "tune": Case(("tune", "--partition", "part", "--algorithm", "fedavg", "--trials", "4", "--rounds", "12", *SMALL,
                  "--space", "lr=log:1e-2:1", "--sampler", "random", "--pruner", "none"), "tune", progress=True),
    "show": Case(("show", "--lineage", "pred")),
    "flower": Case(("flower", "app", "--partition", "part", "--config", "fedavg.yaml"), "app"),
    "algorithms": Case(("algorithms", "fedavg")),
}
DEFAULT = ("tune",)


def test_every_command_has_a_case():
    assert _subcommand_names() <= {case.args[0] for case in CASES.values()}, "add the new command to CASES"


def _main(root: Path, args, monkeypatch, capsys) -> str:
    monkeypatch.chdir(root)
    capsys.readouterr()
    code = main([str(a) for a in args])
    captured = capsys.readouterr()
    assert code == 0, f"{args}: {captured.err}"
    return captured.out


@pytest.fixture(scope="module")
def tree(tmp_path_factory):
    """Every command's inputs and its uninterrupted result, made in process (the reference)."""
    root = tmp_path_factory.mktemp("interrupt")
    (root / "fedavg.yaml").write_text("algorithm: fedavg\nrounds: 2\nval_fraction: 0\n")
    return root


def _reference(root: Path, name: str, monkeypatch, capsys) -> str:
    """Run ``name`` (and what it reads, first) in process once; its stdout."""
    done = root / f".{name}.done"
    if done.exists():
        return done.read_text()
    needs = {"mdm-fit": ["partition"], "simulate": ["mdm-fit"], "train": ["partition"], "predict": ["train"],
             "compare": ["predict"], "cluster": ["partition"], "privacy-account": ["cluster"], "attack": ["train"],
             "tune": ["partition"], "show": ["predict"], "flower": ["partition"]}
    for other in needs.get(name, ()):
        _reference(root, other, monkeypatch, capsys)
    case = CASES[name]
    out = _main(root, [*case.args, *(["--out", case.out] if case.out else []), "--format", "json"], monkeypatch,
                capsys)
    done.write_text(out)
    return out


def _interrupt(root: Path, case: Case, out: str | None, rng: np.random.Generator, span: float | None):
    """Run ``case`` as a subprocess writing ``out`` and interrupt it at a random point; (exit code, stderr)."""
    args = [sys.executable, "-m", "pfl_cli", *case.args, *(["--out", out] if out else [])]
    for attempt in range(4):
        # a shell's background job has SIGINT ignored and a child inherits it: give the default back
        proc = subprocess.Popen(args, cwd=root, env=ENV, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
        head = []
        if case.progress:
            while not any(PROGRESS.match(line) for line in head):
                line = proc.stderr.readline()
                if not line:
                    break
                head.append(line)
            time.sleep(rng.uniform(0.0, 0.6) / (attempt + 1) if attempt < 3 else 0.0)  # last: at the line itself
        else:  # anywhere in the run once the interpreter is up (its own start-up, `site`, is Python's, not pflx's)
            time.sleep(max(_interpreter_startup(), span * rng.uniform(0.05, 0.95) / (attempt + 1)))
        proc.send_signal(signal.SIGSTOP)
        alive = proc.poll() is None
        if alive:
            proc.send_signal(signal.SIGINT)
        proc.send_signal(signal.SIGCONT)
        _, err = proc.communicate(timeout=300)
        # exit 0: the signal came after the command's work, while the interpreter exited (a Ctrl-C then changes
        # nothing); interrupt earlier
        if alive and proc.returncode != 0:
            return proc.returncode, "".join(head) + err
        if out is not None and (root / out).exists():
            shutil.rmtree(root / out)
    raise AssertionError(f"{case.args[0]} finished each time before the interrupt; give it more work")


def _interpreter_startup(cache=[]) -> float:
    """Twice the seconds a bare interpreter takes to start here (the slowest of three)."""
    if not cache:
        times = []
        for _ in range(3):
            started = time.monotonic()
            subprocess.run([sys.executable, "-c", "pass"], env=ENV, check=True)
            times.append(time.monotonic() - started)
        cache.append(2 * max(times))
    return cache[0]


def _files(path: Path, name: str, as_name: str) -> dict:
    """A directory without a manifest (flower app's project), file by file, its own name written as ``as_name``."""
    return {str(f.relative_to(path)): f.read_bytes().replace(name.encode(), as_name.encode())
            for f in sorted(path.rglob("*")) if f.is_file()}


def _payload(path: Path) -> dict:
    """Each output file's content: JSON less wall-clock durations, CSV rows less durations, other files' sha256;
    tune's study (SQLite, stamped with times) by its complete trials instead, and best.yaml as YAML (its comment
    names the trial's number, which an interrupted trial shifts)."""
    manifest = json.loads((path / "manifest.json").read_text())
    files: dict[str, object] = {}
    for o in manifest["outputs"]:
        name, file = o["path"], path / o["path"]
        if name.endswith(".json"):
            files[name] = doc = _untimed(json.loads(file.read_text()))
            if manifest["stage"] == "tune" and name == "metrics.json":
                doc["trials"].pop("interrupted", None)  # the interrupted trial is recorded, not counted
        elif name.endswith(".csv"):
            rows = [{k: v for k, v in row.items() if "seconds" not in k}
                    for row in csv.DictReader(io.StringIO(file.read_text()))]
            if name == "trials.csv":  # tune: the counted trials, in order, less their numbers
                rows = [{k: v for k, v in r.items() if k != "number"} for r in rows if r["state"] != "interrupted"]
            files[name] = rows
        elif name == "best.yaml":
            files[name] = yaml.safe_load(file.read_text())
        elif not name.endswith(".db"):
            files[name] = o["sha256"]
    return files


def _untimed(doc):
    if isinstance(doc, dict):
        return {k: _untimed(v) for k, v in doc.items() if "seconds" not in k and k != "trial"}
    if isinstance(doc, list):
        return [_untimed(v) for v in doc]
    return doc


def _check(name: str, root: Path, monkeypatch, capsys, seed: int) -> None:
    case = CASES[name]
    reference = _reference(root, name, monkeypatch, capsys)
    out = None if case.out is None else f"{case.out}-interrupted"
    span = None
    if not case.progress:  # how long an uninterrupted run of this command takes here, start-up included
        started = time.monotonic()
        subprocess.run([sys.executable, "-m", "pfl_cli", *case.args, *(["--out", f"{out}-timed"] if out else [])],
                       cwd=root, env=ENV, capture_output=True, check=True)
        span = time.monotonic() - started
    code, err = _interrupt(root, case, out, np.random.default_rng(seed), span)
    said = [line for line in err.splitlines() if line.strip() and not PROGRESS.match(line)]
    assert code == 130 and "Traceback" not in err, f"{name}: exit {code}\n{err}"
    assert len(said) == 1 and said[0].startswith("pflx: error: interrupted"), f"{name}: {err}"
    if out is not None:  # nothing half-written: no artifact, or a whole one (the signal came after the swap)
        assert not (root / out).exists() or (root / out / "manifest.json").is_file()
    again = [*case.args, *(["--out", out] if out else []), "--format", "json"]
    if "--resume" in said[0]:
        again.append("--resume")
    result = _main(root, again, monkeypatch, capsys)
    if out is None:
        assert result == reference
        return
    if name == "tune":  # Ctrl-C in a trial is recorded and that trial run again; between trials or while the
        # artifact is written (an idle machine runs these small trials fast) no trial is left interrupted
        rows = list(csv.DictReader(open(root / out / "trials.csv")))
        stopped = [r for r in rows if r["state"] == "interrupted"]
        assert len(stopped) <= 1 and all(r["error"].endswith("Ctrl-C") for r in stopped), rows
        if stopped and stopped[0]["lr"]:  # it had drawn its config (else Ctrl-C came before its draw): it ran again
            assert stopped[0]["lr"] in [r["lr"] for r in rows if r["state"] == "complete"]
    if not (root / case.out / "manifest.json").is_file():
        assert _files(root / case.out, case.out, case.out) == _files(root / out, out, case.out)
        return
    first, second = _payload(root / case.out), _payload(root / out)
    differ = sorted(f for f in set(first) | set(second) if first.get(f) != second.get(f))
    assert not differ, f"{name}: interrupted and run again, another result in {differ}"


@pytest.mark.parametrize("name", DEFAULT)
def test_ctrl_c_then_the_same_command_gives_the_uninterrupted_result(tree, monkeypatch, capsys, name):
    _check(name, tree, monkeypatch, capsys, seed=0)


@pytest.mark.slow
@pytest.mark.parametrize("name", [n for n in CASES if n not in DEFAULT])
def test_ctrl_c_then_the_same_command_gives_the_uninterrupted_result_every_command(tree, monkeypatch, capsys, name):
    _check(name, tree, monkeypatch, capsys, seed=sorted(CASES).index(name))
