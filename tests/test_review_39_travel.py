"""Review of "artifacts travel" (issue 39) at its edges: symbolic links on the way to the data or to the
partition. Each case runs real commands (``pflx partition`` through :func:`main`) on a temporary tree and
reads the partition back with :func:`pfl_cli.data.location.locate_dataset`, the lookup every stage uses.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest

from pfl_cli.cli.app import main
from pfl_cli.data.location import locate_dataset
from pfl_cli.errors import DatasetError
from pfl_cli.formats import sha256_file

pytestmark = pytest.mark.skipif(not hasattr(os, "symlink"), reason="needs symbolic links")


def _save(path: Path, n: int, seed: int) -> None:
    rng = np.random.default_rng(seed)
    path.parent.mkdir(parents=True, exist_ok=True)
    np.savez(path, x=rng.normal(size=(n, 6)).astype("float32"), y=np.arange(n) % 3)


def _partition(cwd: Path, spec: str, out: str) -> dict:
    old = os.getcwd()
    os.chdir(cwd)
    try:
        assert main(["partition", "--dataset", spec, "--num-clients", "3", "--out", out]) == 0
    finally:
        os.chdir(old)
    return json.loads((cwd / out / "dataset.json").read_text())


def test_dotdot_after_a_link_records_the_file_read(tmp_path, monkeypatch):
    """``npz:data/lnk/../g.npz`` with ``data/lnk -> /elsewhere/sub`` reads ``/elsewhere/g.npz`` (the kernel
    resolves ``..`` through the link); ``os.path.abspath`` folds it to ``data/g.npz``. Before the fix the
    partition recorded that other file (path and bytes digest) beside the loaded data's digest: every
    later stage refused the untouched data ("no longer matches the partition")."""
    monkeypatch.delenv("PFLX_DATA", raising=False)
    read, decoy = tmp_path / "elsewhere" / "g.npz", tmp_path / "proj" / "data" / "g.npz"
    _save(read, 60, 0)
    _save(decoy, 45, 1)
    (tmp_path / "elsewhere" / "sub").mkdir()
    (tmp_path / "proj" / "data" / "lnk").symlink_to(tmp_path / "elsewhere" / "sub")
    info = _partition(tmp_path / "proj", "npz:data/lnk/../g.npz", "part")
    assert info["num_samples"] == 60
    assert os.path.samefile(info["source"]["path"], read), info["source"]
    assert info["source"]["sha256"] == sha256_file(read)
    ds = locate_dataset(info, tmp_path / "proj" / "part", env={})
    assert len(ds.y) == 60


def test_partition_under_a_linked_runs_dir_finds_the_moved_tree(tmp_path):
    """``proj/runs -> /scratch/runs`` (a cluster's scratch space), data in ``proj/data``: the recorded
    relative path ``../../data/g.npz`` is meant from ``proj/runs/part``. After ``proj`` moves, the kernel
    resolves ``proj2/runs/part/../..`` to /scratch's parent. Before the fix: "not found (tried ...,
    proj2/runs/part/../../data/g.npz)" though that path, read as written, holds the data."""
    _save(tmp_path / "proj" / "data" / "g.npz", 50, 2)
    (tmp_path / "scratch" / "runs").mkdir(parents=True)
    (tmp_path / "proj" / "runs").symlink_to(tmp_path / "scratch" / "runs")
    info = _partition(tmp_path / "proj", "npz:data/g.npz", "runs/part")
    assert info["source"]["relative_path"] == os.path.join("..", "..", "data", "g.npz")
    shutil.move(str(tmp_path / "proj"), str(tmp_path / "proj2"))
    ds = locate_dataset(info, tmp_path / "proj2" / "runs" / "part", env={})
    assert len(ds.y) == 50
    (tmp_path / "proj2" / "data" / "g.npz").unlink()  # and gone, it is still refused
    with pytest.raises(DatasetError, match="not found"):
        locate_dataset(info, tmp_path / "proj2" / "runs" / "part", env={})


