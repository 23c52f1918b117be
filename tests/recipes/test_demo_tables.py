"""recipes/quickstart/demo_tables.py: the demo's tables read the unmasked metrics, masking only in its own column."""

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "recipes" / "quickstart" / "demo_tables.py"
METHODS = ("pefll", "pfedhn", "fedavg", "local")


def _write(path: Path, doc: dict) -> None:
    path.mkdir(parents=True)
    (path / "metrics.json").write_text(json.dumps(doc))


def _runs(root: Path, prefix: str, numbers: dict) -> None:
    """numbers: method -> (new unmasked, new masked, train unmasked, train masked)."""
    for m, (new, new_lm, train, train_lm) in numbers.items():
        _write(root / f"{prefix}{m}", {"train": {"mean_accuracy": train, "mean_accuracy_lm": train_lm}})
        # predict writes both numbers in either mode; the table must pick the one its column names
        _write(root / f"{prefix}{m}-holdout", {"mean_accuracy": new, "mean_accuracy_lm": new_lm})
        _write(root / f"{prefix}{m}-holdout-lm", {"mean_accuracy": new, "mean_accuracy_lm": new_lm})


def test_tables_show_unmasked_new_and_training_clients_and_caption_the_gaps(tmp_path):
    ring = {"pefll": (0.72, 0.80, 0.75, 0.81), "pfedhn": (0.33, 0.79, 0.69, 0.80),
            "fedavg": (0.31, 0.78, 0.33, 0.79), "local": (0.64, 0.74, 0.70, 0.75)}
    digits = {m: (0.95 + 0.01 * i, 0.99, 0.96, 0.995) for i, m in enumerate(METHODS)}
    _runs(tmp_path, "ring-", ring)
    _runs(tmp_path, "", digits)
    out = subprocess.run([sys.executable, str(SCRIPT), str(tmp_path)], check=True, capture_output=True,
                         text=True).stdout
    ring_part = out[out.index("ring:"):]
    rows = {line.split("|")[0].strip(): [c.strip() for c in line.split("|")[1:]] for line in ring_part.splitlines()
            if line.split("|")[0].strip() in ("PeFLL", "pFedHN", "FedAvg", "Local")}
    assert rows["PeFLL"] == ["72.0%", "75.0%", "80.0%"]
    assert rows["pFedHN"] == ["33.0%", "69.0%", "79.0%"]
    assert rows["FedAvg"] == ["31.0%", "33.0%", "78.0%"]
    assert "new clients | training clients | new clients, label masking" in ring_part.replace("  ", "")
    # PeFLL new 72.0 vs FedAvg new 31.0; pFedHN train 69.0 vs FedAvg train 33.0
    assert "+41.0 points and +36.0 points from FedAvg's single model (31.0% / 33.0%" in ring_part
    assert "pFedHN's new clients, which only train a fresh embedding, are +2.0 points from it." in ring_part
    assert "spans 3.0 points (best: Local)" in out[:out.index("ring:")]
