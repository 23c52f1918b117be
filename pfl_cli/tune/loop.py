"""The ask-and-tell loop of a study (:func:`optimize`): trials one at a time or stacked on a run axis, each drawing
from its own place (:class:`Proposals`), Ctrl-C marking the trial it stopped, the trials of a process that
stopped (a killed worker, a lost machine: its heartbeat) reaped and run again."""

from __future__ import annotations

import contextlib
import os
import time
from typing import Callable, Sequence

import numpy as np

from pfl_cli.tune.study import INTERRUPTED, counted, make_sampler
from pfl_cli.tune.trial import Objective, Settle, TrialFailed


class Proposals:
    """What the k-th counted trial of a study draws: a sampler made afresh for it, seeded from (seed, k).

    Optuna's samplers keep their random state in the process, so a resumed study would start the stream
    again and propose trial 0's config once more. Seeded per trial, the k-th counted trial draws the same
    whether the study ran through or was interrupted and resumed: random search draws from its seed alone, and
    TPE's model reads the complete and pruned trials only, which an interruption does not change. A grid takes
    its points in one seeded order, the first not yet held by a counted trial (a queued trial fixes it).
    """

    def __init__(self, kind: str, params: Sequence, seed: int | None) -> None:
        self.kind, self.params, self.seed = kind, tuple(params), seed
        if kind == "grid":
            import itertools

            keys = [p.key for p in self.params]
            points = [dict(zip(keys, v)) for v in itertools.product(*(p.stored_values() for p in self.params))]
            order = np.random.default_rng(np.random.SeedSequence([0 if seed is None else seed, 7])).permutation(
                len(points))
            self.points = [points[i] for i in order]

    def sampler(self, k: int):
        seed = None if self.seed is None else int(np.random.SeedSequence([self.seed, k]).generate_state(1)[0])
        return make_sampler("random" if self.kind == "grid" else self.kind, self.params, seed=seed)

    def fixed(self, study) -> dict | None | bool:
        """The grid point the next trial takes (None: not a grid; False: every point is held)."""
        if self.kind != "grid":
            return None
        held = [t.params for t in study.get_trials(deepcopy=False)
                if not t.system_attrs.get("pflx_interrupted") and t.params]
        for point in self.points:
            if point not in held:
                return point
        return False


def optimize(study, objective: Objective, trials: int, *, proposals: Proposals | None = None,
             callbacks: Sequence[Callable] = (), stack: int = 1) -> None:
    """Run trials until ``trials`` count (:func:`counted`: finished, pruned, failed or running elsewhere).

    Optuna's ask-and-tell loop, run here rather than by ``study.optimize`` so that Ctrl-C (KeyboardInterrupt)
    marks the trial it stopped as interrupted, with no log lines, and is raised on to the CLI's one-line
    message. An interrupted trial and one left RUNNING by a killed process are failed trials that do not count:
    the same command afterwards runs the missing trials, the interrupted config again among them (with
    ``proposals``, each counted trial draws what it would have drawn in an uninterrupted study).

    ``stack`` > 1: up to that many trials are asked at once and trained stacked on a run axis
    (:meth:`Objective.stacked`), then told, each with its own state (:func:`_run_stack`).
    """
    import optuna

    if proposals is None and isinstance(study.sampler, optuna.samplers.GridSampler):
        # Optuna's GridSampler stops the study from inside tell(), which only its optimize() allows
        raise ValueError("a grid study runs with proposals=Proposals('grid', params, seed)")
    while True:
        # a trial left RUNNING by a process that died (a killed worker beside this one) is reaped at every turn,
        # so that the processes still alive run it again; and the study is done for this process once no trial
        # runs anywhere: another process's last trial may still change the best, which both write
        if _reap(study) >= trials:
            if not _running(study):
                return
            time.sleep(1.0)
            continue
        k = counted(study)
        if proposals is not None:
            point = proposals.fixed(study)
            if point is False:  # every grid point has its trial
                if not _running(study):
                    return
                time.sleep(1.0)
                continue
            study.sampler = proposals.sampler(k)
            waiting = study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.WAITING,))
            if point is not None and not waiting:
                study.enqueue_trial(point)
        if stack > 1:
            _run_stack(study, objective, trials, stack, proposals, callbacks)
            continue
        trial = None
        try:
            trial = _ask(study, proposals, trials, k)
            if trial is None:
                continue
            try:
                with _heartbeat(study._storage, trial._trial_id):
                    value = objective(trial)
            except optuna.TrialPruned:
                frozen = study.tell(trial, state=optuna.trial.TrialState.PRUNED)
            except TrialFailed:
                frozen = study.tell(trial, state=optuna.trial.TrialState.FAIL)
            else:
                frozen = study.tell(trial, value)
        except KeyboardInterrupt:
            if trial is not None:
                _mark_interrupted(study, trial._trial_id, "Ctrl-C")
            raise
        except BaseException as err:  # a bug or a failed storage: the trial is recorded as failed, the error raised
            if trial is not None and study._storage.get_trial(trial._trial_id).state.is_finished() is False:
                study._storage.set_trial_user_attr(trial._trial_id, "error", f"{type(err).__name__}: {err}"[:300])
                study._storage.set_trial_state_values(trial._trial_id, optuna.trial.TrialState.FAIL)
            raise
        for callback in callbacks:
            callback(study, frozen)


