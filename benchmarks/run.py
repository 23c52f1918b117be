"""Run every benchmark script in this folder (`make bench`); each prints its own ratios and targets."""

from __future__ import annotations

import pathlib
import runpy
import sys

HERE = pathlib.Path(__file__).resolve().parent


def main() -> int:
    scripts = sorted(p for p in HERE.glob("*_bench.py"))
    for script in scripts:
        print(f"\n== {script.name}", flush=True)
        runpy.run_path(str(script), run_name="__main__")
    return 0 if scripts else 1


if __name__ == "__main__":
    sys.exit(main())
