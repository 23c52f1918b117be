"""The docs home page and the algorithm pages run as written, at smoke size (issue 34, item 17).

Every shell block of these pages runs in a fresh directory, rounds, epochs and embedding rounds shrunk.
The home page's install block (``make demo`` / ``make test``, minutes and gigabytes) is marked
``<!-- docs-test: make -->``: each make target it names is checked to exist with ``make -n``.
"""

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
BLOCK = re.compile(r"(<!-- docs-test: (?P<mark>.*?) -->\n)?```bash\n(?P<body>.*?)```", re.S)
SMOKE = [(r"--rounds \d+", "--rounds 2"), (r"--local-epochs \d+", "--local-epochs 1"),
         (r"--embed-rounds \d+", "--embed-rounds 1"), (r"--finetune-steps \d+", "--finetune-steps 2")]
PAGES = ["docs/index.md", "docs/algorithms/pefll.md", "docs/algorithms/pfedhn.md", "docs/algorithms/hyperfl.md",
         "docs/algorithms/fedavg.md"]


def _run(script: str, cwd: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",
           "OMP_NUM_THREADS": "1", "MPLBACKEND": "Agg"}
    return subprocess.run(["bash", "-e", "-o", "pipefail", "-c", script], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=600)


@pytest.mark.slow
@pytest.mark.parametrize("page", PAGES)
def test_every_shell_block_of_the_page_runs(page, tmp_path):
    found = list(BLOCK.finditer((ROOT / page).read_text()))
    assert found, f"{page} has no shell block"
    for m in found:
        body = m.group("body")
        if m.group("mark") == "make":
            targets = re.findall(r"^make (\S+)", body, re.M)
            assert targets, body
            for target in targets:
                r = subprocess.run(["make", "-n", target], cwd=ROOT, capture_output=True, text=True)
                assert r.returncode == 0, (target, r.stderr)
            continue
        assert m.group("mark") is None, m.group("mark")
        for pattern, repl in SMOKE:
            body = re.sub(pattern, repl, body)
        r = _run(body, tmp_path)
        assert r.returncode == 0, (page, body, r.stdout[-2000:], r.stderr[-2000:])


def test_the_home_page_has_the_readmes_first_pipeline():
    first = lambda text: text.split("## A first pipeline\n", 1)[1].split("```bash\n", 1)[1].split("```", 1)[0]  # noqa: E731
    readme, home = (ROOT / "README.md").read_text(), (ROOT / "docs" / "index.md").read_text()
    pipeline = [ln for ln in first(readme).splitlines() if ln.startswith("pflx ")]
    assert pipeline and all(ln in home for ln in pipeline)
    assert "pip install" in home or "make demo" in home


@pytest.mark.parametrize("page", PAGES[1:])
def test_an_algorithm_page_says_how_new_clients_get_a_model_and_what_is_exchanged(page):
    text = (ROOT / page).read_text()
    assert "## New clients" in text or "a new client gets" in text
    assert "## What a client exchanges" in text and "## Defaults" in text
    assert "bibliography.md" in text
