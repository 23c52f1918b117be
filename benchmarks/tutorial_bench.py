"""Benchmark: a tutorial run as written, in a fresh shell, with torch's threads left to pflx and with one thread.

pflx chooses torch's CPU threads itself (:mod:`pfl_cli.fl.threads`), so a user who never heard of
``OMP_NUM_THREADS`` should get the speed of the one-thread setting. This runs every ``bash`` block of a
docs page, in order, as one script in an empty directory, from an environment that holds only ``PATH``,
``HOME`` and ``LANG`` (no ``OMP_NUM_THREADS``, ``MKL_NUM_THREADS`` or ``PFLX_THREADS``: a fresh shell), and
again with ``OMP_NUM_THREADS=1`` added. It prints the wall and CPU time of each and the load average, and
exits 1 when the run without the variable takes more than 1.2x the wall time of the run with it.

    python benchmarks/tutorial_bench.py [--page docs/tutorials/tune-then-compare.md] [--order unset,one]

A busy machine slows both runs; start it on an otherwise idle one and read the load printed beside
each figure. ``--smoke`` shrinks the page's budgets (``--trials``, ``--rounds``, ``trials:``, ``rounds:``)
so that the benchmark itself can be tested in seconds; its ratio is then no verdict.
"""

from __future__ import annotations

import argparse
import os
import re
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

TARGET = 1.2
ROOT = Path(__file__).resolve().parents[1]
FENCE = re.compile(r"^```bash\n(.*?)^```", re.S | re.M)


def page_script(page: Path, smoke: bool) -> str:
    """Every ``bash`` block of ``page``, in order, as one script that stops at the first failing line."""
    code = "\n".join(m.group(1) for m in FENCE.finditer(page.read_text()))
    if smoke:
        code = re.sub(r"--trials \d+", "--trials 1", code)
        code = re.sub(r"--rounds \d+", "--rounds 2", code)
        code = re.sub(r"--eval-every \d+", "--eval-every 1", code)
        code = re.sub(r"trials: \d+", "trials: 1", code)
        code = re.sub(r"rounds: \d+", "rounds: 2", code)
        code = re.sub(r"eval_every: \d+", "eval_every: 1", code)
    return "set -euo pipefail\n" + code


def fresh_env(threads: str | None) -> dict[str, str]:
    """A new login's environment: PATH (with pflx on it), HOME, LANG; ``OMP_NUM_THREADS`` only when given."""
    bindir = str(Path(sys.executable).parent)
    env = {"PATH": f"{bindir}:/usr/local/bin:/usr/bin:/bin", "HOME": os.environ.get("HOME", "/tmp"),
           "LANG": "C.UTF-8"}
    if threads is not None:
        env["OMP_NUM_THREADS"] = threads
    return env


def timed_run(script: str, threads: str | None) -> tuple[float, float, float]:
    """(wall s, CPU s of the script and its children, load average at the start) of one run in a new directory."""
    work = Path(tempfile.mkdtemp(prefix="pflx-tutorial-"))
    try:
        load = os.getloadavg()[0]
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        start = time.perf_counter()
        proc = subprocess.run(["bash", "-c", script], cwd=work, env=fresh_env(threads), capture_output=True,
                              text=True)
        wall = time.perf_counter() - start
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        if proc.returncode != 0:
            sys.exit(f"tutorial_bench.py: the page failed (OMP_NUM_THREADS={threads or 'unset'}, rc "
                     f"{proc.returncode}): {proc.stderr.strip()[-2000:]}")
        cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
        return wall, cpu, load
    finally:
        shutil.rmtree(work, ignore_errors=True)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--page", default=str(ROOT / "docs" / "tutorials" / "tune-then-compare.md"))
    ap.add_argument("--order", default="unset,one", help="the two runs' order: unset,one or one,unset")
    ap.add_argument("--smoke", action="store_true", help="shrink the page's budgets (tests the benchmark; no verdict)")
    args = ap.parse_args(argv)
    order = args.order.split(",")
    if sorted(order) != ["one", "unset"]:
        ap.error(f"--order must be unset,one or one,unset; got {args.order}")
    script = page_script(Path(args.page), args.smoke)
    results = {}
    for name in order:
        results[name] = timed_run(script, None if name == "unset" else "1")
        wall, cpu, load = results[name]
        label = "OMP_NUM_THREADS unset" if name == "unset" else "OMP_NUM_THREADS=1  "
        print(f"{label}: wall {wall:7.1f} s, CPU {cpu:7.1f} s, load at start {load:.1f}", flush=True)
    ratio = results["unset"][0] / results["one"][0]
    verdict = "no verdict (--smoke)" if args.smoke else ("met" if ratio <= TARGET else "MISSED")
    print(f"{Path(args.page).name}: wall unset / one thread = {ratio:.2f}x (target <= {TARGET}x): {verdict}")
    return 1 if (not args.smoke and ratio > TARGET) else 0


if __name__ == "__main__":
    sys.exit(main())
