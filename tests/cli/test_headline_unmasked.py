"""One headline: per-client test accuracy without label masking, for every algorithm (issue 34, item 5).

Label masking (PeFLL thesis App. B.1.3, Table B.4) hands a client's own classes to the model; its
numbers are always reported, as their own labelled entries (``*_lm``), and become a run's headline
only when asked with --label-mask. `pflx show` and `pflx compare` put the unmasked number first.
"""

from __future__ import annotations

import json

import pytest

from pfl_cli import registry


@pytest.mark.parametrize("algorithm", registry.names())
def test_no_algorithm_masks_its_headline_by_default(algorithm):
    assert registry.train_config(algorithm).label_mask is False


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    from pfl_cli.cli.app import main

    root = tmp_path_factory.mktemp("lm")
    commands = {
        "part": ["partition", "--classes-per-client", "2", "-n", "12", "--holdout-clients", "3",
                 "--test-fraction", "0.3"],
        "pefll": ["train", "--partition", root / "part", "--rounds", "2", "--eval-every", "1", "--local-steps", "2",
                  "--set", "hyper_hidden=8"],
        "fedavg": ["train", "--partition", root / "part", "--algorithm", "fedavg", "--rounds", "2", "--eval-every",
                   "1", "--local-steps", "2"],
        "lm": ["predict", "--model", root / "fedavg", "--partition", root / "part", "--label-mask"],
    }
    for name, args in commands.items():
        assert main([str(a) for a in [*args, "--out", root / name, "--format", "quiet"]]) == 0, name
    return root


def test_pefll_and_fedavg_report_the_same_headline(runs):
    for name in ("pefll", "fedavg"):
        m = json.loads((runs / name / "metrics.json").read_text())
        assert m["label_mask"] is False and m["headline_metric"] == "mean_accuracy", name


def test_show_puts_the_unmasked_number_first_even_for_a_masked_run(runs, cli):
    m = json.loads((runs / "lm" / "metrics.json").read_text())
    assert m["label_mask"] is True and m["mean_accuracy"] == m["mean_accuracy_lm"]  # the run's own headline
    assert m["mean_accuracy_lm"] > m["mean_accuracy_nolm"]  # 2 of 10 classes a client: masking helps
    run = cli("show", runs / "lm", "--format", "json")
    assert run.code == 0, run.err
    headline = json.loads(run.out)["headline"]
    assert headline["mean_accuracy"] == pytest.approx(m["mean_accuracy_nolm"], abs=0)
    assert headline["mean_accuracy_lm"] == pytest.approx(m["mean_accuracy_lm"], abs=0)
