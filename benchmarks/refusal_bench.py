"""Benchmark: what a refused command, and one whose --out is up to date, costs (issue 49, finding 20).

A refusal (a misspelt algorithm, a missing input, a bad value) and an "up to date" answer do no
work, so they must not pay for the work's imports: ``import torch`` alone is ~2.5-3 CPU s. Every
command is measured here, each in a fresh process, and its CPU time (user + system of the child:
a loaded machine inflates it far less than wall time) is checked against 0.5 s.

Each command runs once untimed first, with bytecode writing on (an installed package has its
``.pyc`` files); the figure is the best of ``--repeats`` runs. The artifacts the "up to date"
cases read are made first, not timed (a few tiny trainings: about a minute of CPU).

    python benchmarks/refusal_bench.py [--repeats N] [--only TEXT]

``--only TEXT`` (repeatable) times the cases whose label holds one of the TEXTs (e.g. ``--only "train --seeds"``);
the artifacts they read are still made first.
"""

from __future__ import annotations

import argparse
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from verdict import Verdicts

ROOT = Path(__file__).resolve().parents[1]
TARGET = 0.5  # CPU seconds
TINY = ("--rounds", "1", "--local-steps", "1", "--eval-every", "1")


def _env() -> dict:
    path = os.environ.get("PYTHONPATH")
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT) + (os.pathsep + path if path else "")}
    env.pop("PYTHONDONTWRITEBYTECODE", None)  # time what an installed package does: load bytecode
    return env


def pflx(*args) -> list[str]:
    return [sys.executable, "-m", "pfl_cli", *map(str, args), "--format", "quiet"]


def _run(argv: list[str], code: int) -> tuple[float, float]:
    """Wall and CPU seconds of one fresh process running ``argv``, which must exit ``code``."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    proc = subprocess.run(argv, env=_env(), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    elapsed = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if proc.returncode != code:
        raise SystemExit(f"{' '.join(map(str, argv))} exited {proc.returncode}, not {code}: {proc.stderr.strip()}")
    return elapsed, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def cold(argv: list[str], code: int, repeats: int) -> tuple[float, float]:
    _run(argv, code)
    runs = [_run(argv, code) for _ in range(repeats)]
    return min(w for w, _ in runs), min(c for _, c in runs)


def cases(w: Path) -> list[tuple[str, list[str], int]]:
    part, nope = w / "part", w / "nope"
    train = ["train", "--partition", part, "--algorithm", "fedavg", *TINY, "--out", w / "fedavg"]
    return [
        ("partition: bad --dirichlet", ["partition", "--dataset", "builtin:digits", "--dirichlet", "-1", "-n", "8",
                                        "--out", w / "x"], 2),
        ("partition: up to date", ["partition", "--dataset", "builtin:digits", "--dirichlet", "0.5", "-n", "8",
                                   "--holdout-clients", "2", "--out", part], 0),
        ("mdm-fit: bad --components", ["mdm-fit", "--partition", part, "--components", "-1", "--out", w / "x"], 2),
        ("mdm-fit: up to date", ["mdm-fit", "--partition", part, "--components", "1", "--out", w / "mdm"], 0),
        ("simulate: missing --model", ["simulate", "--model", nope, "--dataset", "builtin:digits",
                                       "--num-clients", "4", "--out", w / "x"], 2),
        ("train: misspelt --algorithm", ["train", "--partition", part, "--algorithm", "fedavgg", "--out", w / "x"], 2),
        ("train: missing --partition", ["train", "--partition", nope, "--algorithm", "fedavg", "--out", w / "x"], 2),
        ("train: bad --lr", ["train", "--partition", part, "--algorithm", "fedavg", "--lr", "abc", "--out", w / "x"],
         2),
        ("train: unknown --set key", ["train", "--partition", part, "--algorithm", "scaffold", "--set", "alpha=2",
                                      "--out", w / "x"], 2),
        ("train: up to date", train, 0),
        ("train --seeds: up to date", ["train", "--partition", part, "--algorithm", "fedavg", *TINY, "--seeds", "0,1",
                                       "--out", w / "stack"], 0),
        ("tune: misspelt --algorithm", ["tune", "--partition", part, "--algorithm", "fedavgg", "--trials", "2",
                                        "--out", w / "x"], 2),
        ("tune: up to date", ["tune", "--partition", part, "--algorithm", "fedavg", "--trials", "2",
                              "--set", "rounds=1", "--set", "local_steps=1", "--set", "eval_every=1",
                              "--out", w / "tune"], 0),
        ("predict: missing --model", ["predict", "--model", nope, "--partition", part, "--out", w / "x"], 2),
        ("predict: up to date", ["predict", "--model", w / "fedavg", "--partition", part, "--clients", "holdout",
                                 "--out", w / "pred"], 0),
        ("attack: missing --model", ["attack", "--model", nope, "--partition", part, "--out", w / "x"], 2),
        ("cluster: missing --partition", ["cluster", "--partition", nope, "--k", "2", "--out", w / "x"], 2),
        ("cluster: bad --k", ["cluster", "--partition", part, "--server-data", "builtin:digits", "--k", "0", "--no-dp",
                              "--out", w / "x"], 2),
        ("cluster: up to date", ["cluster", "--partition", part, "--server-data", "builtin:digits", "--k", "2",
                                 "--no-dp", "--out", w / "km"], 0),
        ("show: missing artifact", ["show", nope], 2),
        ("compare: missing run", ["compare", nope, "--out", w / "x"], 2),
        ("compare: up to date", ["compare", w / "stack" / "seed-0", w / "stack" / "seed-1", "--out", w / "table"], 0),
        ("algorithms: misspelt name", ["algorithms", "fedavgg"], 2),
        ("privacy-account: bad --delta", ["privacy-account", "--noise-multiplier", "1.1", "--sampling-rate", "0.01",
                                          "--steps", "10", "--delta", "2"], 2),
    ]


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--only", action="append", default=[], metavar="TEXT",
                        help="time only the cases whose label holds TEXT (repeatable)")
    args = parser.parse_args(argv)
    v = Verdicts()
    with tempfile.TemporaryDirectory() as tmp:
        w = Path(tmp)
        todo = cases(w)
        # The artifacts the "up to date" cases find (made first, not timed): the cases' own commands.
        for label, command, code in todo:
            if label.endswith("up to date"):
                subprocess.run(pflx(*command), env=_env(), check=True)
        if args.only:
            todo = [case for case in todo if any(text in case[0] for text in args.only)]
            if not todo:
                raise SystemExit(f"--only {args.only}: no case's label holds it")
        v.note("load average (1, 5, 15 min)", " ".join(f"{x:.2f}" for x in os.getloadavg()))
        floor_wall, floor_cpu = cold([sys.executable, "-c", "import numpy"], 0, args.repeats)
        v.note("floor: python -c 'import numpy'", f"{floor_wall:.3f} s (cpu {floor_cpu:.3f} s)")
        for label, command, code in todo:
            secs, cpu = cold(pflx(*command), code, args.repeats)
            v.check(label, f"cpu {cpu:.2f} s ({secs:.2f} s)", f"cpu <= {TARGET} s", cpu <= TARGET)
    return v.finish()


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
