"""Artifacts travel (DESIGN.md section 7): every stage reads its inputs from any working directory, and after
the artifact directories are moved, together with their input data, to another place (the old one deleted),
with the same result.

The suite is generated from the CLI: :data:`CHAIN` says how each command runs on tiny inputs, and
:func:`test_every_command_is_in_the_chain` fails for a command registered without an entry, so a new stage
joins the suite the day it is added. The chain starts from an ``npz:`` dataset given by a path relative to the
directory ``partition`` ran in (issue 39, defect 11: ``train`` from another directory failed with "no such
file"), goes through ``simulate``'s output, and runs every stage that reads artifacts three times: where it
was made, from another working directory, and after the whole tree has moved. Each run's payload must equal
the first's, file by file (sha256 from its manifest).
"""

from __future__ import annotations

import csv
import io
import json
import os
import shutil
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest

from pfl_cli.cli.app import _subcommand_names, main

SMALL = ["--rounds", "2", "--eval-every", "1", "--local-steps", "2", "--set", "mlp_hidden=[8]", "--device", "cpu"]


@dataclass(frozen=True)
class Step:
    """One command of the chain: its arguments (paths relative to the tree's root) and what it writes."""

    args: tuple[str, ...]
    out: str | None = None       # the artifact it writes (None: it prints its result only)
    reads: bool = True           # it reads an artifact or the dataset (so it runs again from elsewhere)
    slow: bool = False
    code: int = 0                # a refusal (exit 2) must be the same refusal from anywhere


# Every command of `pflx`, in chain order. A command that writes nothing and reads nothing says why.
CHAIN: dict[str, Step] = {
    "partition": Step(("partition", "--dataset", "npz:data/digits.npz", "--classes-per-client", "2",
                       "--num-clients", "8", "--holdout-clients", "2", "--test-fraction", "0.3"), "part", reads=False),
    "mdm-fit": Step(("mdm-fit", "--partition", "part", "--components", "1", "--rounds", "3", "--restarts", "1"),
                    "mdm"),
    "simulate": Step(("simulate", "--model", "mdm", "--dataset", "npz:data/digits.npz", "--num-clients", "6",
                      "--holdout-clients", "1"), "sim"),
    "train": Step(("train", "--partition", "part", "--algorithm", "fedavg", *SMALL), "model"),
    "train-sim": Step(("train", "--partition", "sim", "--algorithm", "fedavg", *SMALL), "model-sim"),
    "predict": Step(("predict", "--model", "model", "--partition", "part", "--clients", "holdout"), "pred"),
    "compare": Step(("compare", "model", "pred"), "cmp"),
    "cluster": Step(("cluster", "--partition", "part", "--server-data", "npz:data/server.npz", "--k", "3",
                     "--dp", "eps=1,noise=seeded", "--reference-n-init", "1"), "km"),
    "privacy-account": Step(("privacy-account", "km"), "acct"),
    "attack": Step(("attack", "--model", "model", "--partition", "part", "--images", "2", "--batch-size", "1",
                    "--attack", "dlg", "--iterations", "3", "--device", "cpu"), "att"),
    "train-dp": Step(("train", "--partition", "part", "--algorithm", "fedavg", *SMALL, "--set", "normalize=false",
                      "--dp", "eps=4,clip=1,population=100,noise=seeded"), "model-dp", slow=True),
    "predict-dp": Step(("predict", "--model", "model-dp", "--partition", "part", "--clients", "holdout"), "pred-dp",
                       slow=True),  # a --dp model records no training samples: its partition is read from its manifest
    "predict-dp-sim": Step(("predict", "--model", "model-dp", "--partition", "sim", "--clients", "holdout"),
                           "pred-dp-sim", slow=True, code=2),  # not its partition: compared with the one it names
    "partition-rot": Step(("partition", "--dataset", "npz:data/images.npz", "--num-clients", "6", "--holdout-clients",
                           "2", "--rotations", "0,90,180,270"), "rot", reads=False, slow=True),
    "train-rot": Step(("train", "--partition", "rot", "--algorithm", "fedavg", *SMALL), "model-rot", slow=True),
    "predict-rot": Step(("predict", "--model", "model-rot", "--partition", "rot", "--clients", "holdout"), "pred-rot",
                        slow=True),  # a rotated partition reads its unrotated samples again to compare them
    "tune": Step(("tune", "--partition", "part", "--algorithm", "fedavg", "--trials", "2", *SMALL,
                  "--space", "lr=choice:0.01,0.1", "--sampler", "grid"), "tune", slow=True),
    "show": Step(("show", "--lineage", "pred")),
    "flower": Step(("flower", "app", "--partition", "part", "--config", "fedavg.yaml"), "app"),
}
NOT_IN_CHAIN = {"algorithms": "lists the registry: reads no artifact and writes none"}


