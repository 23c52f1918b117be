"""A new user's first hour: the README's first pipeline runs as written, the README stays one screen,
the docs site covers every command with an option table generated from the CLI, and predict explains
label masking's 0% clients."""

from __future__ import annotations

import importlib.util
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[1]


def _readme_block(heading: str) -> list[str]:
    text = (ROOT / "README.md").read_text()
    section = text.split(f"## {heading}\n", 1)[1]
    block = section.split("```bash\n", 1)[1].split("```", 1)[0]
    return [ln for ln in block.splitlines() if ln.strip() and not ln.lstrip().startswith("#")]


def test_readme_is_one_screen_and_links_stay_in_the_repository():
    text = (ROOT / "README.md").read_text()
    assert len(text.splitlines()) <= 150
    for target in re.findall(r"\]\(([^)]+)\)", text):
        if target.startswith("http"):
            continue
        assert (ROOT / target.split("#")[0]).is_file(), target


def test_readme_first_pipeline_runs_as_written(tmp_path):
    lines = _readme_block("A first pipeline")
    commands = [ln.split("#")[0].strip() for ln in lines]
    assert [c.split()[:2] for c in commands if c.startswith("pflx")] == [
        ["pflx", "partition"], ["pflx", "train"], ["pflx", "predict"], ["pflx", "show"]]
    env = dict(os.environ, PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1")
    for command in commands:
        if command.startswith("export "):
            name, value = command.split()[1].split("=")
            env[name] = value
            continue
        argv = shlex.split(command)
        assert argv[0] == "pflx", command
        proc = subprocess.run([sys.executable, "-m", "pfl_cli", *argv[1:]], cwd=tmp_path, env=env,
                              capture_output=True, text=True, timeout=600)
        assert proc.returncode == 0, (command, proc.stderr)
    import json

    pred = json.loads((tmp_path / "runs" / "pred" / "metrics.json").read_text())
    trained = json.loads((tmp_path / "runs" / "pefll" / "metrics.json").read_text())
    assert pred["num_clients"] == 6 and pred["optimizer_steps"] == 0
    assert pred["mean_accuracy_nolm"] == pytest.approx(trained["holdout"]["mean_accuracy"], abs=1e-12)
    assert pred["mean_accuracy_nolm"] > 0.8  # PeFLL on digits: ~94% on the unseen clients


COMMAND_PAGES = {"partition", "mdm-fit", "simulate", "train", "predict", "cluster", "privacy-account", "attack",
                 "show", "algorithms", "flower", "tune", "compare"}


def test_every_command_has_a_page_whose_option_table_is_generated_from_the_cli():
    sys.path.insert(0, str(ROOT / "docs" / "hooks"))
    try:
        import cli_reference
    finally:
        sys.path.pop(0)
    import typer

    from pfl_cli.cli.app import app

    assert set(typer.main.get_command(app).commands) == COMMAND_PAGES
    for name in COMMAND_PAGES:
        page = (ROOT / "docs" / "commands" / f"{name}.md").read_text()
        assert f"<!-- pflx-options: {name}" in page, name  # "flower" documents its subcommand "flower app"
    table = cli_reference.options_reference("train")
    assert table.startswith("```text\nUsage: pflx train [OPTIONS]")
    # the metavar's spelling is typer's ("<int>" in 0.2x's later releases, "INTEGER" before): match the flag
    assert re.search(r"^\| `--rounds [^`]+` \| .*round", table, flags=re.M | re.I), table
    assert re.search(r"^\| `-o, --out [^`]+` \| ", table, flags=re.M), table
    flags = re.findall(r"^\| `([^`]*)`", table, flags=re.M)
    assert len(flags) == len(set(flags)) > 30  # each option once
    with pytest.raises(ValueError, match="no command 'nope'"):
        cli_reference.options_reference("nope")


@pytest.mark.skipif(importlib.util.find_spec("markdown") is None,
                    reason="the docs extra (mkdocs, which brings Python-Markdown) is not installed; make test installs it")
def test_option_tables_render_without_backslashes():
    # The table's cells reach readers through Python-Markdown: a backslash in a code span stays literal,
    # and the help text carries no rich escapes (issue 34, item 11).
    import markdown

    sys.path.insert(0, str(ROOT / "docs" / "hooks"))
    try:
        import cli_reference
    finally:
        sys.path.pop(0)
    for name in sorted(COMMAND_PAGES - {"flower"}) + ["flower app"]:
        html = markdown.markdown(cli_reference.options_reference(name), extensions=["tables"])
        assert "\\" not in html, (name, [ln for ln in html.splitlines() if "\\" in ln])
    html = markdown.markdown(cli_reference.options_reference("train"), extensions=["tables"])
    assert "<code>--format [human|json|quiet]</code>" in html and "[default: human]" in html
    assert "noise=secure|seeded]</code>" in html and "auto | cpu | cuda[:N]" in html


@pytest.mark.skipif(importlib.util.find_spec("mkdocs") is None or importlib.util.find_spec("material") is None,
                    reason="the docs extra (mkdocs-material) is not installed; make test installs it")
def test_docs_site_builds_strict(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--quiet", "--site-dir",
                           str(tmp_path / "site")], cwd=ROOT, env=dict(os.environ, PYTHONPATH=str(ROOT),
                                                                         NO_MKDOCS_2_WARNING="1"),
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    html = (tmp_path / "site" / "commands" / "predict" / "index.html").read_text()
    assert "--embed-rounds" in html  # the generated option table reached the page


def test_unseen_test_labels_against_a_hand_built_partition():
    from pfl_cli.cli.predict_run import unseen_test_labels
    from pfl_cli.partition.base import Partition

    y = np.array([0, 0, 1, 2, 2, 1, 0, 2, 1])
    # client 0 trains on {0, 1}, tests {2, 0}; client 1 trains on {2}, tests {1, 0}; client 2 trains {1}, tests {1}.
    part = Partition(client_id=np.arange(3), role=np.zeros(3, np.uint8),
                     train_offsets=np.array([0, 2, 3, 4]), train_indices=np.array([1, 2, 3, 8]),
                     test_offsets=np.array([0, 2, 4, 5]), test_indices=np.array([4, 0, 5, 6, 5]))
    assert unseen_test_labels(part, y, np.arange(3)) == [(0, 1, 2), (1, 2, 2)]


def test_predict_notes_each_client_with_test_classes_absent_from_its_train_data(cli, tmp_path):
    from pfl_cli.artifacts import load_partition
    from pfl_cli.cli.predict_run import unseen_test_labels
    from pfl_cli.data import load_dataset

    assert cli("partition", "--dirichlet", "0.1", "-n", "20", "--holdout-clients", "5", "--out", tmp_path / "p",
               "--format", "quiet").code == 0
    assert cli("train", "--partition", tmp_path / "p", "--algorithm", "fedavg", "--rounds", "1", "--local-steps", "1",
               "--out", tmp_path / "m", "--format", "quiet").code == 0
    run = cli("predict", "--model", tmp_path / "m", "--partition", tmp_path / "p", "--clients", "all",
              "--out", tmp_path / "pr")
    assert run.code == 0, run.err
    part, _, _ = load_partition(tmp_path / "p")
    expected = unseen_test_labels(part, load_dataset("builtin:digits").y, np.arange(part.num_clients))
    notes = [ln for ln in run.err.splitlines() if ln.startswith("note: client ")]
    assert expected and len(notes) == len(expected)
    for (client, unseen, total), line in zip(expected, notes):
        assert line.startswith(f"note: client {client}: {unseen} of its {total} test samples")


def test_top_level_help_gives_each_command_its_whole_first_sentence(cli):
    run = cli("--help")
    commands = run.out.split("Commands:", 1)[1]
    assert run.code == 0 and "..." not in commands
    assert "honest-but-curious server." in " ".join(commands.split())


def test_summaries_say_what_happened(cli, tmp_path):
    assert cli("partition", "--dirichlet", "0.5", "-n", "10", "--holdout-clients", "2", "--out", tmp_path / "p",
               "--format", "quiet").code == 0
    local = cli("train", "--partition", tmp_path / "p", "--algorithm", "local", "--set", "local_epochs=1",
                "--out", tmp_path / "local")
    assert local.code == 0 and "no federated rounds (each client trains alone)" in local.out
    assert "round 0 of 0" not in local.out
    # mdm-fit choosing K says where the held-out clients went (8 train clients: 6 fit, 2 validate K).
    mdm = cli("mdm-fit", "--partition", tmp_path / "p", "--components", "1-2", "--out", tmp_path / "mdm")
    assert mdm.code == 0 and "fitted on 6 clients (2 more held out to choose K" in " ".join(mdm.out.split())
