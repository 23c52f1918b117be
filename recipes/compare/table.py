"""The comparison recipe's extras beside `pflx compare`'s table (reads artifacts only; trains nothing).

`pflx compare` prints the accuracies over seeds (mean, 95 % interval, fairness). This adds, per
algorithm, what does not vary with the seed or is not a measurement: the floats one cohort client
exchanges per round, the optimizer steps of the new-client protocol, and the paper's numbers when
the recipe has a `paper:` section; also one seed's accuracies (train and new clients, without and with
label masking), which the recipe's tests read. Markdown on stdout; `--json` prints the rows as one
JSON object. The runs are `<runs>/<algorithm>/seed-<seed>` (train) and `.../seed-<seed>-new` (predict).

    python recipes/compare/table.py --runs runs/compare --seed 0 --recipe recipes/compare/digits.yaml \\
        --algorithms "fedavg fedrep"
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import yaml


def _read(path: Path) -> dict:
    manifest = json.loads((path / "manifest.json").read_text())
    return {"stage": manifest["stage"], **json.loads((path / "metrics.json").read_text())}


def rows(runs: Path, algorithms: list[str], seed: int = 0) -> list[dict]:
    out = []
    for alg in algorithms:
        run = runs / alg / f"seed-{seed}"
        train, new = _read(run), _read(run.with_name(f"seed-{seed}-new"))
        if train["stage"] != "train" or new["stage"] != "predict":
            raise SystemExit(f"table.py: {run} must be a train artifact and {run}-new a predict artifact.")
        out.append({
            "algorithm": alg,
            "train": train["train"]["mean_accuracy"], "train_lm": train["train"]["mean_accuracy_lm"],
            "new": new["mean_accuracy_nolm"], "new_lm": new["mean_accuracy_lm"],
            "new_optimizer_steps": new["optimizer_steps"],
            "floats_per_client_round": train["floats_per_client_round"],
        })
    return out


def markdown(table: list[dict], paper: dict | None) -> str:
    head = ["algorithm", "floats / client / round", "new: optimizer steps"]
    if paper:
        head += ["paper train", "paper new"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in table:
        cells = [r["algorithm"], f"{r['floats_per_client_round']:,}", str(r["new_optimizer_steps"])]
        if paper:
            ref = (paper.get("rows") or {}).get(r["algorithm"]) or {}
            cells += [str(ref.get("train", "-")), str(ref.get("new", "-"))]
        lines.append("| " + " | ".join(cells) + " |")
    caption = ("Floats one cohort client exchanges per round (train artifact); optimizer steps the new-client "
               "protocol takes (predict artifact).")
    if paper:
        caption += f" Paper (% test accuracy, to hold beside the table above): {paper.get('table', '')}"
    return "\n".join(lines) + "\n\n" + caption + "\n"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=Path, required=True, help="folder holding <algorithm>/seed-<seed>[-new]/")
    ap.add_argument("--seed", type=int, default=0, help="the seed whose runs to read")
    ap.add_argument("--algorithms", required=True, help="space-separated algorithm names")
    ap.add_argument("--recipe", type=Path, help="recipe whose paper: section is printed beside")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    table = rows(args.runs, args.algorithms.split(), args.seed)
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