def test_every_command_is_in_the_chain():
    """A command registered without a CHAIN entry (or a reason in NOT_IN_CHAIN) fails here."""
    commands = {step.args[0] for step in CHAIN.values()}
    assert _subcommand_names() - set(NOT_IN_CHAIN) <= commands, "add the new command to CHAIN"


def _data(root: Path) -> None:
    from pfl_cli.data.builtin import _digits_arrays

    x, y = _digits_arrays()
    (root / "data").mkdir(parents=True)
    np.savez(root / "data" / "digits.npz", x=x[:400], y=y[:400])
    np.savez(root / "data" / "server.npz", x=x[400:460])
    np.savez(root / "data" / "images.npz", x=x[:300].reshape(-1, 8, 8), y=y[:300])
    (root / "fedavg.yaml").write_text("algorithm: fedavg\nrounds: 2\nval_fraction: 0\n")


def _run(name: str, step: Step, cwd: Path, root: Path, out: str | None, monkeypatch, capsys) -> dict:
    """Run ``step`` from ``cwd`` over the tree at ``root`` (given relative to ``cwd``), writing ``out``."""
    monkeypatch.chdir(cwd)
    prefix = Path(os.path.relpath(root, cwd))
    args, read_paths = [], {"part", "mdm", "sim", "model", "model-dp", "pred", "km", "rot", "model-rot", "fedavg.yaml"}
    for a in step.args:
        if a in read_paths:
            a = str(prefix / a)
        elif a.startswith("npz:"):
            a = f"npz:{prefix / a[4:]}"
        args.append(a)
    if out is not None:
        args += ["--out", str(out)]
    capsys.readouterr()
    code = main([*args, "--format", "json"])
    captured = capsys.readouterr()
    assert code == step.code, f"{name} from {cwd}: {captured.err}"
    if code:  # the refusal, its paths as typed from the tree's root
        return {"error": captured.err.replace(f"{prefix}{os.sep}" if str(prefix) != "." else "\0", "")}
    return json.loads(captured.out) if captured.out.strip() else {}


def _without_location(doc, name: str, typed: str):
    """A JSON document less where things were: the paths a user typed (``typed``, the tree's root as given, is
    cut from every string: a predict artifact names its model, compare's table its RUNs, privacy-account's
    statement its ledgers, each as typed) and the dataset's location in dataset.json (``spec``, ``spec_given``,
    ``source.path``, ``source.relative_path``; the digests stay)."""
    if isinstance(doc, list):
        return [_without_location(v, name, typed) for v in doc]
    if isinstance(doc, str):
        return doc.replace(typed, "") if typed else doc
    if not isinstance(doc, dict):
        return doc
    drop = {"spec", "spec_given", "path", "relative_path"} if name == "dataset.json" else set()
    return {k: _without_location(v, name, typed) for k, v in doc.items() if k not in drop and not _timing(k)}


def _timing(key: str) -> bool:
    return "seconds" in key  # wall-clock durations (tune's trials): not a result


