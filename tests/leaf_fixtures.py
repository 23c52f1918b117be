"""Tiny LEAF Shakespeare files (LEAF's published JSON layout: ``data/train`` and ``data/test``) for tests.

Each user speaks one line of its own, repeated: its next characters are predictable from its own text and
differ between users, so a next-character model learns and personalization has something to find.
"""

from __future__ import annotations

import json
from pathlib import Path

from pfl_cli.data.leaf import SHAKESPEARE_LETTERS

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


def windows(text: str, start: int, count: int, seq: int) -> tuple[list[str], list[str]]:
    """``count`` LEAF samples of ``text`` from offset ``start``: x a ``seq``-character window, y the next one."""
    xs = [text[i:i + seq] for i in range(start, start + count)]
    ys = [text[i + seq] for i in range(start, start + count)]
    return xs, ys


def shakespeare_doc(users: dict) -> dict:
    return {"users": list(users), "num_samples": [len(y) for _, y in users.values()],
            "hierarchies": ["play"] * len(users),
            "user_data": {u: {"x": x, "y": y} for u, (x, y) in users.items()}}


def make_shakespeare(root: Path, *, users: int = 6, train: int = 24, test: int = 8, seq: int = 80) -> Path:
    """``root/train/all_data_train.json`` and ``root/test/all_data_test.json`` with ``users`` speakers."""
    assert set("".join(LINES)) <= set(SHAKESPEARE_LETTERS)
    train_users, test_users = {}, {}
    for u in range(users):
        text = LINES[u % len(LINES)] * (2 + (train + test + seq) // len(LINES[u % len(LINES)]))
        name = f"PLAY_{u:02d}_SPEAKER"
        train_users[name] = windows(text, 0, train, seq)
        test_users[name] = windows(text, train + 3, test, seq)  # later windows of the same speaker
    for split, doc in (("train", train_users), ("test", test_users)):
        (root / split).mkdir(parents=True, exist_ok=True)
        (root / split / f"all_data_{split}.json").write_text(json.dumps(shakespeare_doc(doc)))
    return root