def test_pflx_data_skips_a_wrong_file_of_the_same_name(tmp_path):
    """``PFLX_DATA=a:b`` with a different ``g.npz`` in ``a``: the copy in ``b`` is used; with ``a`` alone the
    request is refused naming ``a``'s digest."""
    _save(tmp_path / "proj" / "data" / "g.npz", 40, 3)
    info = _partition(tmp_path / "proj", "npz:data/g.npz", "part")
    _save(tmp_path / "a" / "g.npz", 40, 4)
    (tmp_path / "b").mkdir()
    shutil.move(str(tmp_path / "proj" / "data" / "g.npz"), str(tmp_path / "b" / "g.npz"))
    env = {"PFLX_DATA": os.pathsep.join([str(tmp_path / "a"), str(tmp_path / "b")])}
    ds = locate_dataset(info, tmp_path / "proj" / "part", env=env)
    np.testing.assert_array_equal(ds.x, np.load(tmp_path / "b" / "g.npz")["x"])
    with pytest.raises(DatasetError, match=r"a[/\\]g\.npz \(PFLX_DATA"):
        locate_dataset(info, tmp_path / "proj" / "part", env={"PFLX_DATA": str(tmp_path / "a")})


@pytest.mark.skipif(shutil.which("make") is None, reason="needs make")
def test_quickstart_makefile_runs_under_make_C(tmp_path):
    """``make -C recipes ROOT=...`` (the form recipes/compare/Makefile documents) resolves the recipes beside
    the Makefile. Before: "No rule to make target 'recipes/quickstart/digits-partition.yaml'" (the recipes were
    named from the repository root). ``make -n`` prints the commands and runs none."""
    repo = Path(__file__).resolve().parents[1]
    run = subprocess.run(["make", "-n", "-C", str(repo / "recipes"), f"ROOT={tmp_path}", "PFLX=pflx"],
                         cwd=tmp_path, capture_output=True, text=True)
    assert run.returncode == 0, run.stderr
    configs = re.findall(r"--config (\S+)", run.stdout)
    assert len(configs) == 4, run.stdout
    assert all((repo / "recipes" / c).is_file() for c in configs), configs


def test_an_artifact_in_a_linked_runs_dir_finds_its_inputs_after_a_move(tmp_path, monkeypatch, capsys):
    """``proj/runs -> /scratch/runs``; the partition in ``proj/part``, the model in ``proj/runs/model`` (its
    recorded relative path ``../../part``). After ``proj`` moves, ``pflx show`` from another directory finds
    the partition in the moved tree (:func:`pfl_cli.readers.input_location`). Before the fix the kernel went up
    from /scratch/runs/model and show said "missing"."""
    from pfl_cli.readers import input_location, read_artifact

    (tmp_path / "scratch" / "runs").mkdir(parents=True)
    (tmp_path / "proj").mkdir()
    (tmp_path / "proj" / "runs").symlink_to(tmp_path / "scratch" / "runs")
    monkeypatch.chdir(tmp_path / "proj")
    assert main(["partition", "--num-clients", "4", "--out", "part", "--format", "quiet"]) == 0
    assert main(["train", "--partition", "part", "--algorithm", "fedavg", "--rounds", "1", "--local-steps", "1",
                 "--set", "mlp_hidden=[8]", "--device", "cpu", "--out", "runs/model", "--format", "quiet"]) == 0
    shutil.move(str(tmp_path / "proj"), str(tmp_path / "proj2"))
    (tmp_path / "elsewhere").mkdir()
    monkeypatch.chdir(tmp_path / "elsewhere")
    model = read_artifact(tmp_path / "proj2" / "runs" / "model", "train")
    ref = next(i for i in model.manifest["inputs"] if i["stage"] == "partition")
    assert ref["relative_path"] == os.path.join("..", "..", "part")
    assert os.path.samefile(input_location(model, ref), tmp_path / "proj2" / "part")
    capsys.readouterr()
    assert main(["show", str(tmp_path / "proj2" / "runs" / "model"), "--format", "json"]) == 0
    shown = json.loads(capsys.readouterr().out)
    status = {i["stage"]: i.get("status") for i in shown["inputs"]}
    assert status["partition"] == "ok", shown["inputs"]


