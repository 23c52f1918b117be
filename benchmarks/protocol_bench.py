"""The whole protocol as one spec, stacked against unstacked: ``recipes/compare/ring-table.yaml`` (ten algorithms,
each tuned, then its seeds trained, its new clients predicted, one table) run by ``pflx compare --spec`` twice on
the recipe's own partition: once with the spec's ``stack: 8`` (the default: the seeds of fedavg and fedprox train
as one stack, their studies run ``tune --stack 8``) and once with ``stack: 1`` (every run its own training, as
before). Each is one fresh ``pflx`` process with one torch thread; its CPU time (user + system, ``os.times`` of
the child) is printed, and the ratio stacked / unstacked. Eight of the ten algorithms do not stack and cost the
same in both; the ratio is the table's saving, not the run axis's (``stack_bench.py`` measures that).

Sizes: ``--size smoke`` (the default, for ``make bench``): every study 2 trials of 10 rounds (eval every 5),
seeds [0, 1, 2]; ``--size full``: the recipe as written (4 trials of 40 rounds, three seeds). The partition is
made once by the command in the recipe's header and not counted. ``--only fedavg,fedprox``: those of the recipe's
algorithms alone (the ones that stack: the run axis's share of the table).

    python benchmarks/protocol_bench.py [--size smoke|full] [--only NAME,...] [--keep DIR]
"""

from __future__ import annotations

import argparse
import os
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from verdict import Verdicts

ROOT = Path(__file__).resolve().parents[1]
RECIPE = ROOT / "recipes" / "compare" / "ring-table.yaml"


def _pflx(args: list[str], cwd: Path) -> tuple[float, float]:
    """Run ``pflx ARGS`` in a fresh process (one torch thread); its (CPU seconds, wall seconds)."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
    before = os.times()
    start = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "pfl_cli", *args], cwd=cwd, env=env, capture_output=True,
                          text=True)
    wall = time.perf_counter() - start
    after = os.times()
    if proc.returncode != 0:
        raise SystemExit(f"pflx {' '.join(args)} exited {proc.returncode}: {proc.stderr.strip()[-2000:]}")
    cpu = (after.children_user - before.children_user) + (after.children_system - before.children_system)
    return cpu, wall


def _spec(size: str, part: Path, runs: Path, stack: int, path: Path, only: list[str] | None = None) -> Path:
    """The recipe with its partition and runs here, its stack, and at smoke size its studies scaled down."""
    import yaml

    doc = yaml.safe_load(RECIPE.read_text())
    doc.update(partition=str(part), runs=str(runs), stack=stack)
    if only:
        unknown = sorted(set(only) - set(doc["algorithms"]))
        if unknown:
            raise SystemExit(f"--only {unknown[0]}: not an algorithm of {RECIPE.name} ({', '.join(doc['algorithms'])})")
        doc["algorithms"] = {name: doc["algorithms"][name] for name in only}
    if size == "smoke":
        for entry in doc["algorithms"].values():
            entry["tune"] = {**entry["tune"], "trials": 2, "rounds": 10, "eval_every": 5}
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return path


def protocol(size: str, work: Path, v: Verdicts, only: list[str] | None = None) -> None:
    header = next(ln for ln in RECIPE.read_text().splitlines() if ln.startswith("#   pflx partition"))
    argv = shlex.split(header[len("#   pflx "):])
    argv[argv.index("--out") + 1] = str(work / "part")
    _pflx([*argv, "--format", "quiet"], work)
    what = f" ({'+'.join(only)})" if only else ""
    cpu, tables = {}, {}
    for stack in (1, 8):
        spec = _spec(size, work / "part", work / f"runs-{stack}", stack, work / f"spec-{stack}.yaml", only)
        out = work / f"table-{stack}"
        cpu[stack], wall = _pflx(["compare", "--spec", str(spec), "--out", str(out), "--format", "quiet"], work)
        tables[stack] = (out / "table.csv").read_text()
        label = "stacked (stack: 8)" if stack == 8 else "unstacked (stack: 1)"
        v.note(f"ring-table {size}{what}, {label}: CPU", f"{cpu[stack]:.1f} s (wall {wall:.0f} s)")
    ratio = cpu[8] / cpu[1]
    v.note(f"ring-table {size}{what}: CPU stacked / unstacked", f"{ratio:.2f}")
    v.note("ring-table: the same table.csv stacked and unstacked", "yes" if tables[1] == tables[8] else "no")


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--size", default="smoke", choices=("smoke", "full"))
    ap.add_argument("--only", default=None, help="NAME,...: those of the recipe's algorithms alone")
    ap.add_argument("--keep", type=Path, default=None, help="work in this folder and keep it (default: a temp dir)")
    args = ap.parse_args(argv)
    v = Verdicts()
    print(f"ten-algorithm protocol (recipes/compare/ring-table.yaml), {args.size} size, one thread, "
          f"{os.cpu_count()} cores", flush=True)
    work = args.keep or Path(tempfile.mkdtemp(prefix="pflx-protocol-bench-"))
    work.mkdir(parents=True, exist_ok=True)
    try:
        protocol(args.size, work.resolve(), v, args.only.split(",") if args.only else None)
    finally:
        if args.keep is None:
            shutil.rmtree(work, ignore_errors=True)
    return v.finish()


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
