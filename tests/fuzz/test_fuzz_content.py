"""Fuzz the content of every artifact file kind, hashes recomputed, so the readers' checks are what is exercised.

Each drawn case copies one tiny artifact, damages one file with a well-formed but wrong
content (``damaged``), re-hashes it, and runs a command that reads it. The contract: exit 0
with a valid artifact, or exit 2 with one line on stderr naming the problem; never exit 1;
nothing written to ``--out``; the damaged input left exactly as it was.
"""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from . import contract
from .damaged import checkpoint_edits, json_edits, manifest_edits, npz_edits, torch_edits
from .test_fuzz_commands import COMMANDS

SMALL = settings(max_examples=3, deadline=None, derandomize=True, database=None,
                 suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
LARGE = settings(max_examples=60, deadline=None, database=None,
                 suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])

TRAIN_SMALL = ["--rounds", "1", "--local-steps", "1", "--set", "hyper_hidden=8", "--set", "mlp_hidden=[8]"]
# artifact -> commands that read it ({src}: the damaged copy; {part}, {model}: intact fixtures).
READERS = {
    "part": [["mdm-fit", "--partition", "{src}", "--components", "2", "--rounds", "2"],
             ["show", "{src}"],
             ["predict", "--model", "{model}", "--partition", "{src}"],
             ["train", "--partition", "{src}", *TRAIN_SMALL],
             ["cluster", "--partition", "{src}", "--server-data", "builtin:digits", "--k", "2", "--no-dp",
              "--reference-n-init", "1", "--lloyds-steps", "1"]],
    "mdm": [["simulate", "--model", "{src}", "--num-clients", "4"], ["show", "{src}"]],
    "model": [["predict", "--model", "{src}", "--partition", "{part}"], ["show", "{src}"]],
    "ledger": [["privacy-account", "{src}"], ["show", "{src}"]],
}
# file kind -> (artifact holding it, strategy of edits)
KINDS = {
    "manifest.json": (None, manifest_edits()),
    "dataset.json": ("part", json_edits("dataset.json")),
    "stats.json": ("part", json_edits("stats.json")),
    "clients.npz": ("part", npz_edits()),
    "mdm.json": ("mdm", json_edits("mdm.json")),
    "metrics.json": ("model", json_edits("metrics.json")),
    "model.pt": ("model", torch_edits()),
    "privacy.json": ("ledger", json_edits("privacy.json")),
}


def _run(cli, tmp_path, artifacts, kind, data) -> None:
    name, edits = KINDS[kind]
    name = name or data.draw(st.sampled_from(sorted(READERS)), label="artifact")
    command = data.draw(st.sampled_from(READERS[name]), label="command")
    edit = data.draw(edits, label="edit")
    work = Path(tempfile.mkdtemp(dir=tmp_path))
    src = work / name
    shutil.copytree(artifacts / name, src)
    edit(src)
    before = contract.snapshot(src)
    out = work / "out"
    args = [a.format(src=src, part=artifacts / "part", model=artifacts / "model") for a in command]
    if command[0] != "show":
        args += ["--out", str(out)]
    res = cli(*args, "--format", "quiet")
    contract.check(res, out=None if command[0] == "show" else out, before=None, stage=None, args=args)
    assert res.code in (0, 2), (args, res.err)  # damaged content is bad input, never a run-time failure
    if res.code == 2:
        assert not out.exists(), args
    assert contract.snapshot(src) == before, args  # the input is never touched
    shutil.rmtree(work, ignore_errors=True)


@pytest.mark.parametrize("kind", list(KINDS))
@SMALL
@given(data=st.data())
def test_fuzz_damaged_content(cli, tmp_path, artifacts, kind, data):
    _run(cli, tmp_path, artifacts, kind, data)


@pytest.mark.slow
@pytest.mark.parametrize("kind", list(KINDS))
@LARGE
@given(data=st.data())
def test_fuzz_damaged_content_large(cli, tmp_path, artifacts, kind, data):
    _run(cli, tmp_path, artifacts, kind, data)


def _run_checkpoint(cli, tmp_path, artifacts, edit) -> None:
    """Resume the fixture's train run from a damaged copy of its checkpoint (re-sealed: its content is checked)."""
    from pfl_cli.fl.checkpoint import checkpoint_dir

    work = Path(tempfile.mkdtemp(dir=tmp_path))
    out = work / "run"
    folder = checkpoint_dir(out)
    shutil.copytree(artifacts / "model" / "checkpoint", folder)
    edit(folder)
    before = contract.snapshot(folder) if folder.is_dir() else folder.read_bytes()
    args = ["train", *COMMANDS["train"][0](artifacts), "--out", out, "--resume", "--format", "quiet"]
    res = cli(*args)
    contract.check(res, out=out, before=None, stage="train", args=args)
    assert res.code in (0, 2), (args, res.err)
    if res.code == 2:
        assert not out.exists() and "checkpoint" in res.err, res.err
        assert (contract.snapshot(folder) if folder.is_dir() else folder.read_bytes()) == before
    shutil.rmtree(work, ignore_errors=True)


@settings(SMALL, max_examples=4)
@given(edit=checkpoint_edits())
def test_fuzz_damaged_checkpoint_content(cli, tmp_path, artifacts, edit):
    _run_checkpoint(cli, tmp_path, artifacts, edit)


@pytest.mark.slow
@settings(LARGE, max_examples=40)
@given(edit=checkpoint_edits())
def test_fuzz_damaged_checkpoint_content_large(cli, tmp_path, artifacts, edit):
    _run_checkpoint(cli, tmp_path, artifacts, edit)
