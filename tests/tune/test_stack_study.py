"""`tune --stack K`: K asks, the trials trained stacked on a run axis, K tells; the same trials as one at a time."""

import numpy as np
import optuna
import pytest

from pfl_cli import registry
from pfl_cli.tune.space import resolve_space
from pfl_cli.tune.split import validation_partition
from pfl_cli.tune.loop import Proposals, optimize
from pfl_cli.tune.trial import Objective, TuningData

optuna.logging.set_verbosity(optuna.logging.WARNING)
SMALL = dict(rounds=4, eval_every=1, local_steps=3, clients_per_round=4, mlp_hidden=(16,), device="cpu", seed=0)


def _study(digits_clients, stack: int, trials: int, pruner=None):
    ds, part = digits_clients
    cfg = registry.train_config("fedavg", **SMALL)
    params = resolve_space(registry.get("fedavg"), {"lr": "log:1e-3:3e-1", "momentum": "choice:0,0.9"})
    vpart = validation_partition(part, val_fraction=0.2, val_clients=0.0, rng=np.random.default_rng(0))
    study = optuna.create_study(direction="maximize", pruner=pruner or optuna.pruners.NopPruner())
    optimize(study, Objective(TuningData(ds.x, ds.y, ds.num_classes, vpart), cfg, params, group="train",
                              metric="mean_accuracy"), trials, proposals=Proposals("random", params, 0), stack=stack)
    return study


def test_a_stacked_study_runs_the_trials_one_at_a_time_runs(digits_clients):
    """Random search draws from (seed, place) alone, so both studies draw the same configs, and each stacked
    trial scores what it scores alone (the stacked runs equal the separate ones: tests/fl/test_stack.py)."""
    alone = _study(digits_clients, 1, 4)
    stacked = _study(digits_clients, 3, 4)  # a stack of 3, then one of 1: the study's count is kept
    assert len(stacked.trials) == 4
    assert [t.params for t in stacked.trials] == [t.params for t in alone.trials]
    assert [t.value for t in stacked.trials] == pytest.approx([t.value for t in alone.trials], abs=1e-6)
    assert [t.intermediate_values for t in stacked.trials] == [t.intermediate_values for t in alone.trials]
    assert len({t.params["lr"] for t in stacked.trials}) == 4


class _PruneOdd(optuna.pruners.BasePruner):
    """Prunes the odd-numbered trials at their second evaluation."""

    def prune(self, study, trial) -> bool:
        return trial.number % 2 == 1 and max(trial.intermediate_values, default=0) >= 2


def test_a_pruned_trial_leaves_the_stack_and_the_others_finish(digits_clients):
    study = _study(digits_clients, 4, 4, pruner=_PruneOdd())
    states = [t.state for t in study.trials]
    assert states == [optuna.trial.TrialState.COMPLETE, optuna.trial.TrialState.PRUNED] * 2
    for t in study.trials:  # the pruned ones stopped at round 2; the others trained every round
        assert max(t.intermediate_values) == (2 if t.state == optuna.trial.TrialState.PRUNED else SMALL["rounds"])


def test_a_stacked_study_prunes_the_trials_the_unstacked_one_prunes(digits_clients):
    # Issue 49, finding 10: under a MedianPruner the trials of one stack never saw each other complete, so a stacked
    # study pruned other trials than the unstacked one (random sampler, 12 trials: 1 to 3 a seed went from pruned
    # to complete). The pruner now judges each stacked trial's curve after the trials before it were told.
    def median():
        return optuna.pruners.MedianPruner(n_startup_trials=1, n_warmup_steps=1)

    alone = _study(digits_clients, 1, 6, pruner=median())
    stacked = _study(digits_clients, 3, 6, pruner=median())
    assert optuna.trial.TrialState.PRUNED in [t.state for t in alone.trials]  # the case prunes at all
    assert [t.state for t in stacked.trials] == [t.state for t in alone.trials]
    assert [t.intermediate_values for t in stacked.trials] == [t.intermediate_values for t in alone.trials]
    assert [t.value for t in stacked.trials] == [t.value for t in alone.trials]
