"""recipes/quickstart/demo.sh and demo_tables.py: one `pflx compare --spec` trains every method with seeds 0, 1, 2
and compares them; the table is `pflx compare`'s (mean ± 95 % interval over seeds, fairness), unmasked, masking
only in its own column, and its sentence quotes the table's means."""

import json
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


def test_the_table_is_compares_over_seeds_and_the_sentence_quotes_its_means(tmp_path):
    ring = {"pefll": {"train": _seeds(0.75, 0.75, 0.75), "new": _seeds(0.70, 0.72, 0.74)},
            "pfedhn": {"train": _seeds(0.69, 0.69, 0.69), "new": _seeds(0.33, 0.33, 0.33)},
            "fedavg": {"train": _seeds(0.33, 0.33, 0.33), "new": _seeds(0.31, 0.31, 0.31)},
            "local": {"train": _seeds(0.70, 0.70, 0.70), "new": _seeds(0.64, 0.64, 0.64)}}
    _table(tmp_path, "ring", ring)
    out = subprocess.run([sys.executable, str(SCRIPT), str(tmp_path)], check=True, capture_output=True,
                         text=True).stdout
    rows = {tuple(c.strip() for c in line.split("|")[1:3]): [c.strip() for c in line.split("|")[3:-1]]
            for line in out.splitlines() if line.startswith("| ") and "---" not in line}
    # PeFLL new clients: seed means 0.70, 0.72, 0.74 -> 72.0 ± t(.975, 2) * 0.02 / sqrt(3) = 5.0 points; two
    # clients at mean ± 10 points: std 10.0, worst 10 % (1 client) and min 62.0 on average over seeds.
    half = 100 * T_975_2 * 0.02 / np.sqrt(3)
    assert rows["pefll", "new"] == ["3", f"72.0 ± {half:.1f}", "10.0", "62.0", "62.0", f"82.0 ± {half:.1f}"]
    assert rows["fedavg", "train"] == ["3", "33.0 ± 0.0", "10.0", "23.0", "23.0", "43.0 ± 0.0"]
    header = next(line for line in out.splitlines() if line.startswith("| algorithm"))
    assert "accuracy % (mean ± 95 % CI)" in header and "label-masked accuracy % (mean ± 95 % CI)" in header
    assert "std across clients" in header and "worst 10 %" in header and "| min |" in header
    # the table is compare's table.md (its legend left out), then one sentence: the README's form
    table, sentence = out.rstrip("\n").split("\n\n")
    assert table == compare(_groups(ring)).markdown().split("\n\n", 1)[0]
    # PeFLL new 72.0 vs FedAvg new 31.0; pFedHN train 69.0 vs FedAvg train 33.0; pFedHN new 33.0
    assert (f"PeFLL's new clients (72.0% ± {half:.1f}) and pFedHN's training clients (69.0% ± 0.0) are +41.0 "
            "points and +36.0 points from FedAvg's single model (31.0% ± 0.0 / 33.0% ± 0.0") in sentence
    assert "mean over 3 seeds" in sentence
    assert sentence.endswith("which only train a fresh embedding, are +2.0 points from it (33.0% ± 0.0).")


def test_the_demo_trains_seeds_0_1_2_of_every_method_in_one_spec_and_checks_the_readme_table():
    text = DEMO.read_text()
    spec = text[text.index("<<SPEC"):text.index("\nSPEC\n")]
    assert "seeds: [0, 1, 2]" in spec
    for m in METHODS:
        assert f"  {m}:" in spec, m
    # every run's new clients are predicted (a spec's new_clients default), the table compared with the README's
    assert "new_clients" not in spec
    assert 'compare --spec "$root/ring-spec.yaml"' in text
    assert "cmp -s \"$root/demo-table.md\" recipes/quickstart/expected-table.md" in text
    # progress stays on: no --format quiet on the spec's command (its lines every 10 s are the heartbeat)
    line = next(ln for ln in text.splitlines() if "compare --spec" in ln and not ln.lstrip().startswith(("#", "echo")))
    assert "quiet" not in line