def _payload(path: Path, typed: str = "") -> dict[str, object]:
    """Each output file's sha256; a JSON document (and tune's best.yaml) as its content less the locations of its
    inputs, a CSV table less its durations. An SQLite study (tune's study.db) is left out: it stamps the time of every trial, and
    trials.csv holds what it records."""
    manifest = json.loads((path / "manifest.json").read_text())
    files: dict[str, object] = {o["path"]: o["sha256"] for o in manifest["outputs"] if not o["path"].endswith(".db")}
    for name in files:
        if name.endswith(".json"):
            files[name] = _without_location(json.loads((path / name).read_text()), name, typed)
        elif name == "best.yaml":  # a non-private study's provenance names its partition's path: a location
            import yaml

            doc = yaml.safe_load((path / name).read_text())
            doc.get("provenance", {}).get("partition", {}).pop("path", None)
            files[name] = _without_location(doc, name, typed)
        elif name.endswith(".csv"):
            rows = list(csv.DictReader(io.StringIO((path / name).read_text())))
            files[name] = [{k: v for k, v in row.items() if not _timing(k)} for row in rows]
    return files


def _check_travels(tmp_path, monkeypatch, capsys, names) -> None:
    origin = tmp_path / "origin"
    _data(origin)
    made = {}
    for name in names:  # the chain, from the tree's own directory, paths as a user types them there
        step = CHAIN[name]
        made[name] = _run(name, step, origin, origin, step.out, monkeypatch, capsys)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    moved = tmp_path / "moved" / "tree"
    for where, root in (("another working directory", origin), ("the tree moved", moved)):
        if root is moved:
            shutil.copytree(origin, moved, symlinks=True)
            shutil.rmtree(origin)
            again = _run("partition", CHAIN["partition"], moved, moved, "part", monkeypatch, capsys)
            assert again["up_to_date"], "the same partition command in the moved tree must be a no-op"
        for name in names:
            step = CHAIN[name]
            if not step.reads:
                continue
            out = None if step.out is None else elsewhere / f"{step.out}-{len(list(elsewhere.iterdir()))}"
            result = _run(name, step, elsewhere, root, out, monkeypatch, capsys)
            if step.out is not None and (root / step.out / "manifest.json").is_file():
                typed = f"{os.path.relpath(root, elsewhere)}{os.sep}"
                again, first = _payload(out, typed), _payload(root / step.out)
                differ = sorted(f for f in set(again) | set(first) if again.get(f) != first.get(f))
                assert not differ, f"{name} from {where}: another result in {differ}"
            if step.code:
                assert result == made[name], f"{name} from {where}: another refusal"
                continue
            check = SAME_OUTPUT.get(step.args[0])
            if check is not None:
                check(made[name], result, where)


def _show_inputs_found(first: dict, again: dict, where: str) -> None:
    lineage = again.get("lineage", [])
    assert lineage and all(e["status"] != "missing" for e in lineage), f"show --lineage from {where}: {lineage}"


def _same_epsilon(first: dict, again: dict, where: str) -> None:
    assert again.get("epsilon") == first.get("epsilon"), f"privacy-account from {where}"


SAME_OUTPUT = {"show": _show_inputs_found, "privacy-account": _same_epsilon}
DEFAULT = [n for n, s in CHAIN.items() if not s.slow]


def test_artifacts_travel(tmp_path, monkeypatch, capsys):
    _check_travels(tmp_path, monkeypatch, capsys, DEFAULT)


@pytest.mark.slow
def test_artifacts_travel_every_step(tmp_path, monkeypatch, capsys):
    """The whole chain: also a --dp model's predict on its own partition and on another one (its partition found
    through the model's manifest), a rotated partition (its unrotated samples read again where the data were found),
    and tune."""
    _check_travels(tmp_path, monkeypatch, capsys, list(CHAIN))


# ---------------------------------------------------------------------------- the dataset, found again or refused
def _npz_partition(cli, root: Path, monkeypatch) -> Path:
    """``root/data.npz`` (digits) and the partition ``root/part`` of it, made from ``root`` with a relative spec."""
    from pfl_cli.data.builtin import _digits_arrays

    x, y = _digits_arrays()
    root.mkdir(parents=True, exist_ok=True)
    np.savez(root / "data.npz", x=x[:200], y=y[:200])
    monkeypatch.chdir(root)
    assert cli("partition", "--dataset", "npz:data.npz", "--num-clients", "4", "--out", "part", "--format",
               "quiet").code == 0
    return root / "part"


def _stage(cli, part: Path, out: Path):
    """A stage that reads the partition's dataset (every such stage loads it through the same function)."""
    return cli("cluster", "--partition", part, "--server-data", "builtin:digits", "--k", "2", "--no-dp",
               "--reference-n-init", "1", "--out", out, "--format", "quiet")


