"""The study: what a trial reads, what it returns, and how pruned, diverging and invalid trials are kept."""

import dataclasses

import numpy as np
import optuna
import pytest

from pfl_cli import registry
from pfl_cli.tune.space import resolve_space
from pfl_cli.tune.split import validation_partition
from pfl_cli.tune.loop import optimize
from pfl_cli.tune.study import best_trial, best_values, trial_rows
from pfl_cli.tune.trial import Objective, TrialFailed, TuningData

optuna.logging.set_verbosity(optuna.logging.WARNING)
SMALL = dict(rounds=3, eval_every=1, local_steps=5, clients_per_round=4, mlp_hidden=(16,), device="cpu")


def _study(sampler=None, pruner=None):
    return optuna.create_study(direction="maximize", sampler=sampler or optuna.samplers.RandomSampler(seed=0),
                               pruner=pruner or optuna.pruners.NopPruner())


def _run(y, part, *, algorithm="fedavg", space=None, trials=3, pruner=None, grid=False, **keys):
    from pfl_cli.data import load_dataset

    ds = load_dataset("builtin:digits")
    entry = registry.get(algorithm)
    cfg = registry.train_config(algorithm, **{**SMALL, **keys})
    params = resolve_space(entry, space or {"lr": "log:1e-3:3e-1"})
    group = "holdout" if entry.algorithm.tune_group == "new" else "train"
    vpart = validation_partition(part, val_fraction=0.2, val_clients=0.2 if group == "holdout" else 0.0,
                                 rng=np.random.default_rng(0))
    from pfl_cli.tune.loop import Proposals

    study = _study(pruner=pruner)
    optimize(study, Objective(TuningData(ds.x, y, ds.num_classes, vpart), cfg, params, group=group,
                              metric="mean_accuracy"), trials, proposals=Proposals("grid", params, 0) if grid else None)
    return study, params


@pytest.mark.parametrize("algorithm", ["fedavg", "pefll"])
def test_poisoned_test_labels_do_not_change_what_the_study_selects(digits_clients, algorithm):
    """Selection reads validation data only: every test label and every holdout client's label scrambled,
    each trial scores exactly the same and the chosen config is the same."""
    ds, part = digits_clients
    poisoned = ds.y.copy()
    hidden = np.concatenate([part.test_indices] + [part.train_of(j) for j in np.flatnonzero(part.role == 1)])
    poisoned[hidden] = (poisoned[hidden] + 1 + np.arange(len(hidden)) % 9) % 10
    assert np.all(poisoned[hidden] != ds.y[hidden])
    extra = {"hyper_hidden": 16} if algorithm == "pefll" else {}
    clean, params = _run(ds.y, part, algorithm=algorithm, trials=2, **extra)
    dirty, _ = _run(poisoned, part, algorithm=algorithm, trials=2, **extra)
    assert [t.value for t in clean.trials] == [t.value for t in dirty.trials]
    assert best_trial(clean).params == best_trial(dirty).params
    # ... and the objective is not blind: scrambling the validation labels does change the scores
    vpart = validation_partition(part, val_fraction=0.2, val_clients=0.2 if algorithm == "pefll" else 0.0,
                                 rng=np.random.default_rng(0))
    scrambled = ds.y.copy()
    scrambled[vpart.test_indices] = (scrambled[vpart.test_indices] + 3) % 10
    moved, _ = _run(scrambled, part, algorithm=algorithm, trials=2, **extra)
    assert [t.value for t in moved.trials] != [t.value for t in clean.trials]


def test_each_evaluation_is_reported_and_a_pruner_stops_the_trial(digits_clients):
    ds, part = digits_clients
    study, _ = _run(ds.y, part, trials=1)
    assert sorted(study.trials[0].intermediate_values) == [1, 2, 3]  # every evaluation of the validation curve
    # a pruner that stops everything below 200 %: the trial ends at its first evaluation
    study, _ = _run(ds.y, part, trials=2, pruner=optuna.pruners.ThresholdPruner(lower=2.0))
    assert [t.state for t in study.trials] == [optuna.trial.TrialState.PRUNED] * 2
    assert all(sorted(t.intermediate_values) == [1] for t in study.trials)


def test_diverging_trials_are_recorded_as_failed_and_the_study_goes_on(digits_clients):
    ds, part = digits_clients
    study, params = _run(ds.y, part, trials=2, space={"lr": "choice:0.05,1e9", "momentum": "choice:0.5"},
                         client_clip=0.0, grid=True)
    header, rows = trial_rows(study, params)
    states = {r[header.index("lr")]: r[header.index("state")] for r in rows}
    assert states == {"0.05": "complete", "1e9": "fail"}
    # numeric choices are stored by rank (TPE sees their order); trials.csv and best.yaml get the values
    assert sorted({t.params["lr"] for t in study.trials}) == [0, 1]
    assert best_values(best_trial(study), params) == {"lr": 0.05, "momentum": 0.5}
    errors = {r[header.index("lr")]: r[header.index("error")] for r in rows}
    assert errors["1e9"].startswith("diverged at round")


def test_the_returned_value_is_the_selected_models_validation_accuracy(digits_clients):
    """Against a train run on the same tuning partition: the trial's value is its selected evaluation."""
    from pfl_cli.data import load_dataset
    from pfl_cli.fl.api import train_federated

    ds, part = digits_clients
    study, _ = _run(ds.y, part, trials=1)
    t = study.trials[0]
    cfg = registry.train_config("fedavg", **SMALL, lr=t.params["lr"])
    vpart = validation_partition(part, val_fraction=0.2, val_clients=0.0, rng=np.random.default_rng(0))
    run = train_federated(ds.x, ds.y, ds.num_classes, vpart, cfg)
    assert t.value == pytest.approx(run.outcome.best.summaries()["train"]["mean_accuracy"], abs=0)
    assert t.user_attrs["selected_round"] == run.outcome.best.round


def test_a_config_drawn_again_returns_its_result_without_training(digits_clients, monkeypatch):
    import pfl_cli.fl.api as api

    ds, part = digits_clients
    calls = []
    real = api.train_federated
    monkeypatch.setattr(api, "train_federated", lambda *a, **k: calls.append(1) or real(*a, **k))
    study, _ = _run(ds.y, part, trials=3, space={"lr": "choice:0.05"})
    assert len(calls) == 1  # one training; the two draws of the same config reuse it
    assert [t.user_attrs.get("duplicate_of") for t in study.trials] == [None, 0, 0]
    assert len({t.value for t in study.trials}) == 1
    assert all(t.intermediate_values == study.trials[0].intermediate_values for t in study.trials)
