"""recipes/pefll/shakespeare*.yaml (PeFLL thesis Figs. B.2 / B.3).

The CPU smoke recipe runs as its header gives it in tests/recipes/test_executed_recipes.py (docs tier), which
checks its figure's curves. The GPU recipe needs a GPU and the LEAF Shakespeare data: here
it runs the same chain on the smoke recipe's fixture (its dataset and device overridden, 2 rounds). Both also
resolve in tests/recipes/test_executed_recipes.py.
"""

from __future__ import annotations

import csv
import pathlib
import subprocess
import sys

import pytest

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "docs"))
import executed  # noqa: E402

ROOT = pathlib.Path(__file__).resolve().parents[2]
GPU = ROOT / "recipes" / "pefll" / "shakespeare.yaml"
TINY = ["--set", "rounds=2", "--set", "eval_every=1", "--set", "lstm_hidden=8"]


def header(path: pathlib.Path) -> list[list[str]]:
    """The header's ``pflx ...`` and ``python ...`` commands, in order (tests/docs/executed.py extracts them)."""
    return [c for line in executed.header_lines(path) for c in executed.commands(line) if c[0] in ("pflx", "python")]


def check_figure(figure: pathlib.Path, algorithms: set[str]) -> None:
    with open(figure / "curves.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    assert {r["algorithm"] for r in rows} == algorithms and {r["group"] for r in rows} == {"train", "holdout"}
    assert {int(r["round"]) for r in rows} == {1, 2} and all(0.0 <= float(r["accuracy"]) <= 1.0 for r in rows)
    pefll = sorted(float(r["gigabytes"]) for r in rows if r["algorithm"] == "pefll" and r["group"] == "train")
    fedavg = sorted(float(r["gigabytes"]) for r in rows if r["algorithm"] == "fedavg" and r["group"] == "train")
    assert pefll[1] == pytest.approx(2 * pefll[0]) and pefll[0] > fedavg[0] > 0  # PeFLL sends more per round


@pytest.mark.docs
def test_gpu_recipe_runs_at_smoke_size_on_the_fixture(cli, tmp_path, monkeypatch):
    monkeypatch.chdir(ROOT)
    data = tmp_path / "data"
    assert subprocess.run([sys.executable, "recipes/pefll/shakespeare_fixture.py", "--out", str(data)],
                          cwd=ROOT, capture_output=True).returncode == 0
    extra = {"partition": ["--dataset", f"leaf:{data}?task=shakespeare", "--holdout-clients", "2"],
             "train": [*TINY, "--set", "device=cpu", "--set", "batch_size=8", "--set", "clients_per_round=4",
                       "--set", "lr=0.1"],
             "predict": ["--device", "cpu"]}
    # 2 local steps where the algorithm counts steps (Per-FedAvg counts epochs: one, the recipe's)
    for name in ("pefll", "fedavg"):
        extra[f"train-{name}"] = ["--set", "local_steps=2"]
    done: dict[str, int] = {}
    for cmd in header(GPU):
        args = [str(tmp_path / a) if a.startswith("runs/") else a for a in cmd]
        if args[0] == "python":
            out = subprocess.run([sys.executable, *args[1:]], cwd=ROOT, capture_output=True, text=True)
            assert out.returncode == 0, (args, out.stderr)
        else:
            algorithm = next((a.split("=", 1)[1] for a in args if a.startswith("algorithm=")), "pefll")
            more = extra.get(args[1], []) + (extra.get(f"train-{algorithm}", []) if args[1] == "train" else [])
            if args[1] == "train" and algorithm == "pefll":
                more += ["--set", "hyper_hidden=16", "--set", "descriptor_batch=8"]
            run = cli(*args[1:], *more, "--format", "quiet")
            assert run.code == 0, (" ".join(args), run.err)
        done[cmd[1]] = done.get(cmd[1], 0) + 1
    assert done["train"] == 4 and done["predict"] == 2
    check_figure(tmp_path / "runs" / "shk-figure", {"pefll", "fedavg", "fedrep", "perfedavg"})
