"""The shell blocks of docs/commands/compare.md run as written, at smoke size (rounds and evaluations shrunk)."""

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
BLOCK = re.compile(r"```bash\n(.*?)```", re.S)
SMOKE = [(r"--rounds \d+", "--rounds 2"), (r"--eval-every \d+", "--eval-every 1"), (r"--local-epochs \d+",
                                                                                    "--local-epochs 1"),
         (r"rounds: \d+", "rounds: 2"), (r"eval_every: \d+", "eval_every: 1"), (r"local_epochs: \d+", "local_epochs: 1")]


@pytest.mark.slow
def test_the_compare_page_runs(tmp_path):
    bodies = BLOCK.findall((ROOT / "docs" / "commands" / "compare.md").read_text())
    assert bodies
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",
           "OMP_NUM_THREADS": "1"}
    for body in bodies:
        for pattern, repl in SMOKE:
            body = re.sub(pattern, repl, body)
        r = subprocess.run(["bash", "-e", "-o", "pipefail", "-c", body], cwd=tmp_path, env=env, capture_output=True,
                           text=True, timeout=600)
        assert r.returncode == 0, (body, r.stdout[-2000:], r.stderr[-2000:])
    assert "± " in (tmp_path / "runs" / "table" / "table.md").read_text()
    assert (tmp_path / "runs" / "table-fig" / "clients.png").is_file()
    assert (tmp_path / "runs" / "spec-runs" / "local" / "s2-new" / "manifest.json").is_file()
    assert "| local | new | 3 |" in (tmp_path / "runs" / "table-spec" / "table.md").read_text()
