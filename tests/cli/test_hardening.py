"""One writer per --out, the output location checked first, sealed checkpoints, validated ledgers,
errors as JSON, and Ctrl-C during train."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest
import torch

from pfl_cli.artifacts import lock_file, read_artifact, sha256_file
from pfl_cli.fl.checkpoint import checkpoint_dir, seal_checkpoint

ENV = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
TRAIN = ["--rounds", "4", "--eval-every", "2", "--local-steps", "2", "--set", "hyper_hidden=8",
         "--set", "mlp_hidden=[8]", "--format", "quiet"]


def _holder(out, seconds: float) -> subprocess.Popen:
    """Another process that holds the lock of ``out`` for ``seconds``."""
    code = (f"import sys, time; from pfl_cli.artifacts import claim_out; claim_out({str(out)!r}); "
            f"print('held', flush=True); time.sleep({seconds})")
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True, env=ENV)
    assert proc.stdout.readline().strip() == "held"
    return proc


def _no_leftovers(parent, name: str) -> list[str]:
    return sorted(p.name for p in parent.iterdir() if p.name.startswith(f".{name}."))


def test_a_second_writer_is_refused_while_the_first_holds_out(cli, tmp_path):
    out = tmp_path / "part"
    holder = _holder(out, 30)
    try:
        res = cli("partition", "--out", out, "--num-clients", "5")
        assert res.code == 2 and res.err == (f"pflx: error: --out {out} is being written by process {holder.pid}; "
                                             "wait for it to finish (or pass --wait), or choose another --out.\n")
        assert not out.exists()
    finally:
        holder.kill()
        holder.wait()
    # The OS released the dead holder's lock: the next writer goes ahead.
    assert cli("partition", "--out", out, "--num-clients", "5").code == 0
    assert _no_leftovers(tmp_path, "part") == []


def test_wait_waits_for_the_other_writer(cli, tmp_path):
    out = tmp_path / "part"
    holder = _holder(out, 1.0)
    start = time.monotonic()
    res = cli("partition", "--out", out, "--num-clients", "5", "--wait", "--format", "json")
    assert res.code == 0 and time.monotonic() - start >= 0.5 and holder.wait() == 0
    assert json.loads(res.out)["up_to_date"] is False
    read_artifact(out, "partition")


def test_stale_temp_folders_of_dead_writers_are_removed(cli, tmp_path):
    out = tmp_path / "part"
    for stale in (".part.tmp-dead1", ".part.old-dead2"):
        (tmp_path / stale / "sub").mkdir(parents=True)
        (tmp_path / stale / "sub" / "clients.npz").write_bytes(b"half")
    (tmp_path / ".partx.tmp-other").mkdir()  # another --out's temp folder is not ours to remove
    lock_file(out).write_text("12345\n")  # a lock file a killed writer left
    assert cli("partition", "--out", out, "--num-clients", "5").code == 0
    assert _no_leftovers(tmp_path, "part") == [] and (tmp_path / ".partx.tmp-other").is_dir()
    read_artifact(out, "partition")


@pytest.mark.parametrize("make_out,message", [
    (lambda d: d / ("n" * 300), "File name too long (the name has 300 characters)"),
    (lambda d: d / "file" / "out", "parent"),
    (lambda d: d / "dangling", "is a dangling symbolic link"),
    (lambda d: __import__("pathlib").Path("/proc/pflx-no-such/out"), "cannot create and rename a directory"),
    (lambda d: d / "file" / "..", "give the artifact directory a name of its own"),
])
def test_the_output_location_is_checked_before_any_input_is_read(cli, tmp_path, make_out, message):
    (tmp_path / "file").write_text("x")
    (tmp_path / "dangling").symlink_to(tmp_path / "nowhere")
    out = make_out(tmp_path)
    # Inputs that do not exist: the --out problem must be what is reported.
    for args in (["partition", "--dataset", "npz:/no/such.npz"], ["train", "--partition", tmp_path / "nope"],
                 ["mdm-fit", "--partition", tmp_path / "nope"], ["simulate", "--model", tmp_path / "nope"],
                 ["cluster", "--partition", tmp_path / "nope", "--k", "2", "--server-data", "builtin:digits", "--no-dp"],
                 ["predict", "--model", tmp_path / "nope", "--partition", tmp_path / "nope"]):
        res = cli(*args, "--out", out)
        assert res.code == 2 and message in res.err and res.err.count("\n") == 1, (args, res.err)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["dangling", "file"]


def test_a_refused_run_leaves_no_parent_directories_it_made(cli, tmp_path):
    res = cli("partition", "--num-clients", "0", "--out", tmp_path / "runs" / "a" / "part")
    assert res.code == 2 and list(tmp_path.iterdir()) == []
    assert cli("partition", "--num-clients", "3", "--out", tmp_path / "runs" / "a" / "part").code == 0
    read_artifact(tmp_path / "runs" / "a" / "part", "partition")


def test_errors_are_one_json_object_on_stdout_with_format_json(cli, tmp_path):
    res = cli("partition", "--out", tmp_path / "p", "--num-clients", "0", "--format", "json")
    assert res.code == 2 and res.err.count("\n") == 1
    doc = json.loads(res.out)
    assert doc == {"error": res.err[len("pflx: error: "):].strip(), "exit_code": 2, "stage": "partition"}
    res = cli("train", "--format=json", "--bogus")
    assert res.code == 2 and json.loads(res.out)["stage"] == "train" and "No such option" in json.loads(res.out)["error"]
    res = cli("privacy-account", "--format", "json", "-z", "1", "--steps", "10", "--delta", "2")
    assert res.code == 2 and json.loads(res.out)["exit_code"] == 2
    assert cli("partition", "--out", tmp_path / "p", "--num-clients", "0").out == ""  # human: stderr only


def _rewrite(artifact, name: str, doc) -> None:
    """Edit a payload file and re-hash it in the manifest, as a careful forger would."""
    (artifact / name).write_text(json.dumps(doc))
    manifest = json.loads((artifact / "manifest.json").read_text())
    for out in manifest["outputs"]:
        if out["path"] == name:
            out["sha256"], out["bytes"] = sha256_file(artifact / name), (artifact / name).stat().st_size
    (artifact / "manifest.json").write_text(json.dumps(manifest))


@pytest.mark.parametrize("path,value,message", [
    (("count",), -3, "SelfComposedDpEvent.count must be an integer >= 1; got -3"),
    (("count",), 2.5, "SelfComposedDpEvent.count must be an integer >= 1; got 2.5"),
    (("event", "sampling_probability"), 0.0, "sampling_probability must be a probability in (0, 1]; got 0.0"),
    (("event", "sampling_probability"), 1.5, "sampling_probability must be a probability in (0, 1]; got 1.5"),
    (("event", "event", "noise_multiplier"), 0, "noise_multiplier must be a finite number > 0; got 0"),
    (("event", "event", "noise_multiplier"), -1.1, "noise_multiplier must be a finite number > 0; got -1.1"),
])
def test_privacy_account_refuses_a_ledger_that_does_not_validate(cli, tmp_path, path, value, message):
    ledger = tmp_path / "acct"
    assert cli("privacy-account", "-z", "1.1", "-q", "0.01", "--steps", "100", "--delta", "1e-5",
               "--out", ledger, "--format", "quiet").code == 0
    doc = json.loads((ledger / "privacy.json").read_text())
    event = doc["events"][0]
    for key in path[:-1]:
        event = event[key]
    event[path[-1]] = value
    _rewrite(ledger, "privacy.json", doc)
    res = cli("privacy-account", ledger)
    assert res.code == 2 and message in res.err and res.err.count("\n") == 1 and "privacy.json: events[0]" in res.err


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """A partition and a 4-round pefll run; its final checkpoint is the material for the tests below."""
    from pfl_cli.cli.app import main

    root = tmp_path_factory.mktemp("hardening")
    assert main(["partition", "--out", str(root / "part"), "--num-clients", "8", "--classes-per-client", "2",
                 "--format", "quiet"]) == 0
    assert main(["train", "--partition", str(root / "part"), "--out", str(root / "run"), *TRAIN]) == 0
    return root


def _place(trained, tmp_path, state):
    out = tmp_path / "again"
    ck = checkpoint_dir(out) / "state.pt"
    ck.parent.mkdir()
    torch.save(state, ck)
    return out, ck


def _train(cli, trained, out, *extra):
    return cli("train", "--partition", trained / "part", "--out", out, *TRAIN, *extra)


def test_a_corrupted_checkpoint_is_refused_naming_the_file(cli, trained, tmp_path):
    state = torch.load(trained / "run" / "checkpoint" / "state.pt", weights_only=True)
    name, tensor = next(iter(state["algorithm"]["weights"].items())) if "weights" in state["algorithm"] else (None, None)
    flipped = {**state, "loss_acc": [state["loss_acc"][0] + 1e-9, state["loss_acc"][1]]}  # one changed number
    out, ck = _place(trained, tmp_path, flipped)
    res = _train(cli, trained, out, "--resume")
    assert res.code == 2 and f"checkpoint {ck} is corrupt" in res.err and res.err.count("\n") == 1
    assert ck.is_file() and not out.exists()
    # Without --resume it is not discarded silently (issue 34, item 2); --force restarts and replaces it.
    res = _train(cli, trained, out)
    assert res.code == 2 and "--force" in res.err and ck.is_file() and not out.exists()
    assert _train(cli, trained, out, "--force").code == 0
    assert (out / "model.pt").read_bytes() == (trained / "run" / "model.pt").read_bytes()


def test_a_flipped_byte_in_the_file_is_refused(cli, trained, tmp_path):
    data = bytearray((trained / "run" / "checkpoint" / "state.pt").read_bytes())
    refused = 0
    for at in range(len(data) // 7, len(data), len(data) // 7):  # bytes spread over the whole file
        out = tmp_path / f"b{at}"
        ck = checkpoint_dir(out) / "state.pt"
        ck.parent.mkdir()
        ck.write_bytes(bytes(data[:at]) + bytes([data[at] ^ 0x01]) + bytes(data[at + 1:]))
        res = _train(cli, trained, out, "--resume")
        assert res.code in (0, 2) and res.err.count("\n") <= 2, res.err
        if res.code == 2:
            assert str(ck) in res.err and ("corrupt" in res.err)
            refused += 1
        else:  # a byte the payload does not depend on (zip padding): the result is the same
            assert (out / "model.pt").read_bytes() == (trained / "run" / "model.pt").read_bytes()
    assert refused >= 4


def test_the_round_counter_must_agree_with_the_history(cli, trained, tmp_path):
    state = torch.load(trained / "run" / "checkpoint" / "state.pt", weights_only=True)
    body = {k: v for k, v in state.items() if k != "sha256"}
    out, ck = _place(trained, tmp_path, {**body, "round": 3, "sha256": state["sha256"]})  # edited, not resealed
    assert "is corrupt" in _train(cli, trained, out, "--resume").err
    # Edited and resealed: the history (evaluations up to round 4) contradicts round 2.
    torch.save(seal_checkpoint({**body, "round": 2}, body["fingerprint"]), ck)
    res = _train(cli, trained, out, "--resume")
    assert res.code == 2 and "claims round 2, but its history ends at round 4" in res.err and str(ck) in res.err
    torch.save(seal_checkpoint({**body, "round": 9}, body["fingerprint"]), ck)  # beyond --rounds 4
    assert "claims round 9" in _train(cli, trained, out, "--resume").err


def test_ctrl_c_in_train_says_what_was_kept_and_exits_130(trained, tmp_path):
    out = tmp_path / "long"
    cmd = [sys.executable, "-m", "pfl_cli", "train", "--partition", str(trained / "part"), "--out", str(out),
           "--rounds", "100000", "--eval-every", "2", "--local-steps", "2", "--set", "hyper_hidden=8",
           "--set", "mlp_hidden=[8]"]
    # A shell starts a background job (`make test &`) with SIGINT ignored, and a child inherits that:
    # pflx would never see the Ctrl-C. The child gets the default disposition back, as a terminal's
    # foreground process has it (issue 34, item 16).
    proc = subprocess.Popen(cmd, env=ENV, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    ck = checkpoint_dir(out) / "state.pt"
    deadline = time.monotonic() + 60
    while not ck.is_file():
        assert proc.poll() is None and time.monotonic() < deadline
        time.sleep(0.05)
    proc.send_signal(signal.SIGINT)
    stdout, stderr = proc.communicate(timeout=60)
    assert proc.returncode == 130, stderr
    # One error line, after the progress lines of the rounds that ran (stderr is a pipe here).
    lines = [line for line in stderr.splitlines() if line.strip() and not line.startswith("train: round ")]
    assert len(lines) == 1 and "Traceback" not in stderr
    assert lines[0].startswith("pflx: error: interrupted; nothing was written to --out, and the checkpoint of round ")
    assert f"is kept at {ck}: run the same command with --resume" in lines[0]
    assert not out.exists() and ck.is_file() and not lock_file(out).exists()


# ---------------------------------------------------------------------------- smaller items of issue 12
def test_values_that_were_accepted_with_exit_0_are_refused(cli, trained, tmp_path, monkeypatch):
    import importlib.util

    import numpy as np

    res = cli("predict", "--model", trained / "run", "--partition", trained / "part", "--clients", "train",
              "--set", "batch_size=0", "--out", tmp_path / "pred")
    assert res.code == 2 and "batch_size must be an integer >= 1" in res.err
    cluster = ["cluster", "--partition", trained / "part", "--server-data", "builtin:digits", "--k", "2", "--no-dp",
               "--out", tmp_path / "km"]
    res = cli(*cluster, "--min-server-weight", "-1")
    assert res.code == 2 and "min_server_weight must be a number >= 0; got -1.0." in res.err
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "matplotlib" else real(name, *a))
    res = cli(*cluster, "--k-candidates", "1-3")
    assert res.code == 2 and "--k-candidates (k_selection.png) draws with matplotlib, which is not installed" in res.err
    assert "pip install 'pflx[plot]'" in res.err
    monkeypatch.undo()
    np.savez(tmp_path / "d.npz", x=np.ones((6, 2)), y=np.arange(6) % 2, pool=np.full(6, np.nan))
    res = cli("partition", "--dataset", f"npz:{tmp_path / 'd.npz'}", "--num-clients", "2", "--out", tmp_path / "p")
    assert res.code == 2 and "pool must hold 0 (train) or 1 (test) for every sample; got [nan]." in res.err
    (tmp_path / "bad.csv").write_bytes(b"a,label\n1,0\n\xff,1\n")
    res = cli("partition", "--dataset", f"csv:{tmp_path / 'bad.csv'}?label=label", "--out", tmp_path / "p")
    assert res.code == 2 and "not UTF-8 text (byte 0xff at offset 12)" in res.err
    assert not any(p.name in ("pred", "km", "p") for p in tmp_path.iterdir())


@pytest.mark.parametrize("args,size", [
    (["mdm-fit", "--partition", "{part}", "--components", "2", "--max-samples", "1000000000000"], "TiB"),
    (["simulate", "--model", "{mdm}", "--num-clients", "100000000000000"], "PiB"),
    (["train", "--partition", "{part}", "--set", "hyper_hidden=10000000000"], "PiB"),
    (["partition", "--dataset", "npz:{npz}?num_classes=100000000000"], "TiB"),
])
def test_memory_sized_requests_are_refused_with_the_size(cli, trained, tmp_path, args, size):
    import numpy as np

    np.savez(tmp_path / "d.npz", x=np.ones((6, 2)), y=np.arange(6) % 2)
    mdm = tmp_path / "mdm"
    if "{mdm}" in args[2]:
        assert cli("mdm-fit", "--partition", trained / "part", "--components", "1", "--rounds", "2", "--out", mdm,
                   "--format", "quiet").code == 0
    argv = [a.format(part=trained / "part", mdm=mdm, npz=tmp_path / "d.npz") for a in args]
    res = cli(*argv, "--out", tmp_path / "big")
    assert res.code == 2 and "would need" in res.err and f"{size} of memory, more than this machine's" in res.err
    assert not (tmp_path / "big").exists()
