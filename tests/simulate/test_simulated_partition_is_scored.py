"""End to end: a model trained on a simulated partition is scored on that partition's test splits (DESIGN.md
section 5), with and without replacement. ``pflx predict`` compares samples by content and refuses a partition
whose test splits hold a sample the model trained on, so it accepting the model's own simulated partition shows
that simulate dealt no training sample out as a test sample.
"""

import pytest

from pfl_cli.cli.app import main as _main

TRAIN = ["--algorithm", "fedavg", "--rounds", "1", "--eval-every", "1", "--local-steps", "1", "--set", "mlp_hidden=[8]",
         "--format", "quiet"]


def main(argv):
    return _main([str(a) for a in argv])


@pytest.fixture(scope="module")
def mdm(tmp_path_factory):
    root = tmp_path_factory.mktemp("scored")
    assert main(["partition", "--dirichlet", "0.3", "--num-clients", "20", "--out", root / "part", "--format", "quiet"]) == 0
    assert main(["mdm-fit", "--partition", root / "part", "--components", "1", "--rounds", "5", "--out", root / "mdm",
                 "--format", "quiet"]) == 0
    return root / "mdm"


@pytest.mark.parametrize("replacement", ["--replacement", "--no-replacement"])
def test_predict_scores_the_model_s_own_simulated_partition(mdm, tmp_path, replacement, capsys):
    sim = tmp_path / "sim"
    assert main(["simulate", "--model", mdm, "--num-clients", "30", "--holdout-clients", "10", replacement,
                 "--test-fraction", "0.3", "--out", sim, "--format", "quiet"]) == 0
    assert main(["train", "--partition", sim, *TRAIN, "--out", tmp_path / "model"]) == 0
    for clients in ("holdout", "train"):
        code = main(["predict", "--model", tmp_path / "model", "--partition", sim, "--clients", clients,
                     "--out", tmp_path / f"pred-{clients}", "--format", "quiet"])
        assert code == 0, capsys.readouterr().err
