"""Sources cite the papers, never the implementer's working notes (issue 34, item 10).

The repository has no ``specs/``: a citation of ``specs/*.md`` (or of one of its files by name) points
nowhere. Code, docs, README and recipes cite the paper itself (title or short name of
docs/bibliography.md, section, table, equation), and so does the ``source`` column of `pflx algorithms`.
"""

import pathlib
import re

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
TREES = ("pfl_cli", "docs", "recipes")
SUFFIXES = {".py", ".md", ".yaml", ".yml", ".sh", ".txt", ".toml", ".cfg", ""}
# a notes file by name, not a docs page of the same name linked by path (algorithms/pefll.md, (pefll.md))
NOTES = re.compile(r"specs/|(?<![/(\w-])(pefll|mdm|clustering|pfedhn-hyperfl|anchors-frameworks|style-anchors)\.md\b")


def _files():
    for tree in TREES:
        for path in sorted((ROOT / tree).rglob("*")):
            if path.is_file() and path.suffix in SUFFIXES and "__pycache__" not in path.parts:
                yield path
    yield ROOT / "README.md"


def test_no_file_cites_the_working_notes():
    hits = []
    for path in _files():
        for n, line in enumerate(path.read_text(errors="replace").splitlines(), start=1):
            if NOTES.search(line):
                hits.append(f"{path.relative_to(ROOT)}:{n}: {line.strip()[:100]}")
    assert not hits, "\n".join(hits)


@pytest.mark.parametrize("fmt", ["markdown", "json"])
def test_the_algorithms_source_column_cites_papers(cli, fmt):
    run = cli("algorithms", "--all", "--format", fmt)
    assert run.code == 0
    assert not NOTES.search(run.out), NOTES.search(run.out)
    assert "bibliography" in cli("algorithms", "--all", "--format", "markdown").out
