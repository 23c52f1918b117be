"""Every registered algorithm trains, resumes byte-identically, predicts new clients and is tuned (issue 40).

One suite generated from the registry (``pfl_cli.registry.names()``), like scikit-learn's ``check_estimator``:
a new algorithm is covered the day it is registered, without new test code. Each case runs the real CLI
(``pfl_cli.cli.app.main``) on real temp dirs, on builtin:digits and on the ring (docs/ring-personalization.md),
both at smoke size:

1. ``pflx train`` three rounds: exit 0, a model.pt, finite accuracies in metrics.json;
2. a run killed right after its round-1 checkpoint reached the disk (``formats.write_atomic`` raises
   KeyboardInterrupt after writing, as in tests/cli/test_train_hyper.py) and resumed with ``--resume`` gives
   the bytes of the uninterrupted run's model.pt, metrics.json and clients.csv;
3. ``pflx predict --clients holdout`` on the partition's new clients: exit 0, a finite accuracy;
4. ``pflx tune --trials 2 --rounds 2`` over the algorithm's own search space: exit 0, a best.yaml that
   ``pflx train --config best.yaml`` trains.

What an algorithm needs comes from what it declares, not from a table here: its own epoch/step/round counts
and widths shrunk as tests/algorithms/test_no_ignored_key.py shrinks them (:func:`pflx_testing.smoke_sets`),
a ``--dp`` budget where it declares ``dp_required`` (:data:`pflx_testing.LDP_SMOKE`, the holdout-agreement
suite's budget with seeded noise: a resumed private run is byte-identical only with seeded noise), and a
backbone where its plain run is refused for want of one (:func:`pflx_testing.backbone_sets`).

The default tier runs one representative algorithm per step (:data:`DEFAULT_TIER`); the whole product is
``slow``. :data:`KNOWN` lists the defects the product found and that are not fixed yet, as strict xfails.
"""

from __future__ import annotations

import json
import math

import pytest
import yaml

from pflx_testing import backbone_sets, cli_args, dp_sets, smoke_sets

from pfl_cli import formats, registry
from pfl_cli.cli.app import main

DATA = {
    "digits": ["--dataset", "builtin:digits"],
    "ring": ["--dataset", "ring:?train_per_class=20&test_per_class=10"],
}
PARTITION = ["--classes-per-client", "2", "--num-clients", "8", "--holdout-clients", "2", "--test-fraction", "0.3"]
SMOKE = ["--rounds", "3", "--eval-every", "1", "--clients-per-round", "4", "--seed", "0",
         "--device", "cpu", "--set", "mlp_hidden=[8]"]  # eval_every 1: a checkpoint every round
TUNE = ["--trials", "2", "--rounds", "2", "--eval-every", "1", "--clients-per-round", "4",
        "--seed", "0", "--device", "cpu", "--set", "mlp_hidden=[8]"]
# One algorithm per step in the default tier, each of a family its step exercises most (per-client state
# for resume, a new-client protocol that trains for predict, a server optimizer's search space for tune).
DEFAULT_TIER = {"train": ("scaffold", "ring"), "resume": ("feddyn", "digits"), "predict": ("fedproto", "ring"),
                "tune": ("fedopt", "digits")}


# Known defects this suite found, each failing as described (strict: the case fails the day it is fixed, so the
# entry goes). tune's default space searches a key that the algorithm's check_trainable refuses as inert on the
# run's own rounds or partition, and that refusal aborts the whole study (pfl_cli/tune/study.py turns only a
# refused config into a failed trial) instead of failing the trial or narrowing the space.
KNOWN = {
    ("tune", "apple"): "tune --rounds 2: apple's space searches apple_mu, which has no effect in under 10 rounds "
                       "(L = int(rounds x apple_reg_rounds) = 0): each trial drawing it fails, and with 2 trials none "
                       "completes (the space is not narrowed to the run yet)",
}


def cases(step: str) -> list:
    def marks(name, data):
        out = [] if DEFAULT_TIER[step] == (name, data) else [pytest.mark.slow]
        if (step, name) in KNOWN:
            out.append(pytest.mark.xfail(strict=True, raises=AssertionError, reason=KNOWN[(step, name)]))
        return out

    return [pytest.param(name, data, id=f"{name}-{data}", marks=marks(name, data))
            for name in registry.names() for data in DATA]


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    root = tmp_path_factory.mktemp("every")
    for data, spec in DATA.items():
        assert main(["partition", *spec, *PARTITION, "--out", str(root / f"part-{data}"), "--format", "quiet"]) == 0
    return root


