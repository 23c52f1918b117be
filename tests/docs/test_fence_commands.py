"""The docs-fence collector finds pflx's commands however the shell runs them (issue 49, finding 7).

Before, a regex-free but naive split missed commands behind ``timeout``, ``nohup``, ``sudo -E``, ``uv run``,
``if``/``while``, ``x=$(...)``, ``{ ...; }``, ``bash recipes/....sh`` and ``python3.11 -m pfl_cli``: a fence with
``timeout 600 pflx train --no-such-flag`` passed the docs tier unchecked. Every form is listed here.
"""

import pytest

import executed

FORMS = [
    ("timeout 600 pflx train --no-such-flag", ["pflx", "train", "--no-such-flag"]),
    ("timeout -k 5 --preserve-status 10m pflx show runs/x", ["pflx", "show", "runs/x"]),
    ("nohup pflx train --partition p --out o > train.log 2>&1 &", ["pflx", "train", "--partition", "p", "--out", "o"]),
    ("sudo -E pflx partition --out p", ["pflx", "partition", "--out", "p"]),
    ("sudo -u runner -E env OMP_NUM_THREADS=1 pflx show p", ["pflx", "show", "p"]),
    ("uv run pflx algorithms", ["pflx", "algorithms"]),
    ("uv run --with torchvision -- pflx algorithms", ["pflx", "algorithms"]),
    ("if pflx show runs/p; then echo ok; fi", ["pflx", "show", "runs/p"]),
    ("while ! pflx show runs/p; do sleep 1; done", ["pflx", "show", "runs/p"]),
    ("x=$(pflx show runs/p --format json)", ["pflx", "show", "runs/p", "--format", "json"]),
    ('eps="$(pflx privacy-account runs/km --format json | jq .epsilon)"', ["pflx", "privacy-account", "runs/km",
                                                                          "--format", "json"]),
    ("{ pflx show runs/p; echo done; }", ["pflx", "show", "runs/p"]),
    ("( cd runs && pflx show p )", ["pflx", "show", "p"]),
    ("bash recipes/quickstart/run.sh --smoke", ["recipes/quickstart/run.sh", "--smoke"]),
    ("bash -c 'pflx show runs/p'", ["pflx", "show", "runs/p"]),
    ("python3.11 -m pfl_cli train --out o", ["python3.11", "-m", "pfl_cli", "train", "--out", "o"]),
    ("OMP_NUM_THREADS=1 .venv-bench/bin/python benchmarks/peers.py --rounds 2",
     [".venv-bench/bin/python", "benchmarks/peers.py", "--rounds", "2"]),
    ("time nice -n 5 pflx show p", ["pflx", "show", "p"]),
    ("for s in 0 1; do pflx train --seed $s; done", ["pflx", "train", "--seed", "$s"]),
]


@pytest.mark.parametrize("line, argv", FORMS, ids=[f[0][:40] for f in FORMS])
def test_every_command_form_is_found(line, argv):
    found = executed.simple_commands(line)
    assert argv in found, found
    assert executed.is_pflx_command(argv)


def test_an_untagged_fence_behind_timeout_is_unaccounted(tmp_path, monkeypatch):
    page = tmp_path / "p.md"
    page.write_text("text\n\n```\ntimeout 600 pflx train --no-such-flag\n```\n")
    monkeypatch.setattr(executed, "ROOT", tmp_path)
    assert [w.split()[0] for w in executed.unaccounted("p.md", run=False)] == ["p.md:3"]


def test_output_lines_and_assignments_hold_no_command():
    assert not any(executed.is_pflx_command(c) for c in executed.simple_commands("pflx: error: --rounds must be >= 1"))
    assert executed.simple_commands("x=1 y=2") == []
    assert not any(executed.is_pflx_command(c) for c in executed.simple_commands("echo pflx; grep pflx log.txt"))


def test_a_parse_only_block_behind_timeout_is_checked(tmp_path):
    block = executed.Block("p.md", 3, "bash", "timeout 600 pflx train --no-such-flag\n")
    failed = executed.parse_block(block, executed.scratch(tmp_path))
    assert failed and "--no-such-flag" in failed[0], failed
