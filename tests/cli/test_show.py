"""`pflx show` on every stage's artifact, refusals, lineage, and the figures of train/predict --plot."""

from __future__ import annotations

import json
import re

import pytest

FAST_TRAIN = ["--algorithm", "fedavg", "--rounds", "6", "--eval-every", "3", "--local-steps", "5"]


@pytest.fixture(scope="module")
def chain(tmp_path_factory):
    """One small artifact of every stage, made through the real CLI."""
    from pfl_cli.cli.app import main

    root = tmp_path_factory.mktemp("chain")
    commands = {
        "part": ["partition", "--classes-per-client", "2", "-n", "12", "--holdout-clients", "3", "--test-fraction", "0.3"],
        "mdm": ["mdm-fit", "--partition", root / "part", "--components", "1"],
        "sim": ["simulate", "--model", root / "mdm", "--dataset", "builtin:digits", "--num-clients", "8"],
        "train": ["train", "--partition", root / "part", *FAST_TRAIN, "--plot"],
        "pred": ["predict", "--model", root / "train", "--partition", root / "part", "--plot"],
        "gmm": ["partition", "--dataset", "gmm:clients?seed=0&num_clients=10&client_size=30", "--natural-id",
                "--test-fraction", "0"],
        "km": ["cluster", "--partition", root / "gmm", "--server-data", "gmm:server?seed=0&num_clients=10&client_size=30",
               "--k", "3", "--dp", "eps=1"],
        "pa": ["privacy-account", "--noise-multiplier", "1.1", "--sampling-rate", "0.01", "--steps", "100", "--delta", "1e-5"],
    }
    for name, args in commands.items():
        assert main([str(a) for a in [*args, "--out", root / name, "--format", "quiet"]]) == 0, name
    return root


def _show(cli, *args):
    run = cli("show", *args, "--format", "json")
    assert run.code == 0, run.err
    return json.loads(run.out)


@pytest.mark.parametrize("name, stage, keys", [
    ("part", "partition", {"num_clients": 12, "num_holdout_clients": 3, "mean_classes_per_client": 2.0}),
    ("sim", "partition", {"num_clients": 8}),
    ("mdm", "mdm-fit", {"num_components": 1, "num_clients": 9}),
    ("train", "train", {"algorithm": "fedavg", "rounds": 6}),
    ("pred", "predict", {"algorithm": "fedavg", "clients": "holdout", "num_clients": 3}),
    ("km", "cluster", {"k": 3}),
    ("pa", "privacy-account", {}),
])
def test_show_every_stage(cli, chain, name, stage, keys):
    doc = _show(cli, chain / name)
    assert doc["stage"] == stage and doc["tool_version"] and doc["config"]
    manifest = json.loads((chain / name / "manifest.json").read_text())
    assert [o["path"] for o in doc["outputs"]] == [o["path"] for o in manifest["outputs"]]
    assert all(o["verified"] for o in doc["outputs"])
    for key, value in keys.items():
        assert doc["headline"][key] == pytest.approx(value), key
    assert [(i["path"], i["stage"]) for i in doc["inputs"]] == [(i["path"], i["stage"]) for i in manifest["inputs"]]
    assert all(i["status"] in ("ok", "dataset (not re-read)", "ok (hash withheld under --dp)") for i in doc["inputs"])


def test_show_headline_numbers_are_the_artifacts_own(cli, chain):
    train = json.loads((chain / "train" / "metrics.json").read_text())
    doc = _show(cli, chain / "train")
    assert doc["headline"]["holdout_mean_accuracy"] == train["holdout"]["mean_accuracy"]
    assert doc["headline"]["best_round"] == train["best_round"]
    km = json.loads((chain / "km" / "privacy.json").read_text())
    assert _show(cli, chain / "km")["headline"]["privacy_epsilon"] == km["epsilon"] <= 1
    assert _show(cli, chain / "pa")["headline"]["privacy_epsilon"] > 0


def test_lineage_goes_back_to_the_dataset(cli, chain):
    doc = _show(cli, chain / "pred", "--lineage")
    steps = [(e["depth"], e["stage"]) for e in doc["lineage"]]
    assert steps == [(0, "predict"), (1, "train"), (2, "partition"), (3, "dataset"), (2, "dataset"),
                     (1, "partition"), (2, "dataset"), (1, "dataset")]
    assert doc["lineage"][1]["headline"]["rounds"] == 6
    human = cli("show", chain / "pred", "--lineage")
    assert human.code == 0 and f"- partition: {chain / 'part'} [ok]" in human.out


def test_train_and_predict_plots_are_redrawn_identically_from_the_csvs(cli, chain, tmp_path):
    for name, figure in (("train", "curves.png"), ("pred", "clients.png")):
        manifest = json.loads((chain / name / "manifest.json").read_text())
        assert figure in [o["path"] for o in manifest["outputs"]]
        doc = _show(cli, chain / name, "--plot", "--plot-dir", tmp_path)
        redrawn = tmp_path / f"{name}-{figure}"
        assert doc["figure"] == str(redrawn)
        assert redrawn.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        assert redrawn.read_bytes() == (chain / name / figure).read_bytes()