def _ask(study, proposals: Proposals | None, trials: int, k: int):
    """A new trial, its host, pid, heartbeat and place recorded (its sampler set from its place); None when
    another process asked for the study's last trial first (the new one is marked surplus)."""
    import socket

    trial = study.ask()
    try:
        # the host first: a trial with a pid and no host is an earlier pflx's, taken as orphaned (_orphaned)
        study._storage.set_trial_system_attr(trial._trial_id, "pflx_host", socket.gethostname())
        study._storage.set_trial_system_attr(trial._trial_id, "pflx_pid", os.getpid())
        study._storage.set_trial_system_attr(trial._trial_id, "pflx_beat", time.time())
    except KeyboardInterrupt:  # Ctrl-C before the caller holds the trial: marked here, or it stays RUNNING
        _mark_interrupted(study, trial._trial_id, "Ctrl-C")
        raise
    if _surplus(study, trial.number, trials):  # another process asked for the last trial first
        study._storage.set_trial_system_attr(trial._trial_id, "pflx_surplus", True)
        _mark_interrupted(study, trial._trial_id, "not run: the study had its trials")
        return None
    place = _place(study, trial.number)
    study._storage.set_trial_system_attr(trial._trial_id, "pflx_place", place)
    if proposals is not None and place != k:
        # processes sharing the study asked at once and all counted k trials before, or one of them was
        # killed: each trial draws from its own place, so no two draw from one seed (the same config),
        # and a killed trial's place is drawn again. The sampler is read at the first suggest (Optuna's
        # Trial samples lazily), after this.
        study.sampler = proposals.sampler(place)
    return trial


def _run_stack(study, objective: Objective, trials: int, stack: int, proposals: Proposals | None,
               callbacks: Sequence[Callable]) -> None:
    """Ask up to ``stack`` trials (each drawing from its own place, as one at a time would), train them stacked,
    tell each its state. A trial draws its values at ask time, so the trials of one stack see the same finished
    trials (TPE models the earlier stacks only): Optuna's batched ask-and-tell."""
    import optuna

    asked = []
    try:
        for _ in range(max(min(stack, trials - counted(study)), 1)):
            k = counted(study)
            if proposals is not None:
                point = proposals.fixed(study)
                if point is False:
                    break
                study.sampler = proposals.sampler(k)
                if point is not None and not study.get_trials(deepcopy=False,
                                                              states=(optuna.trial.TrialState.WAITING,)):
                    study.enqueue_trial(point)
            trial = _ask(study, proposals, trials, k)
            if trial is None:
                break
            from pfl_cli.tune.space import suggest

            suggest(trial, objective.params)  # drawn now, from this trial's own sampler (the next ask resets it)
            asked.append(trial)
        if not asked:  # every grid point held, or another process asked for the last trial: the loop decides
            return
        with contextlib.ExitStack() as beats:
            for trial in asked:
                beats.enter_context(_heartbeat(study._storage, trial._trial_id))
            results = objective.stacked(asked)
    except KeyboardInterrupt:
        for trial in asked:
            if not study._storage.get_trial(trial._trial_id).state.is_finished():
                _mark_interrupted(study, trial._trial_id, "Ctrl-C")
        raise
    told = []
    for trial, result in zip(asked, results):
        if isinstance(result, Settle):  # judged now, after the trials before it were told (Objective.stacked)
            try:
                result = result.settle()
            except BaseException as err:  # noqa: BLE001 - told below as one trial at a time tells it
                result = err
        if isinstance(result, optuna.TrialPruned):
            told.append(study.tell(trial, state=optuna.trial.TrialState.PRUNED))
        elif isinstance(result, TrialFailed):
            told.append(study.tell(trial, state=optuna.trial.TrialState.FAIL))
        elif isinstance(result, BaseException):
            study._storage.set_trial_user_attr(trial._trial_id, "error", f"{type(result).__name__}: {result}"[:300])
            study._storage.set_trial_state_values(trial._trial_id, optuna.trial.TrialState.FAIL)
            raise result  # a bug or a failed storage, as one trial at a time raises it
        else:
            told.append(study.tell(trial, result))
    for frozen in told:
        for callback in callbacks:
            callback(study, frozen)


