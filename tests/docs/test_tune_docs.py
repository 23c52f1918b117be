"""The shell blocks of the tune pages run as written, at smoke size (trials, rounds and evaluations shrunk).

A block marked ``<!-- docs-test: needs ... -->`` cannot run here (a database server); it runs anyway and must
end in pflx's one-line refusal named in the marker, which checks that its flags exist and parse.
"""

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
BLOCK = re.compile(r"(<!-- docs-test: (?P<mark>.*?) -->\n)?```bash\n(?P<body>.*?)```", re.S)
SMOKE = [(r"--trials \d+", "--trials 2"), (r"--rounds \d+", "--rounds 2"), (r"--eval-every \d+", "--eval-every 1")]


def blocks(page: str):
    for m in BLOCK.finditer((ROOT / page).read_text()):
        body = m.group("body")
        for pattern, repl in SMOKE:
            body = re.sub(pattern, repl, body)
        yield m.group("mark"), body


def _run(script: str, cwd: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",
           "OMP_NUM_THREADS": "1"}
    return subprocess.run(["bash", "-e", "-o", "pipefail", "-c", script], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=600)


@pytest.mark.parametrize("page", ["docs/commands/tune.md", "docs/tutorials/tune-then-compare.md"])
def test_every_shell_block_of_the_page_runs(page, tmp_path):
    found = list(blocks(page))
    assert found, f"{page} has no shell block"
    for mark, body in found:
        r = _run(body, tmp_path)
        if mark:
            refusal = re.search(r'"(.*?)"', mark).group(1)
            assert r.returncode == 2 and refusal in r.stderr, (body, r.stderr)
        else:
            assert r.returncode == 0, (body, r.stdout[-2000:], r.stderr[-2000:])


def test_the_readme_tune_and_compare_block_runs_after_the_first_pipeline(tmp_path):
    text = (ROOT / "README.md").read_text()
    first = text.split("## A first pipeline\n", 1)[1].split("```bash\n", 1)[1].split("```", 1)[0]
    partition = next(ln for ln in first.splitlines() if ln.startswith("pflx partition"))
    section = text.split("## Settings that work on your task", 1)[1]
    body = section.split("```bash\n", 1)[1].split("```", 1)[0]
    for pattern, repl in SMOKE:
        body = re.sub(pattern, repl, body)
    r = _run(partition + "\n" + body, tmp_path)
    assert r.returncode == 0, (r.stdout[-2000:], r.stderr[-2000:])
    assert (tmp_path / "runs" / "table" / "table.md").is_file()