def test_a_dp_model_copied_away_alone_finds_its_partition_not_a_namesake(tmp_path, monkeypatch, capsys):
    """A --dp model withholds its partition's hash. Copied alone elsewhere and shown from a directory holding
    an unrelated artifact named like the partition was typed (``part``, here a train artifact), show must find
    the partition where it was (the recorded ``absolute_path``), not take the namesake of another stage.
    Before the fix: "unreadable: input part: expected a 'partition' artifact, found stage 'train'"."""
    (tmp_path / "made").mkdir()
    monkeypatch.chdir(tmp_path / "made")
    small = ["--rounds", "1", "--local-steps", "1", "--set", "mlp_hidden=[8]", "--device", "cpu", "--format", "quiet"]
    assert main(["partition", "--num-clients", "4", "--out", "part", "--format", "quiet"]) == 0
    assert main(["train", "--partition", "part", "--algorithm", "fedavg", *small, "--set", "normalize=false",
                 "--dp", "eps=4,clip=1,population=100,noise=seeded", "--out", "model-dp"]) == 0
    assert main(["train", "--partition", "part", "--algorithm", "fedavg", *small, "--out", "model"]) == 0
    (tmp_path / "alone").mkdir()
    (tmp_path / "cwd").mkdir()
    shutil.copytree(tmp_path / "made" / "model-dp", tmp_path / "alone" / "model-dp")
    shutil.copytree(tmp_path / "made" / "model", tmp_path / "cwd" / "part")  # a namesake of another stage
    monkeypatch.chdir(tmp_path / "cwd")
    capsys.readouterr()
    assert main(["show", str(tmp_path / "alone" / "model-dp"), "--format", "json"]) == 0
    shown = json.loads(capsys.readouterr().out)
    status = {i["stage"]: str(i.get("status")) for i in shown["inputs"]}
    assert status["partition"].startswith("ok"), shown["inputs"]


def test_a_dp_study_in_a_linked_runs_dir_composes_with_the_training_it_chose(tmp_path, monkeypatch, capsys):
    """``tune --dp`` writes its study to ``runs/study`` with ``runs -> /scratch/runs``; ``train --dp --config
    runs/study/best.yaml --partition part`` on the study's own partition must compose the study's ledger
    (docs/privacy/release-contract.md). Before the fix the study's partition was looked for at /scratch/part
    (the recorded ``../../part`` read from the resolved study): only a note, and privacy.json said this run's
    epsilon alone, 4.0, for a total of 6.0."""
    from pfl_cli.readers import read_artifact, read_ledger

    (tmp_path / "scratch" / "runs").mkdir(parents=True)
    (tmp_path / "proj").mkdir()
    (tmp_path / "proj" / "runs").symlink_to(tmp_path / "scratch" / "runs")
    monkeypatch.chdir(tmp_path / "proj")
    small = ["--rounds", "1", "--local-steps", "1", "--set", "mlp_hidden=[8]", "--set", "normalize=false",
             "--device", "cpu", "--format", "quiet"]
    assert main(["partition", "--num-clients", "6", "--out", "part", "--format", "quiet"]) == 0
    assert main(["tune", "--partition", "part", "--algorithm", "fedavg", "--trials", "2", *small, "--space",
                 "lr=choice:0.01,0.1", "--sampler", "random", "--dp", "eps=4,clip=1,population=100,noise=seeded",
                 "--out", "runs/study"]) == 0
    assert main(["train", "--partition", "part", "--config", "runs/study/best.yaml", "--device", "cpu",
                 "--format", "quiet", "--out", "runs/final"]) == 0
    study_doc, study = read_ledger(read_artifact(tmp_path / "proj" / "runs" / "study", "tune"), "--config")
    final_doc, final = read_ledger(read_artifact(tmp_path / "proj" / "runs" / "final", "train"), "--model")
    assert final.events[:len(study.events)] == study.events, "the study's events come first, then the run's"
    assert len(final.events) > len(study.events)
    assert final_doc["epsilon"] > study_doc["epsilon"] > 4.0
