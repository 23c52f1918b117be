"""Benchmark: how long a command takes to start (issue 24, "fast start").

Each figure is the best of a few cold processes (a fresh interpreter per run), printed in seconds
and as a ratio to a floor measured in this same run, so a loaded machine moves figure and floor
together:

- ``pflx --help`` and ``pflx show PART``: <= 3x ``python -c "import numpy"``;
- a ``privacy-account`` query: <= 1.3x ``python -c "import dp_accounting"`` (its scipy import is
  most of the query);
- ``predict`` of 10 builtin:digits clients with a PeFLL model (no optimizer step): < 3 s.

Each command runs once untimed first, with bytecode writing on: an installed package has its
``.pyc`` files, and with ``PYTHONDONTWRITEBYTECODE`` set every run would time the compiler on
pflx's own modules (~0.15 s) but not on numpy's. Beside each wall time is the process's CPU time
(user + system), which a loaded machine inflates far less: the load average is printed first.

    python benchmarks/startup.py [--repeats N]
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
ACCOUNT = ["privacy-account", "--noise-multiplier", "1.1", "--sampling-rate", "0.01", "--steps", "1000",
           "--delta", "1e-5"]


def _env() -> dict:
    path = os.environ.get("PYTHONPATH")
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT) + (os.pathsep + path if path else "")}
    env.pop("PYTHONDONTWRITEBYTECODE", None)  # time what an installed package does: load bytecode
    return env


def _run(argv: list[str]) -> tuple[float, float]:
    """Wall and CPU seconds (user + system of the child) of one fresh process running ``argv``."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    proc = subprocess.run(argv, env=_env(), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    elapsed = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(map(str, argv))} failed: {proc.stderr.strip()}")
    return elapsed, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def cold(argv: list[str], repeats: int) -> tuple[float, float]:
    """Best wall time of ``repeats`` fresh processes running ``argv`` (each must exit 0), after one
    untimed run that writes the bytecode; and the best CPU time."""
    _run(argv)
    runs = [_run(argv) for _ in range(repeats)]
    return min(w for w, _ in runs), min(c for _, c in runs)


def pflx(*args) -> list[str]:
    return [sys.executable, "-m", "pfl_cli", *map(str, args)]


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args(argv)
    v = Verdicts()
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        # Artifacts the timed commands read (made first, not timed): 40 train + 10 holdout clients.
        subprocess.run(pflx("partition", "--dataset", "builtin:digits", "--dirichlet", "0.3", "-n", "50",
                            "--holdout-clients", "10", "--out", work / "part", "--format", "quiet"),
                       env=_env(), check=True)
        subprocess.run(pflx("train", "--partition", work / "part", "--algorithm", "pefll", "--rounds", "2",
                            "--out", work / "pefll", "--format", "quiet"), env=_env(), check=True)
        v.note("load average (1, 5, 15 min)", " ".join(f"{x:.2f}" for x in os.getloadavg()))
        numpy_floor, numpy_cpu = cold([sys.executable, "-c", "import numpy"], args.repeats)
        dp_floor, dp_cpu = cold([sys.executable, "-c", "import dp_accounting"], args.repeats)
        v.note("floor: python -c 'import numpy'", f"{numpy_floor:.3f} s (cpu {numpy_cpu:.3f} s)")
        v.note("floor: python -c 'import dp_accounting'", f"{dp_floor:.3f} s (cpu {dp_cpu:.3f} s)")
        for label, command in (("pflx --help", pflx("--help")),
                               ("pflx show PART", pflx("show", work / "part"))):
            secs, cpu = cold(command, args.repeats)
            v.check(label, f"{secs / numpy_floor:.2f}x ({secs:.3f} s; cpu {cpu / numpy_cpu:.2f}x)", "<= 3x numpy",
                    secs <= 3 * numpy_floor)
        secs, cpu = cold(pflx(*ACCOUNT), args.repeats)
        v.check("privacy-account query (RDP)", f"{secs / dp_floor:.2f}x ({secs:.3f} s; cpu {cpu / dp_cpu:.2f}x)",
                "<= 1.3x dp_accounting", secs <= 1.3 * dp_floor)
        secs, cpu = cold(pflx("predict", "--model", work / "pefll", "--partition", work / "part", "--clients",
                              "holdout", "--out", work / "pred", "--force", "--format", "quiet"), args.repeats)
        v.check("predict, 10 digits clients (pefll)", f"{secs:.3f} s (cpu {cpu:.3f} s)", "< 3 s", secs < 3)
    return v.finish()


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
