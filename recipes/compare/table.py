"""One comparison table from train and predict artifacts (reads artifacts only; trains nothing).

For each algorithm: mean per-client test accuracy of the train clients (train's metrics.json) and of
the new clients (predict's metrics.json on the holdout clients), without and with label masking,
and the floats one cohort client exchanges per round; beside them, the paper's numbers when the
recipe has a `paper:` section. Markdown on stdout; `--json` prints the rows as one JSON object.

    python recipes/compare/table.py --runs runs/compare --recipe recipes/compare/digits.yaml \\
        --algorithms "fedavg fedrep"
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

import yaml


def _read(path: Path) -> dict:
    manifest = json.loads((path / "manifest.json").read_text())
    return {"stage": manifest["stage"], **json.loads((path / "metrics.json").read_text())}


def rows(runs: Path, algorithms: list[str]) -> list[dict]:
    out = []
    for alg in algorithms:
        train, new = _read(runs / alg), _read(runs / f"{alg}-new")
        if train["stage"] != "train" or new["stage"] != "predict":
            raise SystemExit(f"table.py: {runs / alg} must be a train artifact and {runs / (alg + '-new')} a "
                             "predict artifact.")
        out.append({
            "algorithm": alg,
            "train": train["train"]["mean_accuracy"], "train_lm": train["train"]["mean_accuracy_lm"],
            "new": new["mean_accuracy_nolm"], "new_lm": new["mean_accuracy_lm"],
            "new_optimizer_steps": new["optimizer_steps"],
            "floats_per_client_round": train["floats_per_client_round"],
        })
    return out


def _pct(v) -> str:
    return "-" if v is None or (isinstance(v, float) and not math.isfinite(v)) else f"{100 * v:.1f}"


def markdown(table: list[dict], paper: dict | None) -> str:
    head = ["algorithm", "train", "train LM", "new", "new LM", "floats / client / round", "new: optimizer steps"]
    if paper:
        head += ["paper train", "paper new"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in table:
        cells = [r["algorithm"], _pct(r["train"]), _pct(r["train_lm"]), _pct(r["new"]), _pct(r["new_lm"]),
                 f"{r['floats_per_client_round']:,}", str(r["new_optimizer_steps"])]
        if paper:
            ref = (paper.get("rows") or {}).get(r["algorithm"]) or {}
            cells += [str(ref.get("train", "-")), str(ref.get("new", "-"))]
        lines.append("| " + " | ".join(cells) + " |")
    caption = ("Mean per-client test accuracy (%): train clients (train artifact) and new clients (the "
               "partition's holdout clients, predict artifact); LM: label masking.")
    if paper:
        caption += f" Paper: {paper.get('table', '')}"
    return "\n".join(lines) + "\n\n" + caption + "\n"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=Path, required=True, help="folder holding <algorithm>/ and <algorithm>-new/")
    ap.add_argument("--algorithms", required=True, help="space-separated algorithm names")
    ap.add_argument("--recipe", type=Path, help="recipe whose paper: section is printed beside")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    table = rows(args.runs, args.algorithms.split())
    paper = None
    if args.recipe is not None:
        paper = (yaml.safe_load(args.recipe.read_text()) or {}).get("paper")
    if args.json:
        print(json.dumps({"rows": table, "paper": paper}))
    else:
        sys.stdout.write(markdown(table, paper))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
