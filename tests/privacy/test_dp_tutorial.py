"""docs/tutorials/dp-pipeline.md runs as written, and the numbers its text explains are the ones pflx prints
(issue 34, item 15): q = 8 / 1000, eps 3.13 (PLD) for the two ledgers composed, 3.03 (PLD) for the train ledger
alone, its own RDP calibration 4, and 4.11 by RDP for the two."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest

PAGE = Path(__file__).resolve().parents[2] / "docs" / "tutorials" / "dp-pipeline.md"


def _commands() -> list[list[str]]:
    block = PAGE.read_text().split("```bash\n", 1)[1].split("```", 1)[0]
    lines, joined = [], ""
    for line in block.splitlines():
        line = line.split("#", 1)[0].rstrip()
        joined += line[:-1] + " " if line.endswith("\\") else line
        if line and not line.endswith("\\"):
            lines.append(joined.strip())
            joined = ""
    return [shlex.split(line) for line in lines if line.startswith("pflx ")]


def _epsilon(text: str) -> float:
    return float(re.search(r"epsilon = ([0-9.]+)", text).group(1))


@pytest.mark.slow  # ~9 s: the tutorial's 50 DP rounds, its DP mdm-fit and five PLD/RDP compositions
def test_the_dp_tutorial_runs_and_its_explained_numbers_are_printed(cli, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    commands = _commands()
    assert [c[1] for c in commands] == ["partition", "mdm-fit", "train", "privacy-account", "privacy-account",
                                        "privacy-account"]
    out = []
    for argv in commands:
        res = cli(*argv[1:])
        assert res.code == 0, (argv, res.err)
        out.append(res.out)
    text = PAGE.read_text()
    assert "q = 0.008" in out[4] or "rate q = 0.008" in out[4]
    assert "8 / 1000 = 0.008" in text
    both_pld = _epsilon(out[4])
    alone_pld = _epsilon(cli("privacy-account", "runs/dp/fedavg", "--accountant", "pld").out)
    both_rdp = _epsilon(cli("privacy-account", "runs/dp/mdm", "runs/dp/fedavg", "--delta", "1e-5",
                            "--accountant", "rdp").out)
    assert _epsilon(cli("privacy-account", "runs/dp/fedavg").out) == pytest.approx(4.0, abs=1e-3)
    for value, stated in ((both_pld, "3.13"), (alone_pld, "3.03"), (both_rdp, "4.11")):
        assert f"{value:.2f}" == stated and stated in text, (value, stated)
