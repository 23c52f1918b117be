"""Run every benchmark script in this folder (`make bench`); exit 1 when any of them missed a target.

Each ``*_bench.py``, ``startup.py`` (how long commands take to start) and ``peers.py`` (pflx against
pfl-research) runs in its own process (no state or memory carried between them), prints each figure
beside its target, and exits non-zero on a miss or a crash. ``peers.py`` runs under
``.venv-bench/bin/python`` when that virtual environment exists (the ``bench`` extra's peers pin
packages pflx's own environment cannot share; docs/performance/peers.md), and prints a skip notice
where no peer is installed.

    python benchmarks/run.py [NAME ...]    # e.g. python benchmarks/run.py mdm train startup peers
"""

from __future__ import annotations

import os
import pathlib
import subprocess
import sys
import time

HERE = pathlib.Path(__file__).resolve().parent
BENCH_PYTHON = HERE.parent / ".venv-bench" / "bin" / "python"


def _name(script: pathlib.Path) -> str:
    return script.name.removesuffix(".py").removesuffix("_bench")


def _python(script: pathlib.Path) -> str:
    return str(BENCH_PYTHON) if script.name == "peers.py" and BENCH_PYTHON.exists() else sys.executable


def main(argv: list[str]) -> int:
    every = [*sorted(HERE.glob("*_bench.py")), HERE / "startup.py", HERE / "peers.py"]
    scripts = [s for s in every if _name(s) in argv] if argv else every
    if not scripts:
        print(f"no benchmark matches {argv}; have {[_name(s) for s in every]}")
        return 2
    env = {"OMP_NUM_THREADS": "1", **os.environ}
    failed = []
    for script in scripts:
        print(f"\n== {script.name}", flush=True)
        start = time.perf_counter()
        code = subprocess.run([_python(script), str(script)], env=env).returncode
        print(f"== {script.name}: {'ok' if code == 0 else f'exit {code}'} ({time.perf_counter() - start:.0f} s)",
              flush=True)
        if code != 0:
            failed.append(script.name)
    print(f"\n{len(scripts) - len(failed)} of {len(scripts)} benchmarks met every target"
          + (f"; missed or failed: {', '.join(failed)}" if failed else ""))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
