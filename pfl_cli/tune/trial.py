"""One trial of a study: draw the searched keys, train on the validation data (alone, or stacked with other
trials on a run axis), report every evaluation to the pruner, return the selected score; a trial that cannot
finish is :class:`TrialFailed` (recorded as failed, never fatal)."""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any, Callable, Mapping, Sequence

import numpy as np

from pfl_cli.errors import ConfigError, PflxError


class TrialFailed(Exception):
    """A trial that could not finish (diverged, invalid drawn config): recorded as failed, never fatal."""


@dataclass(frozen=True)
class TuningData:
    """What every trial trains and scores on: the dataset and the tuning partition (validation data only)."""

    x: np.ndarray
    y: np.ndarray
    num_classes: int
    partition: Any          # pfl_cli.tune.split.validation_partition(...)
    labeled: np.ndarray | None = None
    vocab_size: int | None = None  # text data (token codes): the dataset's vocabulary


class Objective:
    """One trial: draw, train on validation data, report every evaluation, return the selected score."""

    def __init__(self, data: TuningData, base_cfg, params: Sequence, *, group: str, metric: str,
                 on_trial: Callable[[int, int], None] | None = None, identity: str | None = None,
                 on_round: Callable[[int], None] | None = None) -> None:
        self.data, self.base_cfg, self.params = data, base_cfg, tuple(params)
        self.group, self.metric = group, metric
        self.on_trial = on_trial
        self.on_round = on_round  # the trial's rounds done, for a progress display finer than one line a trial
        self.identity = identity  # identity_digest of the study's identity: a cached result is reused only within it

    def config(self, values: Mapping[str, Any]):
        from pfl_cli.fl.api import validate_train_config

        cfg = dataclasses.replace(self.base_cfg, **values)
        validate_train_config(cfg)
        return cfg

    def __call__(self, trial) -> float:
        from pfl_cli.fl.api import train_federated

        cfg, value = self._begin(trial)
        if cfg is None:
            return value
        d = self.data
        try:
            run = train_federated(d.x, d.y, d.num_classes, d.partition, cfg, labeled=d.labeled,
                                  vocab_size=d.vocab_size, on_progress=self._reporter(trial, cfg, self.on_round))
        except BaseException as err:  # noqa: BLE001 - _finish says what a trial's error means
            return self._finish(trial, cfg, None, err)
        return self._finish(trial, cfg, run, None)

    def stacked(self, trials: Sequence) -> list:
        """``trials`` trained at once on a run axis (:func:`pfl_cli.fl.stack.train_stacked`): per trial its value,
        the exception that ends it (:class:`TrialFailed`, another error), or a :class:`Settle` whose ``settle()``
        the loop calls in the trials' order, each once the trials before it are told.

        The pruner decides after the stack has trained, on each trial's recorded curve, in that order: then a
        trial sees the earlier trials of its stack finished, as it would one trial at a time (a MedianPruner reads
        the completed trials only: deciding while the stack trains, no trial of a stack saw another complete, and
        a stacked study pruned other trials than the unstacked one: issue 49, finding 10). A trial that the pruner
        stops trains to the end all the same: pruning saves no rounds in a stack."""
        import threading

        from pfl_cli.fl.stack import train_stacked

        out: list = [None] * len(trials)
        started = []
        for i, trial in enumerate(trials):
            try:
                cfg, value = self._begin(trial)
            except BaseException as err:  # noqa: BLE001 - this trial's failure alone
                out[i] = err
                continue
            if cfg is None:
                out[i] = value
            else:
                started.append((i, trial, cfg))
        if not started:
            return out
        lock, rounds = threading.Lock(), [0] * len(started)

        def on_round(j: int):
            def moved(done: int) -> None:
                with lock:  # the stack's rounds in all, for the one progress display
                    rounds[j] = done
                    if self.on_round is not None:
                        self.on_round(sum(rounds))
            return moved

        curves: list[list] = [[] for _ in started]
        hooks = [self._recorder(cfg, curves[j], on_round(j)) for j, (_, _trial, cfg) in enumerate(started)]
        d = self.data
        results = train_stacked(d.x, d.y, d.num_classes, d.partition, [cfg for _, _, cfg in started],
                                labeled=d.labeled, vocab_size=d.vocab_size,
                                on_progress=lambda j, done, total, status: hooks[j](done, total, status))
        for (i, trial, cfg), got, curve in zip(started, results, curves):
            out[i] = Settle(self, trial, cfg, got, curve)
        return out

    def _recorder(self, cfg, curve: list, on_round):
        """A stacked run's ``on_progress``: its evaluations recorded as ``(round, value)`` for :class:`Settle`."""
        total = cfg.rounds if cfg.algorithm_class.federated else 0

        def on_progress(done: int, _total: int, status: dict) -> None:
            if on_round is not None:
                on_round(done)
            if (done % cfg.eval_every == 0 or done == total) and self.group in status:
                curve.append((done, float(status[self.group])))

        return on_progress

    def _begin(self, trial):
        """``(cfg, None)``: the trial's config to train; ``(None, value)``: a config drawn again, scored as before."""
        import optuna

        from pfl_cli.tune.space import suggest

        trial.storage.set_trial_system_attr(trial._trial_id, "pflx_identity", self.identity)
        values = suggest(trial, self.params)
        done = _same_config(trial, self.identity)
        if done is not None:  # a finite space's sampler drew a config again: its result, without training again
            trial.set_user_attr("duplicate_of", done.number)
            for step, value in sorted(done.intermediate_values.items()):
                trial.report(value, step)
            if done.state == optuna.trial.TrialState.PRUNED:
                raise optuna.TrialPruned(f"the same config as trial {done.number}, which was pruned")
            if "selected_round" in done.user_attrs:
                trial.set_user_attr("selected_round", done.user_attrs["selected_round"])
            return None, float(done.value)
        try:
            return self.config(values), None
        except PflxError as err:
            trial.set_user_attr("error", f"invalid config: {err}")
            raise TrialFailed(str(err)) from None

    def _reporter(self, trial, cfg, on_round):
        """The run's ``on_progress``: every evaluation reported to the pruner, which may stop the trial."""
        import optuna

        total = cfg.rounds if cfg.algorithm_class.federated else 0

        def on_progress(done: int, _total: int, status: dict) -> None:
            if on_round is not None:
                on_round(done)
            if (done % cfg.eval_every == 0 or done == total) and self.group in status:
                value = float(status[self.group])
                if math.isfinite(value):
                    trial.report(value, done)
                if trial.should_prune():
                    raise optuna.TrialPruned(f"pruned at round {done} (validation accuracy {value:.4f})")

        return on_progress

    def _finish(self, trial, cfg, run, error) -> float:
        """The trial's score from its finished ``run``, or what its ``error`` means (raised)."""
        from pfl_cli.fl.loop import TrainingDiverged

        if isinstance(error, TrainingDiverged):
            trial.set_user_attr("error", f"diverged at round {error.round}")
            raise TrialFailed(f"diverged at round {error.round}") from None
        if isinstance(error, ConfigError):
            # the drawn config is refused once the run meets its data (a key without effect in these rounds or on
            # this partition, e.g. APPLE's proximal keys in under 10 rounds): this trial fails, the study goes on
            trial.set_user_attr("error", f"invalid config: {error}")
            raise TrialFailed(str(error)) from None
        if error is not None:
            raise error
        total = cfg.rounds if cfg.algorithm_class.federated else 0
        summary = run.outcome.best.summaries().get(self.group)
        value = float("nan") if summary is None else float(summary[self.metric])
        if not math.isfinite(value):
            trial.set_user_attr("error", f"no finite {self.metric} on the {self.group} group")
            raise TrialFailed("no finite score")
        trial.set_user_attr("selected_round", int(run.outcome.best.round))
        if not total:  # no rounds, no curve: the one evaluation is the curve
            trial.report(value, 0)
        return value