def _reap(study) -> int:
    """Mark the RUNNING trials whose process is gone (:func:`_orphaned`) interrupted; returns :func:`counted`."""
    import optuna

    for t in study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.RUNNING,)):
        if _orphaned(t):
            _mark_interrupted(study, t._trial_id, "the process running it stopped")
    return counted(study)


def _running(study) -> bool:
    import optuna

    return bool(study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.RUNNING,)))


def _place(study, number: int, wait: float = 30.0) -> int:
    """The place trial ``number`` draws from (:class:`Proposals`' k): the first that no earlier counted trial holds.

    One process: its counted trials hold 0..k-1 and an interrupted one's place is free again, so this is
    :func:`counted` before the trial, or the interrupted config's place on a resume. Processes sharing the study:
    a trial asked just before by another process records its place a moment later (waited for, up to ``wait``
    seconds); a finished trial without one (an earlier pflx) holds its rank."""
    import optuna

    deadline = time.time() + wait
    while True:
        earlier = sorted((t for t in study.get_trials(deepcopy=False) if t.number < number and
                          t.state != optuna.trial.TrialState.WAITING and not t.system_attrs.get("pflx_interrupted")),
                         key=lambda t: t.number)
        places = [t.system_attrs.get("pflx_place") for t in earlier]
        asking = [t for t, p in zip(earlier, places) if p is None and not t.state.is_finished()]
        if not asking or time.time() > deadline:
            break
        time.sleep(0.05)
    held = {i if p is None else int(p) for i, p in enumerate(places)}
    return min(set(range(len(held) + 1)) - held)


def _surplus(study, number: int, trials: int) -> bool:
    """Trial ``number`` is beyond the ``trials`` that count, all asked before it (processes sharing a study)."""
    import optuna

    before = [t for t in study.get_trials(deepcopy=False) if t.number <= number and
              t.state != optuna.trial.TrialState.WAITING and not t.system_attrs.get("pflx_interrupted")]
    return len(before) > trials


def _mark_interrupted(study, trial_id: int, why: str) -> None:
    import optuna

    storage = study._storage
    if storage.get_trial(trial_id).state.is_finished():
        # Ctrl-C after tell() recorded the trial: its result stands (Optuna refuses to update a finished trial,
        # and the UpdateFinishedTrialError ended the command with exit 1 instead of the interrupt's 130)
        return
    storage.set_trial_system_attr(trial_id, "pflx_interrupted", True)
    storage.set_trial_user_attr(trial_id, "error", f"{INTERRUPTED}: {why}")
    storage.set_trial_state_values(trial_id, optuna.trial.TrialState.FAIL)


# A running trial's process records the time every HEARTBEAT_S seconds (its ``pflx_beat``); a trial of another
# machine whose last beat is STALE_S seconds old is taken as lost with its machine (the machines' clocks are
# assumed to agree to well within a minute, as NTP keeps them).
HEARTBEAT_S, STALE_S = 15.0, 120.0
ASK_GRACE_S = 10.0  # a trial asked this long ago without a pid recorded was left by a stopped process


@contextlib.contextmanager
def _heartbeat(storage, trial_id: int):
    """While the block runs (the trial trains), record its ``pflx_beat`` every HEARTBEAT_S seconds."""
    import threading

    stop = threading.Event()

    def beat() -> None:
        while not stop.wait(HEARTBEAT_S):
            try:
                storage.set_trial_system_attr(trial_id, "pflx_beat", time.time())
            except Exception:  # noqa: BLE001 - the trial finished or the storage failed: the loop reports that
                return

    thread = threading.Thread(target=beat, name="pflx-trial-heartbeat", daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join()


def _orphaned(trial) -> bool:
    """A RUNNING trial whose process is gone: it carries the pid and host that started it (this machine: the pid
    is not alive), or its heartbeat (another machine: no beat for STALE_S seconds)."""
    import socket

    pid, host = trial.system_attrs.get("pflx_pid"), trial.system_attrs.get("pflx_host")
    if pid is None and trial.datetime_start is not None:
        # asked, and no pid written within ASK_GRACE_S: its process stopped between Optuna's ask and pflx's
        # records (a live one writes them within milliseconds); without this a rerun waited for it forever
        import datetime

        return (datetime.datetime.now() - trial.datetime_start).total_seconds() > ASK_GRACE_S
    if pid is None or host != socket.gethostname():
        beat = trial.system_attrs.get("pflx_beat")
        return pid is not None and (host is None or beat is not None and time.time() - float(beat) > STALE_S)
    try:
        os.kill(int(pid), 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        return False
    return False


