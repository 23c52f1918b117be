"""The table ``demo.sh`` ends with, in README.md's form: `pflx compare`'s table of the ring runs and one sentence
written from its numbers.

Usage: python recipes/quickstart/demo_tables.py RUNS_ROOT (the directory demo.sh wrote; it holds ``ring-table/``,
the ``pflx compare`` artifact over seeds 0, 1, 2). The table gives, per method and client group (train: the
training clients; new: the holdout clients, from ``predict --clients holdout``), the mean over seeds of the
per-client test accuracy without label masking ± the 95 % Student-t interval, the fairness columns (standard
deviation across clients, mean of the worst 10 %, minimum) and, in its own labelled column, the label-masked
accuracy (classes absent from a client's train data never predicted: it hands every method each client's
classes). Prints the table, a blank line and the sentence: what demo.sh compares with
recipes/quickstart/expected-table.md, which README.md shows (tests/docs/test_demo_table.py).
"""

import json
import sys
from pathlib import Path


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


def demo_table(root: Path) -> str:
    """The table and its sentence, as README.md shows them."""
    table, _legend = table_lines(root / "ring-table")
    return f"{table}\n\n{ring_caption(rows(root / 'ring-table'))}\n"


def main(root: str) -> None:
    sys.stdout.write(demo_table(Path(root)))


if __name__ == "__main__":
    main(sys.argv[1])
