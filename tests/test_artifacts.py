import json

import numpy as np
import pytest

from pfl_cli.artifacts import ArtifactWriter, load_npz, read_artifact, save_npz, sha256_file
from pfl_cli.errors import ArtifactError, InputError


def _write(out, config=None, force=False, payload=b"1,2\n", inputs=()):
    writer = ArtifactWriter(out, stage="partition", config=config or {"a": 1}, seed=0, inputs=inputs, force=force, argv=["pflx"])
    if writer.up_to_date():
        return "noop"
    with writer:
        writer.path("table.csv").write_bytes(payload)
        writer.save_npz("arrays.npz", x=np.arange(5))
    return "wrote"


def test_manifest_is_written_last_and_lists_outputs(tmp_path):
    out = tmp_path / "art"
    assert _write(out) == "wrote"
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["tool"] == "pflx" and manifest["schema"] == 1 and manifest["stage"] == "partition"
    assert [o["path"] for o in manifest["outputs"]] == ["arrays.npz", "table.csv"]
    assert manifest["outputs"][1]["sha256"] == sha256_file(out / "table.csv")
    assert manifest["outputs"][1]["bytes"] == 4
    assert not list(tmp_path.glob(".art.tmp-*"))


def test_rerun_with_same_config_is_noop_and_different_needs_force(tmp_path):
    out = tmp_path / "art"
    _write(out)
    before = (out / "manifest.json").read_text()
    assert _write(out) == "noop"
    assert (out / "manifest.json").read_text() == before
    with pytest.raises(ArtifactError, match="already holds a different 'partition' artifact. Pass --force"):
        _write(out, config={"a": 2})
    assert _write(out, config={"a": 2}, force=True) == "wrote"
    assert json.loads((out / "manifest.json").read_text())["config"] == {"a": 2}


def test_changed_input_hash_reruns(tmp_path):
    out = tmp_path / "art"
    _write(out, inputs=[{"path": "d", "stage": "dataset", "sha256": "aa"}])
    with pytest.raises(ArtifactError, match="different"):
        _write(out, inputs=[{"path": "d", "stage": "dataset", "sha256": "bb"}])


def test_failed_build_leaves_nothing(tmp_path):
    out = tmp_path / "art"
    writer = ArtifactWriter(out, stage="partition", config={}, seed=0, argv=["pflx"])
    with pytest.raises(RuntimeError):
        with writer:
            writer.save_json("x.json", {"a": 1})
            raise RuntimeError("killed")
    assert not out.exists()
    assert list(tmp_path.iterdir()) == []


def test_out_is_a_file(tmp_path):
    target = tmp_path / "file"
    target.write_text("x")
    with pytest.raises(InputError, match="is a file"):
        ArtifactWriter(target, stage="partition", config={}, seed=0)


def test_non_artifact_directory_is_not_overwritten(tmp_path):
    out = tmp_path / "art"
    out.mkdir()
    (out / "notes.txt").write_text("mine")
    with pytest.raises(ArtifactError, match="files that are not this artifact"):
        _write(out)
    assert (out / "notes.txt").read_text() == "mine"


def test_reader_checks_stage_schema_and_hashes(tmp_path):
    out = tmp_path / "art"
    _write(out)
    assert read_artifact(out, "partition").stage == "partition"
    with pytest.raises(ArtifactError, match="expected a 'mdm-fit' artifact, found stage 'partition'"):
        read_artifact(out, "mdm-fit", flag="--model")
    (out / "table.csv").write_bytes(b"tampered")
    with pytest.raises(ArtifactError, match="does not match its sha256"):
        read_artifact(out, "partition")
    with pytest.raises(ArtifactError, match="no such directory"):
        read_artifact(tmp_path / "missing", "partition", flag="--partition")
    (tmp_path / "empty").mkdir()
    with pytest.raises(ArtifactError, match="not a pflx artifact"):
        read_artifact(tmp_path / "empty", "partition")
    manifest = json.loads((out / "manifest.json").read_text())
    manifest["schema"] = 99
    (out / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(ArtifactError, match="schema 99 is not supported"):
        read_artifact(out, "partition")


def test_npz_bytes_are_deterministic_and_pickle_free(tmp_path):
    a, b = tmp_path / "a.npz", tmp_path / "b.npz"
    save_npz(a, x=np.arange(10), y=np.array(["u1", "u2"]))
    save_npz(b, x=np.arange(10), y=np.array(["u1", "u2"]))
    assert a.read_bytes() == b.read_bytes()
    assert load_npz(a)["y"].tolist() == ["u1", "u2"]
    with pytest.raises(TypeError, match="never pickles"):
        save_npz(tmp_path / "c.npz", x=np.array([{}], dtype=object))


def test_the_out_lock_lives_from_the_first_writer_to_the_final_rename(tmp_path):
    import fcntl
    import os

    from pfl_cli.artifacts import lock_file

    out = tmp_path / "art"
    early = ArtifactWriter(out, stage="partition", config={}, seed=0)  # the "--out problems first" writer
    assert lock_file(out).read_text() == f"{os.getpid()}\n"
    fd = os.open(lock_file(out), os.O_RDWR)
    try:  # another open file description cannot take it meanwhile
        with pytest.raises(BlockingIOError):
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    finally:
        os.close(fd)
    writer = ArtifactWriter(out, stage="partition", config={"a": 1}, seed=0)  # same process: shares the lock
    assert not writer.up_to_date() and early is not writer
    removed = []
    with writer:
        writer.save_json("x.json", {"a": 1})
        writer.after_swap(lambda: removed.append(lock_file(out).exists()))
    assert removed == [True]  # cleanups run while the lock is still held
    assert not lock_file(out).exists() and sorted(p.name for p in tmp_path.iterdir()) == ["art"]
