"""Processes sharing one study, without a server (default tier): the driver in the URL, each concurrent trial's
own draw, a worker killed beside a live one. The same against PostgreSQL: test_shared_study.py (postgres tier)."""

from __future__ import annotations

import os
import socket
import subprocess
import time

import optuna
import pytest

from pfl_cli import registry
from pfl_cli.tune import storage
from pfl_cli.tune.space import resolve_space, suggest
from pfl_cli.tune.loop import Proposals, optimize
from pfl_cli.tune.study import counted

optuna.logging.set_verbosity(optuna.logging.WARNING)


@pytest.mark.parametrize("installed, url, want", [
    (("psycopg", "psycopg2"), "postgresql://me@dbhost/studies", "postgresql+psycopg://me@dbhost/studies"),
    (("psycopg2",), "postgresql://me@dbhost/studies", "postgresql+psycopg2://me@dbhost/studies"),
    ((), "postgresql://me@dbhost/studies", "postgresql://me@dbhost/studies"),
    (("psycopg",), "postgresql+psycopg2://me@h/db", "postgresql+psycopg2://me@h/db"),  # a driver given is kept
    (("psycopg",), "sqlite:///x/study.db", "sqlite:///x/study.db"),
])
def test_a_bare_postgresql_url_names_the_installed_driver(monkeypatch, installed, url, want):
    monkeypatch.setattr(storage.importlib.util, "find_spec", lambda name: object() if name in installed else None)
    assert storage.storage_url(url) == want


def _params():
    return resolve_space(registry.get("fedavg"), {"lr": "log:1e-3:1", "momentum": "choice:0,0.5,0.9"})


def _running_elsewhere(study, pid: int):
    """Trial 0 asked by another process on this machine (``pid``) with its own sampler, as optimize() records it:
    the first trial of a study, drawn from Proposals' place 0."""
    mine = optuna.load_study(study_name=study.study_name, storage=study._storage,
                             sampler=Proposals("random", _params(), 0).sampler(0))
    trial = mine.ask()
    study._storage.set_trial_system_attr(trial._trial_id, "pflx_host", socket.gethostname())
    study._storage.set_trial_system_attr(trial._trial_id, "pflx_pid", pid)
    study._storage.set_trial_system_attr(trial._trial_id, "pflx_place", 0)
    suggest(trial, _params())
    return trial


def test_two_processes_asking_at_the_same_moment_draw_two_configs():
    """Both count the study's trials (0), then the other process asks first: its trial 0 draws from place 0, and
    this process's trial 1 must not draw from place 0 too (the same seed, the same config, trained twice)."""
    params = _params()
    proposals = Proposals("random", params, 0)
    study = optuna.create_study(direction="maximize", sampler=proposals.sampler(0))
    ask, other = study.ask, []

    def ask_after_the_other():
        if not other:
            other.append(_running_elsewhere(study, os.getpid()))  # alive: this process
        return ask()

    study.ask = ask_after_the_other

    def score(trial):
        suggest(trial, params)
        return 0.5

    # the other process finishes its trial once this one has run its own
    optimize(study, score, 2, proposals=proposals,
             callbacks=[lambda s, _t: s.tell(other[0], 0.4) if not s.trials[0].state.is_finished() else None])
    assert counted(study) == 2 and len(study.trials) == 2
    assert study.trials[0].params != study.trials[1].params, "two processes drew one config"


def test_a_worker_killed_beside_a_live_one_leaves_its_trial_interrupted_and_run_again():
    params = _params()
    proposals = Proposals("random", params, 0)
    study = optuna.create_study(direction="maximize", sampler=proposals.sampler(0))
    victim = subprocess.Popen(["sleep", "600"])
    _running_elsewhere(study, victim.pid)
    calls = []

    def score(trial):
        suggest(trial, params)
        if not calls:  # the other worker is killed while this one trains
            victim.kill()
            victim.wait()
        calls.append(trial.number)
        return 0.5

    optimize(study, score, 2, proposals=proposals)
    first = study.trials[0]
    assert first.state == optuna.trial.TrialState.FAIL and first.system_attrs.get("pflx_interrupted")
    assert counted(study) == 2 and len(calls) == 2, "the killed worker's trial was counted as done"
    assert any(t.params == first.params for t in study.trials[1:]), "the killed config was not run again"


def test_a_trial_of_a_lost_machine_is_reaped_once_its_heartbeat_is_stale():
    """Another machine's process cannot be asked whether it lives: its trial's heartbeat says. A stale one (the
    machine was lost) is interrupted and run here; a fresh one is another worker's, left alone."""
    from pfl_cli.tune import loop as study_mod

    params = _params()
    proposals = Proposals("random", params, 0)
    study = optuna.create_study(direction="maximize", sampler=proposals.sampler(0))
    lost = _running_elsewhere(study, 12345)
    study._storage.set_trial_system_attr(lost._trial_id, "pflx_host", "another-machine")
    study._storage.set_trial_system_attr(lost._trial_id, "pflx_beat", time.time() - study_mod.STALE_S - 5)
    fresh = study.trials[0]
    assert study_mod._orphaned(fresh)
    study._storage.set_trial_system_attr(lost._trial_id, "pflx_beat", time.time() - 5)
    assert not study_mod._orphaned(study.trials[0])
    study._storage.set_trial_system_attr(lost._trial_id, "pflx_beat", time.time() - study_mod.STALE_S - 5)

    def score(trial):
        suggest(trial, params)
        return 0.5

    optimize(study, score, 2, proposals=proposals)
    assert study.trials[0].system_attrs.get("pflx_interrupted") and counted(study) == 2


def test_a_training_trial_beats(monkeypatch):
    from pfl_cli.tune import loop as study_mod

    monkeypatch.setattr(study_mod, "HEARTBEAT_S", 0.05)
    params = _params()
    study = optuna.create_study(direction="maximize")
    beats = []

    def score(trial):
        suggest(trial, params)
        for _ in range(6):
            time.sleep(0.1)
            beats.append(study._storage.get_trial(trial._trial_id).system_attrs["pflx_beat"])
        return 0.5

    optimize(study, score, 1, proposals=Proposals("random", params, 0))
    assert len(set(beats)) >= 3, beats  # the beat moved on while the trial trained
