"""Run every benchmark script in this folder (`make bench`); exit 1 when any of them missed a target.

Each ``*_bench.py`` runs in its own process (no state or memory carried between them),
prints each figure beside its target, and exits non-zero on a miss or a crash.

    python benchmarks/run.py [NAME ...]    # e.g. python benchmarks/run.py mdm train
"""

from __future__ import annotations

import os
import pathlib
import subprocess
import sys
import time

HERE = pathlib.Path(__file__).resolve().parent


def main(argv: list[str]) -> int:
    scripts = sorted(HERE.glob("*_bench.py"))
    if argv:
        scripts = [s for s in scripts if s.name.removesuffix("_bench.py") in argv]
    if not scripts:
        print(f"no benchmark matches {argv}; have {[s.name for s in sorted(HERE.glob('*_bench.py'))]}")
        return 2
    env = {"OMP_NUM_THREADS": "1", **os.environ}
    failed = []
    for script in scripts:
        print(f"\n== {script.name}", flush=True)
        start = time.perf_counter()
        code = subprocess.run([sys.executable, str(script)], env=env).returncode
        print(f"== {script.name}: {'ok' if code == 0 else f'exit {code}'} ({time.perf_counter() - start:.0f} s)",
              flush=True)
        if code != 0:
            failed.append(script.name)
    print(f"\n{len(scripts) - len(failed)} of {len(scripts)} benchmarks met every target"
          + (f"; missed or failed: {', '.join(failed)}" if failed else ""))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