def test_dataset_json_records_the_resolved_path_and_digest(cli, tmp_path, monkeypatch):
    part = _npz_partition(cli, tmp_path / "a", monkeypatch)
    doc = json.loads((part / "dataset.json").read_text())
    assert doc["spec"] == f"npz:{tmp_path / 'a' / 'data.npz'}" and doc["spec_given"] == "npz:data.npz"
    from pfl_cli.data import load_dataset
    from pfl_cli.formats import sha256_file

    assert doc["source"] == {"path": str(tmp_path / "a" / "data.npz"), "relative_path": "../data.npz", "kind": "file",
                             "sha256": sha256_file(tmp_path / "a" / "data.npz"),
                             "content_sha256": load_dataset(f"npz:{tmp_path / 'a' / 'data.npz'}").content_sha256}
    builtin = tmp_path / "b"
    assert cli("partition", "--num-clients", "4", "--out", builtin, "--format", "quiet").code == 0
    assert "source" not in json.loads((builtin / "dataset.json").read_text())  # builtin: needs nothing


def test_a_moved_dataset_is_named_with_the_variable_that_finds_it(cli, tmp_path, monkeypatch):
    from pfl_cli.cli.common import load_partition_dataset

    part = _npz_partition(cli, tmp_path / "a", monkeypatch)
    (tmp_path / "store").mkdir()
    shutil.move(tmp_path / "a" / "data.npz", tmp_path / "store" / "data.npz")
    monkeypatch.chdir(tmp_path)
    r = _stage(cli, part, tmp_path / "t")
    assert r.code == 2 and len(r.err.strip().splitlines()) == 1, r.err
    assert str(tmp_path / "a" / "data.npz") in r.err and "PFLX_DATA" in r.err
    assert not (tmp_path / "t").exists() and not list(tmp_path.glob(".t*"))  # nothing written
    monkeypatch.setenv("PFLX_DATA", f"{tmp_path / 'elsewhere'}{os.pathsep}{tmp_path / 'store'}")
    _, info, _, ds = load_partition_dataset(part)
    assert ds.spec == info["spec"] and ds.num_samples == 200  # found under the second root, named as recorded


def test_a_changed_dataset_is_refused_and_a_resaved_one_accepted(cli, tmp_path, monkeypatch):
    from pfl_cli.cli.common import load_partition_dataset

    part = _npz_partition(cli, tmp_path / "a", monkeypatch)
    with np.load(tmp_path / "a" / "data.npz") as d:
        x, y = d["x"], d["y"]
    before = (tmp_path / "a" / "data.npz").read_bytes()
    np.savez(tmp_path / "a" / "data.npz", x=x, y=y)  # the same arrays: another zip time stamp, the same content
    assert load_partition_dataset(part)[3].num_samples == 200
    changed = x.copy()
    changed[0, 0] += 1  # one feature of one sample: the labels and the size, all the old check saw, unchanged
    np.savez(tmp_path / "a" / "data.npz", x=changed, y=y)  # in place, read from where the partition was made
    r = _stage(cli, part, tmp_path / "t")
    assert r.code == 2 and len(r.err.strip().splitlines()) == 1, r.err
    assert "not the data the partition was made from" in r.err and "PFLX_DATA" in r.err
    assert not (tmp_path / "t").exists()
    (tmp_path / "orig").mkdir()
    np.savez(tmp_path / "orig" / "data.npz", x=x, y=y)
    monkeypatch.setenv("PFLX_DATA", str(tmp_path / "orig"))  # an unchanged copy elsewhere is found and used
    assert np.array_equal(load_partition_dataset(part)[3].x, x) and before != (tmp_path / "a" / "data.npz").read_bytes()


