"""An interrupted study resumes to the uninterrupted result (issue 39, defect 10), for every sampler.

Ctrl-C inside a trial (KeyboardInterrupt from the objective) leaves that trial failed, marked interrupted and
not counted; a new process (a new Study object, fresh samplers) runs the missing trials. Each counted trial
draws what it would have drawn in the study that ran through: the complete trials are the same configs with
the same values, the interrupted config among them, and the best is the same trial's config.
"""

import math

import optuna
import pytest

from pfl_cli import registry
from pfl_cli.tune.space import resolve_space, suggest
from pfl_cli.tune.loop import Proposals, optimize
from pfl_cli.tune.study import INTERRUPTED, SAMPLERS, best_trial, counted

optuna.logging.set_verbosity(optuna.logging.WARNING)
SPACES = {"grid": {"lr": "choice:0.001,0.01,0.1,1", "momentum": "choice:0,0.9"},
          "random": {"lr": "log:1e-3:1", "momentum": "choice:0,0.5,0.9"},
          "tpe": {"lr": "log:1e-3:1", "momentum": "choice:0,0.5,0.9"}}
TRIALS = 7  # TPE models the space from its fifth trial on (n_startup_trials=4): the interrupt is after that


class Score:
    """A smooth score of the drawn config (its best near lr 0.05, momentum 0.5); raises KeyboardInterrupt on
    the ``stop_at``-th call, as Ctrl-C would in the middle of training."""

    def __init__(self, params, stop_at=None):
        self.params, self.stop_at, self.calls = params, stop_at, 0

    def __call__(self, trial):
        values = suggest(trial, self.params)
        self.calls += 1
        if self.calls == self.stop_at:
            raise KeyboardInterrupt
        return -(math.log10(values["lr"]) - math.log10(0.05)) ** 2 - (values["momentum"] - 0.5) ** 2


def _study(url, sampler, params, seed=0):
    from pfl_cli.tune.study import make_sampler

    return optuna.create_study(storage=url, study_name="s", direction="maximize", load_if_exists=True,
                               sampler=make_sampler(sampler, params, seed=seed))


def _complete(study):
    return [(t.params, t.value) for t in study.trials if t.state == optuna.trial.TrialState.COMPLETE]


@pytest.mark.parametrize("sampler", SAMPLERS)
def test_an_interrupted_study_resumes_to_the_uninterrupted_result(tmp_path, sampler):
    params = resolve_space(registry.get("fedavg"), SPACES[sampler])
    trials = TRIALS
    full = _study(optuna.storages.InMemoryStorage(), sampler, params)
    optimize(full, Score(params), trials, proposals=Proposals(sampler, params, 0))
    assert counted(full) == len(full.trials) == trials

    url = optuna.storages.InMemoryStorage()  # kept across the two "processes", as the SQLite file is
    stop_at = 6
    with pytest.raises(KeyboardInterrupt):
        optimize(_study(url, sampler, params), Score(params, stop_at=stop_at), trials,
                 proposals=Proposals(sampler, params, 0))
    cut = optuna.load_study(study_name="s", storage=url)
    assert counted(cut) == stop_at - 1 and cut.trials[-1].state == optuna.trial.TrialState.FAIL
    assert cut.trials[-1].user_attrs["error"] == f"{INTERRUPTED}: Ctrl-C"
    interrupted = cut.trials[-1].params
    # the same command again: a new process, a new sampler
    resumed = _study(url, sampler, params)
    optimize(resumed, Score(params), trials, proposals=Proposals(sampler, params, 0))
    resumed = optuna.load_study(study_name="s", storage=url)
    assert counted(resumed) == trials and len(resumed.trials) == trials + 1
    assert _complete(resumed) == _complete(full)  # the same configs, in order, with the same values
    assert resumed.trials[stop_at].params == interrupted  # the interrupted config ran again, next
    assert best_trial(resumed).params == best_trial(full).params
    distinct = {tuple(sorted(p.items())) for p, _ in _complete(resumed)}
    assert len(distinct) == len({tuple(sorted(p.items())) for p, _ in _complete(full)})


def test_a_grid_study_stops_when_every_point_has_its_trial(tmp_path):
    params = resolve_space(registry.get("fedavg"), {"lr": "choice:0.01,0.1", "momentum": "choice:0,0.9"})
    study = _study(optuna.storages.InMemoryStorage(), "grid", params)
    optimize(study, Score(params), 10, proposals=Proposals("grid", params, 0))
    assert len(study.trials) == 4 and len({tuple(sorted(t.params.items())) for t in study.trials}) == 4


def test_a_trial_left_running_before_its_pid_was_recorded_is_reaped_and_run_again(tmp_path, monkeypatch):
    """Ctrl-C between Optuna's ask and pflx's records left a RUNNING trial without a pid: the same command
    afterwards waited for it forever (the interrupt suite's tune case hung in CI). Past ASK_GRACE_S it is
    taken as stopped, marked interrupted, and the study completes its trials."""
    import socket

    from pfl_cli.tune import loop as study_mod

    params = resolve_space(registry.get("fedavg"), SPACES["random"])
    url = f"sqlite:///{tmp_path / 's.db'}"
    study = _study(url, "random", params)
    left = study.ask()  # the stopped process's trial: asked, its host written, no pid
    study._storage.set_trial_system_attr(left._trial_id, "pflx_host", socket.gethostname())
    monkeypatch.setattr(study_mod, "ASK_GRACE_S", 0.0)
    optimize(study, Score(params), 3, proposals=Proposals("random", params, 0))
    states = [t.state for t in study.trials]
    assert states[0] == optuna.trial.TrialState.FAIL and study.trials[0].system_attrs.get("pflx_interrupted")
    assert counted(study) == 3 and states.count(optuna.trial.TrialState.COMPLETE) == 3


def test_ctrl_c_after_a_trial_was_told_leaves_its_result_and_raises_no_optuna_error():
    """The interrupt suite's tune case once exited 1: Ctrl-C landed after ``study.tell`` had finished the trial,
    and marking it interrupted made Optuna raise UpdateFinishedTrialError. A finished trial's result stands."""
    import optuna

    from pfl_cli.tune.loop import _mark_interrupted

    study = optuna.create_study(direction="maximize")
    trial = study.ask()
    study.tell(trial, 0.75)
    _mark_interrupted(study, trial._trial_id, "Ctrl-C")
    done = study.get_trials(deepcopy=False)[0]
    assert done.state == optuna.trial.TrialState.COMPLETE and done.value == 0.75
    assert "pflx_interrupted" not in done.system_attrs
    running = study.ask()
    _mark_interrupted(study, running._trial_id, "Ctrl-C")
    marked = study.get_trials(deepcopy=False)[1]
    assert marked.state == optuna.trial.TrialState.FAIL and marked.system_attrs["pflx_interrupted"] is True
