"""The two tables ``demo.sh`` ends with: unmasked test accuracy on new and on training clients, per method.

Usage: python recipes/quickstart/demo_tables.py RUNS_ROOT (the directory demo.sh wrote). Label masking
(classes absent from a client's train data are never predicted) hands every method each client's
classes, so it is a separate, last column; the captions are written from the numbers they caption.
"""

import json
import sys
from pathlib import Path

METHODS = (("pefll", "PeFLL"), ("pfedhn", "pFedHN"), ("fedavg", "FedAvg"), ("local", "Local"))
HEADER = ("method", "new clients", "training clients", "new clients, label masking")


def accuracies(root: Path, prefix: str) -> dict:
    """{method: (new, training, new with label masking)}: mean over clients of test accuracy."""
    def load(name):
        return json.loads((root / f"{prefix}{name}" / "metrics.json").read_text())
    return {m: (load(f"{m}-holdout")["mean_accuracy"], load(m)["train"]["mean_accuracy"],
                load(f"{m}-holdout-lm")["mean_accuracy_lm"]) for m, _ in METHODS}


def table(acc: dict) -> list[str]:
    rows = [HEADER] + [(name, *(f"{a:.1%}" for a in acc[m])) for m, name in METHODS]
    widths = [max(len(r[i]) for r in rows) for i in range(len(HEADER))]
    lines = []
    for i, r in enumerate(rows):
        lines.append(" | ".join(c.ljust(w) if j == 0 else c.rjust(w) for j, (c, w) in enumerate(zip(r, widths))))
        if i == 0:
            lines.append("-|-".join("-" * w for w in widths))
    return lines


def points(a: float, b: float) -> str:
    return f"{100 * (a - b):+.1f} points"


def ring_caption(acc: dict) -> str:
    """One sentence on the ring: does each hypernetwork beat the one global model where its paper says?"""
    pefll, pfedhn, fedavg = acc["pefll"], acc["pfedhn"], acc["fedavg"]
    return (f"Without label masking, PeFLL's new clients ({pefll[0]:.1%}) and pFedHN's training clients "
            f"({pfedhn[1]:.1%}) are {points(pefll[0], fedavg[0])} and {points(pfedhn[1], fedavg[1])} from FedAvg's "
            f"single model ({fedavg[0]:.1%} / {fedavg[1]:.1%}; any single model is capped near 47%), while "
            f"pFedHN's new clients, which only train a fresh embedding, are {points(pfedhn[0], fedavg[0])} from it.")


def digits_caption(acc: dict) -> str:
    best = max(METHODS, key=lambda m: acc[m[0]][0])[1]
    spread = max(a[0] for a in acc.values()) - min(a[0] for a in acc.values())
    return (f"Digits with 2 classes a client is easy for every method: new-client accuracy spans "
            f"{100 * spread:.1f} points (best: {best}), so it shows that each pipeline works, not which "
            "method personalizes best.")


def main(root: str) -> None:
    root = Path(root)
    for title, prefix, caption in (("digits", "", digits_caption), ("ring", "ring-", ring_caption)):
        acc = accuracies(root, prefix)
        print(f"{title}: test accuracy, mean over clients, no label masking unless the column says so")
        print("\n".join(table(acc)))
        print(caption(acc))
        print()


if __name__ == "__main__":
    main(sys.argv[1])
