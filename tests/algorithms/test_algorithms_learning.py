"""Learning tests (``specs/pefll.md`` §7.2, calibrated by §7.3 and by runs of this engine).

Everything goes through the public API the CLI uses: ``train_federated`` on the train
clients, then ``predict_clients`` on the holdout clients, which never took part in
training. Baselines are tuned honestly on the train clients' validation split (§7.3:
FedAvg's client learning rate decides everything under label skew), never on holdout data.
Seed 0 runs in the default suite; seeds 1 and 2 (the spec asks for >= 3) are ``slow`` (the ring test: all three).
"""


import numpy as np
import pytest

from pfl_cli.data import load_dataset
from pfl_cli.fl import PredictConfig, predict_clients, train_federated
from pflx_testing import replace, small_config
from pfl_cli.partition import PartitionConfig, partition_labels
from pfl_cli.rng import make_rng

SEEDS = [0, pytest.param(1, marks=pytest.mark.slow), pytest.param(2, marks=pytest.mark.slow)]
PEFLL = small_config(algorithm="pefll", lr=0.05, server_lr=5e-4, rounds=300, eval_every=50, embedding="mlp")


def _clients(spec, num_clients, holdout, seed):
    ds = load_dataset(spec)
    cfg = PartitionConfig(scheme="pathological", classes_per_client=2, class_shares="equal", num_clients=num_clients,
                          holdout_clients=holdout, test_fraction=None if ds.has_test_pool else 0.3, seed=seed)
    part = partition_labels(ds.y, cfg, num_classes=ds.num_classes, rng=make_rng(seed, "partition"), pool=ds.pool)
    return ds, part


def _train(ds, part, cfg):
    return train_federated(ds.x, ds.y, ds.num_classes, part, cfg, device="cpu")


def _holdout(run, cfg, ds, part, label_mask):
    out = predict_clients(run.model, cfg, ds.x, ds.y, ds.num_classes, part,
                          PredictConfig(label_mask=label_mask), device="cpu")
    s = out.evaluation.summary()
    return s["mean_accuracy_lm" if label_mask else "mean_accuracy"], out.optimizer_steps


def _tuned(ds, part, base, grid):
    """The run with the best validation accuracy over ``grid`` (train clients only)."""
    runs = [(_train(ds, part, replace(base, **opts)), replace(base, **opts)) for opts in grid]
    return max(runs, key=lambda r: r[0].outcome.best.summaries()["val"]["pooled_accuracy"])


@pytest.mark.slow  # default-tier budget (2026-11-29): minutes-long or a learning run
@pytest.mark.parametrize("seed", SEEDS)
def test_digits_pefll_generalizes_to_holdout_clients(seed):
    """L1: digits, 2 classes per client, 50 clients (10 holdout)."""
    ds, part = _clients("builtin:digits", 50, 10, seed)
    cfg = replace(PEFLL, seed=seed)
    run = _train(ds, part, cfg)
    train_acc = run.outcome.best.summaries()["train"]["mean_accuracy"]
    holdout, steps = _holdout(run, cfg, ds, part, label_mask=False)
    holdout_lm, _ = _holdout(run, cfg, ds, part, label_mask=True)
    assert steps == 0
    assert holdout >= 0.95, (holdout, train_acc)
    assert abs(train_acc - holdout) <= 0.07, (holdout, train_acc)
    assert holdout_lm >= 0.98, holdout_lm


@pytest.mark.slow  # a minute of learning on 2 cores (issue 39 kept the default tier under 10 minutes)
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_ring_pefll_with_label_masking_beats_fedavg_and_local_on_holdout_clients(seed):
    """L2: the ring task: one global model is capped near 47%, a personalized one near 89%."""
    ds, part = _clients("ring:", 100, 20, seed)
    cfg = replace(PEFLL, seed=seed)
    pefll = _train(ds, part, cfg)
    pefll_lm, _ = _holdout(pefll, cfg, ds, part, label_mask=True)
    pefll_train_lm = pefll.outcome.best.summaries()["train"]["mean_accuracy_lm"]

    fedavg_run, fedavg_cfg = _tuned(ds, part, small_config(algorithm="fedavg", rounds=300, eval_every=50, seed=seed),
                                    [{"lr": 0.005}, {"lr": 0.02}])
    fedavg, _ = _holdout(fedavg_run, fedavg_cfg, ds, part, label_mask=False)
    local_run, local_cfg = _tuned(ds, part, small_config(algorithm="local", seed=seed),
                                  [{"lr": lr, "local_epochs": e} for lr in (0.005, 0.02, 0.05) for e in (50, 200)])
    local, _ = _holdout(local_run, local_cfg, ds, part, label_mask=False)

    assert fedavg <= 0.50, fedavg  # the global model's ceiling (Bayes 46.6%)
    assert pefll_lm >= fedavg + 0.30, (pefll_lm, fedavg)
    assert pefll_lm >= local + 0.03, (pefll_lm, local)
    assert pefll_lm >= pefll_train_lm - 0.08, (pefll_lm, pefll_train_lm)


@pytest.mark.slow  # default-tier budget (2026-11-29): minutes-long or a learning run
def test_digits_pefll_with_a_label_free_descriptor():
    """L4: holdout clients that hold only unlabelled data still get good models (embedding ignores y)."""
    ds, part = _clients("builtin:digits", 50, 10, 0)
    cfg = replace(PEFLL, embedding="mlp-x")
    run = _train(ds, part, cfg)
    holdout, steps = _holdout(run, cfg, ds, part, label_mask=False)
    assert steps == 0 and not run.algorithm.embed.uses_labels
    assert holdout >= 0.95, holdout