def needs(name: str) -> list[str]:
    return [*smoke_sets(name), *dp_sets(name), *backbone_sets(name)]


def train(root, name: str, data: str, out, *extra) -> int:
    args = ["train", "--partition", root / f"part-{data}", "--algorithm", name, "--out", out, "--format", "quiet",
            *SMOKE, *needs(name), *extra]
    return main(cli_args(args, name))


_TRAINED: dict = {}


def trained(root, name: str, data: str):
    """The uninterrupted smoke run of ``name`` on ``data`` (trained once for the steps that read it)."""
    out = root / f"{name}-{data}"
    if (name, data) not in _TRAINED:
        _TRAINED[(name, data)] = train(root, name, data, out)
    assert _TRAINED[(name, data)] == 0, f"pflx train --algorithm {name} on {data} exited {_TRAINED[(name, data)]}"
    return out


def finite_accuracies(metrics: dict, groups) -> list[float]:
    got = [metrics[g][k] for g in groups if g in metrics for k in ("mean_accuracy", "pooled_accuracy")
           if k in metrics[g]]
    return [v for v in got if isinstance(v, (int, float)) and math.isfinite(v)]


@pytest.mark.parametrize("name, data", cases("train"))
def test_trains(root, name, data):
    out = trained(root, name, data)
    metrics = json.loads((out / "metrics.json").read_text())
    assert (out / "model.pt").stat().st_size > 0
    if registry.get(name).algorithm.dp_required:  # a --dp artifact releases no accuracy on private clients
        assert (out / "privacy.json").is_file() and "train" not in metrics
        return
    accuracies = finite_accuracies(metrics, ("train",))
    assert accuracies and all(0.0 <= a <= 1.0 for a in accuracies), metrics.get("train")


@pytest.mark.parametrize("name, data", cases("resume"))
def test_resumes_byte_identically(root, name, data, monkeypatch, tmp_path):
    whole = trained(root, name, data)
    killed = tmp_path / "killed"
    real, rounds = formats.write_atomic, []

    def write_then_die(path, data_):
        real(path, data_)
        if "checkpoint" in str(path):  # the process dies right after its first checkpoint reached the disk
            import torch

            rounds.append(int(torch.load(path, weights_only=True)["round"]))
            raise KeyboardInterrupt

    monkeypatch.setattr(formats, "write_atomic", write_then_die)
    code = train(root, name, data, killed)
    monkeypatch.setattr(formats, "write_atomic", real)
    if not registry.get(name).algorithm.federated:  # no rounds (Local): no checkpoint, nothing to resume
        assert code == 0 and rounds == []
    else:
        assert code == 130 and rounds == [1] and not killed.exists(), (code, rounds)
        assert train(root, name, data, killed, "--resume") == 0
    for file in ("model.pt", "metrics.json", "clients.csv"):
        if (whole / file).is_file():
            assert (killed / file).read_bytes() == (whole / file).read_bytes(), file


@pytest.mark.parametrize("name, data", cases("predict"))
def test_predicts_new_clients(root, name, data, cli):
    model = trained(root, name, data)
    out = root / f"pred-{name}-{data}"
    run = cli("predict", "--model", model, "--partition", root / f"part-{data}", "--clients", "holdout", "--seed",
              "0", "--out", out, "--format", "quiet")
    assert run.code == 0, run.err
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["new_clients"] == 2 == metrics["num_clients"], metrics
    accuracy = metrics.get("mean_accuracy_nolm", metrics.get("mean_accuracy"))
    assert isinstance(accuracy, float) and 0.0 <= accuracy <= 1.0, metrics


@pytest.mark.parametrize("name, data", cases("tune"))
def test_is_tuned_and_its_best_config_trains(root, name, data, cli, tmp_path):
    part = root / f"part-{data}"
    args = cli_args(["tune", "--partition", part, "--algorithm", name, "--out", tmp_path / "study", "--format",
                     "quiet", *TUNE, *needs(name)], name)
    run = cli(*args)
    assert run.code == 0, run.err
    best = tmp_path / "study" / "best.yaml"
    config = yaml.safe_load(best.read_text())
    assert config, best.read_text()
    run = cli(*cli_args(["train", "--partition", part, "--config", best, "--out", tmp_path / "tuned", "--format",
                         "quiet", *dp_sets(name)], name))
    assert run.code == 0, run.err
    assert (tmp_path / "tuned" / "model.pt").is_file()
