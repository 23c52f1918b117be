"""Write a tiny Shakespeare dataset in LEAF's layout (``data/train``, ``data/test``) for the CPU smoke recipe.

LEAF's real data come from its preprocessing scripts (``leaf/data/shakespeare/preprocess.sh``), which
download the plays; this writes a few speakers instead, each repeating one famous line, so the smoke run
needs no download. Samples are LEAF's: ``x`` an 80-character window of the speaker's text, ``y`` the
character after it; the test windows come later in the same text.

    python recipes/pefll/shakespeare_fixture.py --out runs/shakespeare-data [--speakers 10]
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

LINES = (
    "Now is the winter of our discontent made glorious summer by this sun of York. ",
    "To be, or not to be, that is the question: whether 'tis nobler in the mind. ",
    "All the world's a stage, and all the men and women merely players; exits. ",
    "Friends, Romans, countrymen, lend me your ears; I come to bury Caesar, not. ",
    "O Romeo, Romeo! wherefore art thou Romeo? Deny thy father and refuse thy name. ",
    "If music be the food of love, play on; give me excess of it, that surfeiting. ",
    "Once more unto the breach, dear friends, once more; or close the wall up. ",
    "The quality of mercy is not strained; it droppeth as the gentle rain from heaven. ",
)
SEQ = 80  # LEAF's Shakespeare samples: 80 characters, then the next one


def windows(text: str, start: int, count: int, seq: int = SEQ) -> tuple[list[str], list[str]]:
    """``count`` samples of ``text`` from offset ``start``: x a ``seq``-character window, y the next character."""
    return [text[i:i + seq] for i in range(start, start + count)], [text[i + seq] for i in range(start, start + count)]


def leaf_doc(users: dict) -> dict:
    return {"users": list(users), "num_samples": [len(y) for _, y in users.values()],
            "hierarchies": ["play"] * len(users), "user_data": {u: {"x": x, "y": y} for u, (x, y) in users.items()}}


def write(root: Path, *, speakers: int = 10, train: int = 24, test: int = 8, seq: int = SEQ) -> Path:
    """``root/train/all_data_train.json`` and ``root/test/all_data_test.json``; returns ``root``."""
    parts: dict[str, dict] = {"train": {}, "test": {}}
    for u in range(speakers):
        line = LINES[u % len(LINES)]
        text = line * (2 + (train + test + seq) // len(line))
        name = f"PLAY_{u:02d}_SPEAKER"
        parts["train"][name] = windows(text, 0, train, seq)
        parts["test"][name] = windows(text, train + 3, test, seq)  # later windows of the same speaker
    for split, users in parts.items():
        (root / split).mkdir(parents=True, exist_ok=True)
        (root / split / f"all_data_{split}.json").write_text(json.dumps(leaf_doc(users)))
    return root


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--speakers", type=int, default=10)
    ap.add_argument("--train", type=int, default=24, help="train samples per speaker")
    ap.add_argument("--test", type=int, default=8, help="test samples per speaker")
    a = ap.parse_args()
    print(write(a.out, speakers=a.speakers, train=a.train, test=a.test))


if __name__ == "__main__":
    main()