def _write_mnist(root: Path, start: int) -> None:
    """A tiny MNIST IDX layout (gzip'd): 6 train and 2 test images of 28x28."""
    import gzip
    import struct

    root.mkdir(parents=True, exist_ok=True)
    for name, array, magic in (("train-images-idx3-ubyte", np.arange(6 * 784) + start, 0x803),
                               ("train-labels-idx1-ubyte", np.arange(6) % 3, 0x801),
                               ("t10k-images-idx3-ubyte", np.arange(2 * 784) + 7, 0x803),
                               ("t10k-labels-idx1-ubyte", np.arange(2) % 3, 0x801)):
        array = (array % 256).astype(np.uint8).reshape((-1, 28, 28) if magic == 0x803 else (-1,))
        head = struct.pack(">I", magic) + struct.pack(f">{array.ndim}I", *array.shape)
        with gzip.open(root / f"{name}.gz", "wb") as fh:
            fh.write(head + array.tobytes())


def test_a_directory_dataset_is_digested_by_its_arrays(cli, tmp_path, monkeypatch):
    """A layout's digest is that of the arrays it loads to: a copy re-compressed (other bytes) is accepted,
    one with another image is refused."""
    from pfl_cli.cli.common import load_partition_dataset

    _write_mnist(tmp_path / "mnist", 0)
    monkeypatch.chdir(tmp_path)
    assert cli("partition", "--dataset", "mnist:mnist", "--num-clients", "2", "--out", "part", "--format",
               "quiet").code == 0
    source = json.loads((tmp_path / "part" / "dataset.json").read_text())["source"]
    assert source["kind"] == "directory" and "sha256" not in source
    shutil.rmtree(tmp_path / "mnist")
    _write_mnist(tmp_path / "copy" / "mnist", 0)
    monkeypatch.setenv("PFLX_DATA", str(tmp_path / "copy"))
    assert load_partition_dataset(tmp_path / "part")[3].num_samples == 8
    _write_mnist(tmp_path / "copy" / "mnist", 1)
    r = _stage(cli, tmp_path / "part", tmp_path / "t")
    assert r.code == 2 and "not the data the partition was made from" in r.err, r.err


def test_a_partition_written_before_sources_were_recorded_still_reads(cli, tmp_path, monkeypatch):
    """dataset.json of an older pflx: the spec as typed, no source. Read from where it was made as before; from
    elsewhere the error names what was tried and PFLX_DATA, which finds the data (size and labels checked)."""
    from pfl_cli.cli.common import load_partition_dataset
    from pfl_cli.formats import sha256_file

    part = _npz_partition(cli, tmp_path / "a", monkeypatch)
    doc = json.loads((part / "dataset.json").read_text())
    legacy = {k: v for k, v in doc.items() if k not in ("source", "spec_given")} | {"spec": "npz:data.npz"}
    (part / "dataset.json").write_text(json.dumps(legacy))
    manifest = json.loads((part / "manifest.json").read_text())
    for o in manifest["outputs"]:
        if o["path"] == "dataset.json":
            o["sha256"], o["bytes"] = sha256_file(part / "dataset.json"), (part / "dataset.json").stat().st_size
    (part / "manifest.json").write_text(json.dumps(manifest))
    assert load_partition_dataset(part)[3].num_samples == 200  # from the directory it was made in
    monkeypatch.chdir(tmp_path)
    r = _stage(cli, part, tmp_path / "t")
    assert r.code == 2 and len(r.err.strip().splitlines()) == 1 and "PFLX_DATA" in r.err, r.err
    monkeypatch.setenv("PFLX_DATA", str(tmp_path / "a"))
    assert load_partition_dataset(part)[3].num_samples == 200


# ---------------------------------------------------------------------------- files a config names by path
def _path_valued_keys() -> set[str]:
    """Every path-valued key of every config schema: train's (each algorithm's config) and every stage's."""
    from pfl_cli import registry
    from pfl_cli.config import STAGE_CONFIGS, stage_config_class
    from pfl_cli.readers.files import path_keys

    found = {k for e in registry.entries().values() for k in path_keys(e.config)}
    for stage in STAGE_CONFIGS:
        cls = stage_config_class(stage)
        if cls is not None:
            found |= set(path_keys(cls))
    return found


def _backbone_weights(root: Path) -> tuple[str, list[str], str]:
    """A resnet-micro state dict at root/weights/ (relative path), the settings that make train read it, the file."""
    import torch

    from pfl_cli.models.pretrained import PretrainedNet

    (root / "weights").mkdir()
    net = PretrainedNet("resnet-micro", (1, 8, 8), 10, "adapters")
    torch.save({k: torch.full_like(v, 0.01) for k, v in net.backbone.state_dict().items()},
               root / "weights" / "micro.pth")
    return "weights/micro.pth", ["--set", "backbone=resnet-micro"], "weights/micro.pth"