class Settle:
    """A stacked trial trained to the end, judged when the loop asks (:meth:`Objective.stacked`): its curve
    reported to the pruner evaluation by evaluation, as :meth:`Objective._reporter` reports one trial at a time."""

    def __init__(self, objective: Objective, trial, cfg, got, curve: list) -> None:
        self.objective, self.trial, self.cfg, self.got, self.curve = objective, trial, cfg, got, curve

    def settle(self) -> float:
        """The trial's score, or ``optuna.TrialPruned`` where the pruner stops it, or what its error means."""
        import optuna

        for done, value in self.curve:
            if math.isfinite(value):
                self.trial.report(value, done)
            if self.trial.should_prune():
                raise optuna.TrialPruned(f"pruned at round {done} (validation accuracy {value:.4f})")
        return self.objective._finish(self.trial, self.cfg, self.got.run, self.got.error)


def _same_config(trial, identity: str | None = None):
    """An earlier finished (complete or pruned) trial with exactly ``trial``'s values and the same identity
    (:func:`identity_digest`: the same base config, rounds, validation carve, ...), or None.

    Every trial trains with the same seed, so the same config gives the same curve: TPE and random search
    over ``choice``/``int`` keys draw configs again, and those cost nothing (Optuna's FAQ recipe).
    """
    import optuna

    finished = (optuna.trial.TrialState.COMPLETE, optuna.trial.TrialState.PRUNED)
    for t in trial.study.get_trials(deepcopy=False, states=finished):
        if t.params == trial.params and t.system_attrs.get("pflx_identity") == identity:
            return t
    return None


