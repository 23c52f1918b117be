"""The DP release contract of artifacts.py: release classes, the writer's refusals, the checker."""

import json

import pytest

from pfl_cli.artifacts import (
    MECHANISM,
    NONPRIVATE,
    POST_PROCESSING,
    ArtifactWriter,
    check_release_contract,
    public_input,
    release_contract_violations,
)
from pfl_cli.errors import ArtifactError

PRIVATE_REF = {"path": "runs/part", "stage": "partition", "sha256": "ab" * 32}
PUBLIC_REF = {"path": "server.npz", "stage": "file", "sha256": "cd" * 32}
LEDGER = {"unit": "client", "delta": 1e-6, "events": [{"type": "GaussianDpEvent", "noise_multiplier": 1.0}]}


def _write(out, files, *, dp=True, inputs=(PRIVATE_REF, public_input(PUBLIC_REF))):
    writer = ArtifactWriter(out, stage="cluster", config={"epsilon": 1.0}, seed=0, inputs=inputs, dp=dp, argv=["pflx"])
    with writer:
        for name, (obj, release) in files.items():
            writer.save_json(name, obj, release=release)
    return json.loads((out / "manifest.json").read_text())


def _good_files():
    return {"centers.json": ([[0.1, 0.2]], MECHANISM), "privacy.json": (LEDGER, POST_PROCESSING),
            "nonprivate.json": ({"num_points": 1234}, NONPRIVATE)}


def test_dp_manifest_lists_release_classes_and_withholds_private_hashes(tmp_path):
    manifest = _write(tmp_path / "a", _good_files())
    assert manifest["dp"] is True
    assert {o["path"]: o["release"] for o in manifest["outputs"]} == {
        "centers.json": MECHANISM, "nonprivate.json": NONPRIVATE, "privacy.json": POST_PROCESSING}
    assert [i["sha256"] for i in manifest["inputs"]] == [None, PUBLIC_REF["sha256"]]
    assert release_contract_violations(tmp_path / "a", private_values=[1234]) == []


def test_non_dp_manifest_is_unchanged(tmp_path):
    manifest = _write(tmp_path / "a", {"m.json": ({"num_points": 3}, None)}, dp=False)
    assert "dp" not in manifest and "release" not in manifest["outputs"][0]
    assert manifest["inputs"][0]["sha256"] == PRIVATE_REF["sha256"]


def test_writer_refuses_an_unclassified_file_and_leaves_nothing(tmp_path):
    with pytest.raises(RuntimeError, match="no release class"):
        _write(tmp_path / "a", {"centers.json": ([1.0], None)})
    assert not (tmp_path / "a").exists()


@pytest.mark.parametrize("name, release", [("diag.json", NONPRIVATE), ("nonprivate.json", POST_PROCESSING),
                                           ("x.json", "public")])
def test_writer_refuses_a_misnamed_or_unknown_class(tmp_path, name, release):
    with pytest.raises(ValueError, match="release class|nonprivate"):
        _write(tmp_path / "a", {name: ({}, release)})


def test_checker_finds_each_kind_of_violation(tmp_path):
    out = tmp_path / "a"
    files = _good_files()
    files["metrics.json"] = ({"num_clients": 17, "note": "sigma 4.5"}, POST_PROCESSING)
    files["trace.json"] = ({"rounds": [1, 2, 977]}, POST_PROCESSING)
    _write(out, files)
    (out / "stray.png").write_bytes(b"x")
    problems = release_contract_violations(out, private_values=[977])
    text = " | ".join(problems)
    assert "stray.png: on disk but not in manifest.json" in text
    assert "metrics.json: released file holds exact-count fields ['num_clients']" in text
    assert "trace.json: released file contains the private value(s) [977.0]" in text
    assert len(problems) == 3
    with pytest.raises(ArtifactError, match="breaks the DP release contract"):
        check_release_contract(out, private_values=[977])


def test_checker_requires_the_ledger_and_the_dp_flag(tmp_path):
    _write(tmp_path / "a", {"centers.json": ([0.0], MECHANISM)})
    assert any("privacy.json: missing" in p for p in release_contract_violations(tmp_path / "a"))
    _write(tmp_path / "b", {"centers.json": ([0.0], None)}, dp=False)
    problems = release_contract_violations(tmp_path / "b")
    assert any("'dp' is None" in p for p in problems) and any("fingerprinted" in p for p in problems)


def test_dp_rerun_with_withheld_hashes_recomputes_without_force(tmp_path):
    _write(tmp_path / "a", _good_files())
    writer = ArtifactWriter(tmp_path / "a", stage="cluster", config={"epsilon": 1.0}, seed=0,
                            inputs=[PRIVATE_REF, public_input(PUBLIC_REF)], dp=True, argv=["pflx"])
    assert writer.up_to_date() is False  # no ArtifactError: same command, so replacing is allowed
    other = ArtifactWriter(tmp_path / "a", stage="cluster", config={"epsilon": 2.0}, seed=0,
                           inputs=[PRIVATE_REF], dp=True, argv=["pflx"])
    with pytest.raises(ArtifactError, match="--force"):
        other.up_to_date()
