"""The comparison recipe end to end (slow tier): make -> train/predict artifacts over seeds -> `pflx compare`'s
table and table.py's extras; a rerun does nothing. Its smoke size (the Makefile header's ROUNDS=2 line) runs in
tests/recipes/test_executed_recipes.py."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
COMPARE = ROOT / "recipes" / "compare"


def make(out, recipe, algorithms, *extra):
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    cmd = ["make", "-s", "-C", str(COMPARE), f"RECIPE={recipe}", f"OUT={out}", f"ALGORITHMS={algorithms}",
           f"PFLX={sys.executable} -m pfl_cli", f"PYTHON={sys.executable}", *extra]
    return subprocess.run(cmd, env=env, check=True, capture_output=True, text=True).stdout


def table(out, algorithms, recipe, seed=0):
    text = subprocess.run([sys.executable, str(COMPARE / "table.py"), "--runs", str(out), "--seed", str(seed),
                           "--recipe", str(recipe), "--algorithms", algorithms, "--json"], check=True,
                          capture_output=True, text=True).stdout
    return json.loads(text)


@pytest.mark.slow
@pytest.mark.parametrize("recipe,algorithms", [
    ("digits.yaml", "fedavg local pefll fedprox fedper fedrep lg-fedavg ditto apfl perfedavg pfedme knnper"),
    ("ring.yaml", "fedavg fedrep knnper"),
])
def test_compare_recipe_on_cpu(tmp_path, recipe, algorithms):
    out = tmp_path / "cmp"
    printed = make(out, recipe, algorithms)
    names = algorithms.split()
    for name in names:
        assert f"| {name} | train | 3 |" in printed and f"| {name} | new | 3 |" in printed
        for seed in (0, 1, 2):
            assert (out / name / f"seed-{seed}" / "manifest.json").is_file()
            assert (out / name / f"seed-{seed}-new" / "manifest.json").is_file()
    doc = table(out, algorithms, COMPARE / recipe)
    rows = {r["algorithm"]: r for r in doc["rows"]}
    assert set(rows) == set(names)
    for r in rows.values():
        assert 0.0 <= r["train"] <= 1.0 and 0.0 <= r["new_lm"] <= 1.0
    if recipe == "ring.yaml":
        assert rows["fedrep"]["train"] > rows["fedavg"]["train"] + 0.1
    else:
        assert rows["local"]["floats_per_client_round"] == 0
        assert rows["fedrep"]["floats_per_client_round"] < rows["fedavg"]["floats_per_client_round"]
    stamp = (out / names[0] / "seed-0" / "manifest.json").stat().st_mtime_ns
    make(out, recipe, algorithms)  # up to date: nothing reruns
    assert (out / names[0] / "seed-0" / "manifest.json").stat().st_mtime_ns == stamp
    # one algorithm more: only it trains
    if recipe == "ring.yaml":
        make(out, recipe, algorithms + " ditto")
        assert (out / names[0] / "seed-0" / "manifest.json").stat().st_mtime_ns == stamp
        assert (out / "ditto" / "seed-2" / "manifest.json").is_file()
