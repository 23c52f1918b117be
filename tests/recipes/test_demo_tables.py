"""recipes/quickstart/demo.sh and demo_tables.py: seeds run at once and a failed seed fails the demo; the tables
are `pflx compare`'s (mean ± 95 % interval over seeds, fairness), unmasked, masking only in its own column."""

import json
import re
import subprocess
import sys
from pathlib import Path

import numpy as np

from pfl_cli.compare.runs import ClientGroup
from pfl_cli.compare.table import compare

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "recipes" / "quickstart" / "demo_tables.py"
DEMO = ROOT / "recipes" / "quickstart" / "demo.sh"
METHODS = ("pefll", "pfedhn", "fedavg", "local")
T_975_2 = 4.302652729911275  # Student-t quantile t(0.975, 2 degrees of freedom): 3 seeds


def _groups(numbers: dict) -> list[ClientGroup]:
    """numbers: method -> group -> per-seed per-client accuracies (unmasked); masked = unmasked + 0.1."""
    out = []
    for m, by_group in numbers.items():
        for group, per_seed in by_group.items():
            for seed, acc in enumerate(per_seed):
                acc = np.asarray(acc, dtype=np.float64)
                out.append(ClientGroup(path=f"{m}-s{seed}", stage="train" if group == "train" else "predict",
                                       group=group, source="train" if group == "train" else "predict",
                                       algorithm=m, config={"algorithm": m}, seed=seed,
                                       client_id=np.arange(acc.size), accuracy=acc, accuracy_lm=acc + 0.1,
                                       predict_config={} if group == "new" else None))
    return out


def _table(root: Path, task: str, numbers: dict) -> None:
    """What `pflx compare` writes for table.md and table.json, from the same functions."""
    table = compare(_groups(numbers))
    (root / f"{task}-table").mkdir(parents=True)
    (root / f"{task}-table" / "table.md").write_text(table.markdown())
    (root / f"{task}-table" / "table.json").write_text(json.dumps(table.document()))


def _seeds(*means):
    """Per seed, two clients at mean - 0.1 and mean + 0.1."""
    return [[m - 0.1, m + 0.1] for m in means]


def test_tables_are_compares_over_seeds_and_the_captions_quote_their_means(tmp_path):
    ring = {"pefll": {"train": _seeds(0.75, 0.75, 0.75), "new": _seeds(0.70, 0.72, 0.74)},
            "pfedhn": {"train": _seeds(0.69, 0.69, 0.69), "new": _seeds(0.33, 0.33, 0.33)},
            "fedavg": {"train": _seeds(0.33, 0.33, 0.33), "new": _seeds(0.31, 0.31, 0.31)},
            "local": {"train": _seeds(0.70, 0.70, 0.70), "new": _seeds(0.64, 0.64, 0.64)}}
    digits = {m: {"train": _seeds(0.9, 0.9, 0.9), "new": _seeds(*[0.85 + 0.01 * i] * 3)} for i, m in enumerate(METHODS)}
    _table(tmp_path, "ring", ring)
    _table(tmp_path, "digits", digits)
    out = subprocess.run([sys.executable, str(SCRIPT), str(tmp_path)], check=True, capture_output=True,
                         text=True).stdout
    ring_part = out[out.index("ring:"):]
    rows = {tuple(c.strip() for c in line.split("|")[1:3]): [c.strip() for c in line.split("|")[3:-1]]
            for line in ring_part.splitlines() if line.startswith("| ") and "---" not in line}
    # PeFLL new clients: seed means 0.70, 0.72, 0.74 -> 72.0 ± t(.975, 2) * 0.02 / sqrt(3) = 5.0 points; two
    # clients at mean ± 10 points: std 10.0, worst 10 % (1 client) and min 62.0 on average over seeds.
    half = 100 * T_975_2 * 0.02 / np.sqrt(3)
    assert rows["pefll", "new"] == ["3", f"72.0 ± {half:.1f}", "10.0", "62.0", "62.0", f"82.0 ± {half:.1f}"]
    assert rows["fedavg", "train"] == ["3", "33.0 ± 0.0", "10.0", "23.0", "23.0", "43.0 ± 0.0"]
    header = next(line for line in ring_part.splitlines() if line.startswith("| algorithm"))
    assert "accuracy % (mean ± 95 % CI)" in header and "label-masked accuracy % (mean ± 95 % CI)" in header
    assert "std across clients" in header and "worst 10 %" in header and "| min |" in header
    # PeFLL new 72.0 vs FedAvg new 31.0; pFedHN train 69.0 vs FedAvg train 33.0; pFedHN new 33.0
    assert (f"PeFLL's new clients (72.0% ± {half:.1f}) and pFedHN's training clients (69.0% ± 0.0) are +41.0 "
            "points and +36.0 points from FedAvg's single model (31.0% ± 0.0 / 33.0% ± 0.0") in ring_part
    assert "mean over 3 seeds" in ring_part
    assert "which only train a fresh embedding, are +2.0 points from it (33.0% ± 0.0)." in ring_part
    assert "spans 3.0 points (best: Local)" in out[:out.index("ring:")]
    assert out.rstrip().endswith(compare(_groups(ring)).markdown().split("\n\n", 1)[1].strip())


def _each_seed() -> str:
    """demo.sh's each_seed function, as written there."""
    match = re.search(r"^each_seed\(\) \{.*?^\}$", DEMO.read_text(), flags=re.S | re.M)
    assert match, "demo.sh has no each_seed function"
    return match.group(0)


def test_a_failing_seed_fails_the_demo_after_the_others_ran(tmp_path):
    script = tmp_path / "t.sh"
    script.write_text("set -euo pipefail\nroot=$1\nseeds=(0 1 2)\n" + _each_seed() + "\n"
                      'job() { echo "start $1"; [ "$1" != 1 ]; echo "end $1"; touch "$root/done-$1"; }\n'
                      "each_seed t job\necho after\n")
    run = subprocess.run(["bash", str(script), str(tmp_path)], capture_output=True, text=True)
    assert run.returncode != 0 and "after" not in run.stdout
    # the failed seed stopped at its failing command and its log is shown; the other seeds finished
    assert "seed 1 failed" in run.stderr and "start 1" in run.stderr and "end 1" not in run.stderr
    assert sorted(p.name for p in tmp_path.glob("done-*")) == ["done-0", "done-2"]
    script.write_text(script.read_text().replace('[ "$1" != 1 ]', "true"))
    run = subprocess.run(["bash", str(script), str(tmp_path)], capture_output=True, text=True)
    assert run.returncode == 0 and run.stdout == "after\n", run.stderr


def test_the_demo_runs_seeds_0_1_2_of_every_method_and_compares_them():
    text = DEMO.read_text()
    assert "seeds=(0 1 2)" in text and "methods=(pefll pfedhn fedavg local)" in text
    assert "each_seed digits digits_seed" in text and "each_seed ring ring_seed" in text
    assert "compare digits" in text and "compare ring" in text
    # new clients from predict --clients holdout, unmasked headline (both numbers are in every predict artifact)
    assert "--clients holdout" in text and "--no-label-mask" in text
