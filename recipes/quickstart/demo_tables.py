"""The two tables ``demo.sh`` ends with: `pflx compare`'s tables of the digits and the ring runs, captioned.

Usage: python recipes/quickstart/demo_tables.py RUNS_ROOT (the directory demo.sh wrote; it holds
``digits-table/`` and ``ring-table/``, two ``pflx compare`` artifacts over seeds 0, 1, 2). Each table
gives, per method and client group (train: the training clients; new: the holdout clients, from
``predict --clients holdout``), the mean over seeds of the per-client test accuracy without label
masking ± the 95 % Student-t interval, the fairness columns (standard deviation across clients, mean
of the worst 10 %, minimum) and, in its own labelled column, the label-masked accuracy (classes absent
from a client's train data never predicted: it hands every method each client's classes). The captions
are written from the numbers they caption.
"""

import json
import sys
from pathlib import Path

NAMES = {"pefll": "PeFLL", "pfedhn": "pFedHN", "fedavg": "FedAvg", "local": "Local"}


def rows(table_dir: Path) -> dict:
    """{(algorithm, group): row} of a compare artifact's table.json."""
    doc = json.loads((table_dir / "table.json").read_text())
    return {(r["algorithm"], r["group"]): r for r in doc["rows"]}


def table_lines(table_dir: Path) -> tuple[str, str]:
    """table.md split into its Markdown table and its caption."""
    table, caption = (table_dir / "table.md").read_text().split("\n\n", 1)
    return table, caption.strip()


def pct(row: dict) -> str:
    half = row["accuracy_ci"]
    return f"{row['accuracy']:.1%}" + ("" if half is None else f" ± {100 * half:.1f}")


def points(a: dict, b: dict) -> str:
    """a - b in points, from the rounded means the table and the caption show (so the reader's subtraction agrees)."""
    return f"{round(100 * a['accuracy'], 1) - round(100 * b['accuracy'], 1):+.1f} points"


def ring_caption(r: dict) -> str:
    """One sentence on the ring: does each hypernetwork beat the one global model where its paper says?"""
    pefll_new, pfedhn_train, pfedhn_new = r["pefll", "new"], r["pfedhn", "train"], r["pfedhn", "new"]
    fedavg_new, fedavg_train = r["fedavg", "new"], r["fedavg", "train"]
    seeds = pefll_new["num_seeds"]
    return (f"Without label masking (mean over {seeds} seeds ± 95 % interval), PeFLL's new clients "
            f"({pct(pefll_new)}) and pFedHN's training clients ({pct(pfedhn_train)}) are "
            f"{points(pefll_new, fedavg_new)} and {points(pfedhn_train, fedavg_train)} from FedAvg's single model "
            f"({pct(fedavg_new)} / {pct(fedavg_train)}; any single model is capped near 47%), while pFedHN's new "
            f"clients, which only train a fresh embedding, are {points(pfedhn_new, fedavg_new)} from it "
            f"({pct(pfedhn_new)}).")


def digits_caption(r: dict) -> str:
    new = {a: row for (a, g), row in r.items() if g == "new"}
    best = max(new, key=lambda a: new[a]["accuracy"])
    spread = max(x["accuracy"] for x in new.values()) - min(x["accuracy"] for x in new.values())
    return (f"Digits with 2 classes a client is easy for every method: new-client accuracy (mean over seeds) spans "
            f"{100 * spread:.1f} points (best: {NAMES.get(best, best)}), so it shows that each pipeline works, not "
            "which method personalizes best.")


def main(root: str) -> None:
    root = Path(root)
    legend = ""
    for title, caption in (("digits", digits_caption), ("ring", ring_caption)):
        table, legend = table_lines(root / f"{title}-table")
        print(f"{title}: test accuracy (%) per method and client group, `pflx compare` over seeds "
              f"(runs: {root / title}-*; table: {root / title}-table/table.md)")
        print(table)
        print(caption(rows(root / f"{title}-table")))
        print()
    print(legend)


if __name__ == "__main__":
    main(sys.argv[1])