def test_show_plot_writes_beside_the_artifact_and_never_over_another_runs_figure(cli, chain, tmp_path):
    # Issue 34, item 14: by default the figure goes beside the artifact, not into the current directory;
    # a second run of the same name drawn into the same --plot-dir is refused, not silently overwritten.
    import shutil

    shutil.copytree(chain / "train", tmp_path / "a" / "train")
    doc = _show(cli, tmp_path / "a" / "train", "--plot")
    assert doc["figure"] == str((tmp_path / "a" / "train-curves.png").resolve())
    figs = tmp_path / "figs"
    _show(cli, chain / "train", "--plot", "--plot-dir", figs)
    again = _show(cli, chain / "train", "--plot", "--plot-dir", figs)  # the same figure again: fine
    assert again["figure"] == str(figs / "train-curves.png")
    before = (figs / "train-curves.png").read_bytes()
    (tmp_path / "b").mkdir()
    from pfl_cli.cli.app import main

    assert main(["train", "--partition", str(chain / "part"), *FAST_TRAIN, "--seed", "1",
                 "--out", str(tmp_path / "b" / "train"), "--format", "quiet"]) == 0
    run = cli("show", tmp_path / "b" / "train", "--plot", "--plot-dir", figs)
    assert run.code == 2 and "train-curves.png is already there and is another figure" in run.err
    assert (figs / "train-curves.png").read_bytes() == before
    assert sorted(p.name for p in figs.iterdir()) == ["train-curves.png"]  # no scratch file left


def test_plot_of_a_stage_without_a_figure_is_refused(cli, chain, tmp_path):
    run = cli("show", chain / "mdm", "--plot", "--plot-dir", tmp_path)
    assert run.code == 2 and "--plot draws partition, train, predict and compare artifacts" in run.err
    assert not list(tmp_path.iterdir())


def test_partition_plot_is_redrawn_identically_from_stats_csv(cli, chain, tmp_path):
    """`show --plot` on a partition redraws exactly the partition.png that `partition --plot` writes."""
    from pfl_cli.cli.app import main

    args = ["partition", "--classes-per-client", "2", "-n", "12", "--holdout-clients", "3", "--test-fraction", "0.3"]
    assert main([*args, "--plot", "--out", str(tmp_path / "p"), "--format", "quiet"]) == 0
    doc = _show(cli, tmp_path / "p", "--plot", "--plot-dir", tmp_path / "figs")
    redrawn = tmp_path / "figs" / "p-partition.png"
    assert doc["figure"] == str(redrawn)
    assert redrawn.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert redrawn.read_bytes() == (tmp_path / "p" / "partition.png").read_bytes()


def test_refuses_a_directory_that_is_not_an_artifact(cli, tmp_path):
    run = cli("show", tmp_path)
    assert run.code == 2 and run.err.count("\n") == 1 and "not a pflx artifact (no manifest.json)" in run.err
    run = cli("show", tmp_path / "nope")
    assert run.code == 2 and "no such directory" in run.err
    # show reads any stage: no hint that it be created with `pflx partition` (issue 34, item 13)
    assert "pflx partition" not in run.err and "--out" in run.err, run.err


def test_refuses_an_edited_or_partial_artifact_naming_the_file(cli, chain, tmp_path):
    import shutil

    edited = shutil.copytree(chain / "part", tmp_path / "edited")
    (edited / "stats.csv").write_text((edited / "stats.csv").read_text() + "\n")
    run = cli("show", edited)
    assert run.code == 2 and run.err.count("\n") == 1
    assert "stats.csv does not match its sha256" in run.err
    partial = shutil.copytree(chain / "train", tmp_path / "partial")
    (partial / "model.pt").unlink()
    run = cli("show", partial)
    assert run.code == 2 and "model.pt is missing; the artifact is incomplete" in run.err


def test_an_input_replaced_since_is_reported(cli, chain, tmp_path):
    import shutil

    part = shutil.copytree(chain / "part", tmp_path / "part")
    assert cli("train", "--partition", part, *FAST_TRAIN, "--out", tmp_path / "t", "--format", "quiet").code == 0
    assert cli("partition", "-n", "6", "--out", part, "--force", "--format", "quiet").code == 0
    status = {i["stage"]: i["status"] for i in _show(cli, tmp_path / "t")["inputs"]}
    assert status["partition"] == "changed since (hash differs)"
    shutil.rmtree(part)
    assert {i["stage"]: i["status"] for i in _show(cli, tmp_path / "t")["inputs"]}["partition"] == "missing"


def test_a_compare_artifact_shows_no_seed_line(cli, chain, tmp_path):
    # a comparison has no seed of its own (its runs' seeds are in its table): no `seed │ None` (issue 49, finding 21)
    assert cli("compare", chain / "train", "--out", tmp_path / "cmp", "--format", "quiet").code == 0
    run = cli("show", tmp_path / "cmp")
    assert run.code == 0 and "None" not in run.out and "compare artifact" in run.out
    run = cli("show", chain / "train")
    assert re.search(r"seed\s+│\s+0", run.out), run.out