def _availability_trace(root: Path) -> tuple[str, list[str], str]:
    """An availability trace of CHAIN's 8 clients (every one online in both slots) at root/conditions/."""
    (root / "conditions").mkdir()
    (root / "conditions" / "trace.csv").write_text("1,1\n" * 8)
    return "conditions/trace.csv", [], "conditions/trace.csv"


def _speeds(root: Path) -> tuple[str, list[str], str]:
    """A per-client speed file of CHAIN's 8 clients at root/conditions/, named in the file:PATH form."""
    (root / "conditions").mkdir()
    (root / "conditions" / "speeds.csv").write_text("\n".join(str(1.0 + i) for i in range(8)) + "\n")
    return "file:conditions/speeds.csv", [], "conditions/speeds.csv"


# How each path-valued key gets a file, what else its run needs and the file it names (a new path-valued key fails
# the test below until it has an entry: the travel case is generated from the schema).
PATH_VALUES = {"backbone_weights": _backbone_weights, "availability_trace": _availability_trace,
               "compute_speed": _speeds, "network_speed": _speeds}


def test_every_path_valued_key_has_a_travel_case():
    assert _path_valued_keys() and _path_valued_keys() <= set(PATH_VALUES), "add the key to PATH_VALUES"


# the default tier runs one key of each form (a path; a file:PATH spec), the slow tier every key
DEFAULT_TIER_KEYS = {"backbone_weights", "compute_speed"}


@pytest.mark.parametrize("key", [pytest.param(k, marks=() if k in DEFAULT_TIER_KEYS else pytest.mark.slow)
                                 for k in sorted(PATH_VALUES)])
def test_a_path_valued_key_travels(key, tmp_path, monkeypatch, capsys):
    # Issue 49, finding 6: a relative backbone_weights broke predict and `train --config RUN/config.yaml` run from
    # another directory once the tree moved, with a wrong message ("changed since the model was built" for a file
    # that was missing). Trained in the tree with the path as typed there; then the tree moves, and predict and
    # train --config run from another directory.
    origin = tmp_path / "origin"
    _data(origin)
    value, extra, named = PATH_VALUES[key](origin)
    monkeypatch.chdir(origin)
    small = ["--rounds", "1", "--eval-every", "1", "--local-steps", "1", "--device", "cpu", "--format", "quiet"]
    assert main([*CHAIN["partition"].args, "--out", "part", "--format", "quiet"]) == 0
    assert main(["train", "--partition", "part", "--algorithm", "fedavg", *small, *extra, "--set", f"{key}={value}",
                 "--out", "model"]) == 0
    moved = tmp_path / "moved" / "tree"
    shutil.copytree(origin, moved)
    shutil.rmtree(origin)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    tree = os.path.relpath(moved, elsewhere)
    capsys.readouterr()
    code = main(["predict", "--model", f"{tree}/model", "--partition", f"{tree}/part", "--out", "pred", *small[-2:]])
    assert code == 0, capsys.readouterr().err
    code = main(["train", "--partition", f"{tree}/part", "--config", f"{tree}/model/config.yaml", "--out", "again",
                 *small[-2:]])
    assert code == 0, capsys.readouterr().err
    first, again = (json.loads((d / "manifest.json").read_text()) for d in (moved / "model", elsewhere / "again"))
    model_pt = {m["outputs"][i]["path"]: m["outputs"][i]["sha256"] for m in (first,) for i in range(len(m["outputs"]))}
    assert {o["path"]: o["sha256"] for o in again["outputs"]}["model.pt"] == model_pt["model.pt"]
    # gone: one line that says missing (not "changed")
    os.remove(moved / named)
    code = main(["predict", "--model", f"{tree}/model", "--partition", f"{tree}/part", "--out", "pred2",
                 *small[-2:]])
    err = capsys.readouterr().err
    assert code == 2 and "missing" in err and "changed" not in err and err.count("\n") == 1, err
