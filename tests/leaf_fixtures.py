"""Tiny LEAF Shakespeare files (LEAF's published JSON layout: ``data/train`` and ``data/test``) for tests.

The writer is the CPU smoke recipe's (``recipes/pefll/shakespeare_fixture.py``): each speaker repeats one
line of its own, so its next characters are predictable from its own text and differ between speakers.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

_PATH = Path(__file__).resolve().parents[1] / "recipes" / "pefll" / "shakespeare_fixture.py"
_spec = importlib.util.spec_from_file_location("shakespeare_fixture", _PATH)
fixture = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(fixture)


def make_shakespeare(root: Path, *, users: int = 6, train: int = 24, test: int = 8) -> Path:
    """``root/train/all_data_train.json`` and ``root/test/all_data_test.json`` with ``users`` speakers."""
    from pfl_cli.data.leaf import SHAKESPEARE_LETTERS

    assert set("".join(fixture.LINES)) <= set(SHAKESPEARE_LETTERS)
    return fixture.write(root, speakers=users, train=train, test=test)
