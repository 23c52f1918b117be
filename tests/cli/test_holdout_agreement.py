"""Train's holdout evaluation is exactly `predict --clients holdout` on the same model and seed.

Issue 24 part 8: a pFedHN run's metrics.json said 95.12% on the holdout clients while predict said
94.40%. The cause: train evaluated the holdout clients with the random draws left over from the
train group's evaluation stream, predict with a fresh stream of its own; the new-client protocol of
pFedHN (a fresh embedding fit by SGD) depends on those draws. Both now draw from one fresh stream
(``NEW_CLIENT_STREAM``), and every algorithm is held to equality here.
"""

from __future__ import annotations

import json

import pytest

from pfl_cli.algorithms import REGISTRY
from pfl_cli.cli.app import main

FAST = ["--rounds", "2", "--eval-every", "1", "--local-steps", "2", "--clients-per-round", "6",
        "--set", "mlp_hidden=[8]", "--set", "hyper_hidden=16", "--set", "new_client_epochs=1", "--set", "head_epochs=1"]
EXTRA = {"perfedavg": ["--finetune-steps", "2"], "fedavg": ["--finetune-steps", "2"],
         "pfedhn": ["--set", "embed_rounds=2"], "pfedhn-pc": ["--set", "embed_rounds=2"],
         "hyperfl-lpm": ["--set", "backbone=resnet-micro"],  # a random-weight micro backbone: no weights file
         # local-DP algorithms need a budget; their DP artifact releases no holdout accuracy to compare
         **{n: ["--dp", "eps=4,delta=1e-5,clip=0.5", "--set", "normalize=false",
               "--set", "dp_sampling_rate=0.25"]
            for n in ("ldp-fedavg", "ppsgd", "centaur")}}
# The most stochastic new-client protocols run in the default tier; the rest in the slow tier.
DEFAULT_TIER = ("pfedhn", "hyperfl", "perfedavg", "pefll")
METRICS = ("mean_accuracy", "pooled_accuracy", "mean_accuracy_lm", "pooled_accuracy_lm", "loss")


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    root = tmp_path_factory.mktemp("agreement")
    assert main(["partition", "--dirichlet", "0.3", "--num-clients", "12", "--holdout-clients", "4",
                 "--test-fraction", "0.3", "--out", str(root / "part"), "--format", "quiet"]) == 0
    return root


@pytest.mark.parametrize("name", [pytest.param(n, marks=() if n in DEFAULT_TIER else pytest.mark.slow)
                                  for n in REGISTRY])
def test_train_holdout_evaluation_equals_predict(root, name):
    out = root / name
    code = main(["train", "--partition", str(root / "part"), "--algorithm", name, "--seed", "3", "--out", str(out),
                 "--format", "quiet", *FAST, *EXTRA.get(name, [])])
    assert code == 0
    metrics = json.loads((out / "metrics.json").read_text())
    if "holdout" not in metrics:  # a --dp artifact: accuracies on private clients are not released
        assert (out / "privacy.json").is_file(), name
        return
    trained = metrics["holdout"]
    assert main(["predict", "--model", str(out), "--partition", str(root / "part"), "--clients", "holdout",
                 "--seed", "3", "--out", str(root / f"pred-{name}"), "--format", "quiet"]) == 0
    predicted = json.loads((root / f"pred-{name}" / "metrics.json").read_text())
    for metric in METRICS:
        got = predicted[metric + "_nolm"] if metric in ("mean_accuracy", "pooled_accuracy") else predicted[metric]
        assert got == pytest.approx(trained[metric], abs=1e-9), (name, metric)
