"""The MDM hyperparameter-study recipe end to end on a tiny grid (slow tier)."""

import csv
import json
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "recipes" / "mdm" / "hp-tuning"))


@pytest.mark.slow
@pytest.mark.parametrize("source", ["digits", "leaf-fixture"])
def test_hp_study_writes_results_summary_and_plot(tmp_path, source, capsys):
    import hp_tuning

    recipe = yaml.safe_load((ROOT / "recipes" / "mdm" / "hp-tuning" / "hp-tuning.yaml").read_text())
    recipe["train"]["rounds"] = recipe["train"]["eval_every"] = 4
    recipe["grid"] = {"lr": [0.05], "local_epochs": [1], "batch_size": [10, 25]}
    small = tmp_path / "hp.yaml"
    small.write_text("# tiny grid\n" + yaml.safe_dump(recipe))
    assert hp_tuning.main(["--out", str(tmp_path / "out"), "--source", source, "--recipe", str(small)]) == 0
    out = tmp_path / "out"
    rows = list(csv.DictReader(open(out / "results.csv")))
    assert len(rows) == 2 * 4 and {r["source"] for r in rows} == {"true", "mdm", "iid", "conditional-iid"}
    acc = {(r["setting"], r["source"]): float(r["accuracy"]) for r in rows}
    summary = json.loads((out / "summary.json").read_text())
    for mode in ("mdm", "iid", "conditional-iid"):
        expected = sum(abs(acc[(s, mode)] - acc[(s, "true")]) for s in ("0", "1")) / 2
        assert summary["modes"][mode]["mean_abs_diff"] == pytest.approx(expected)
    assert (out / "hp.png").stat().st_size > 10_000
    printed = capsys.readouterr().out
    assert "| mdm |" in printed and "1.6" in printed and "6.6" in printed
    # every number comes from artifacts: the scored predict runs are on the true clients
    scored = json.loads((out / "runs" / "mdm-0-on-true" / "metrics.json").read_text())
    assert scored["pooled_accuracy_nolm"] == pytest.approx(acc[("0", "mdm")])
