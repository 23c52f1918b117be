"""The study of `pflx tune`: Optuna trials that each train a config on validation data and score it there.

>>> # a sketch of the library use (the CLI adds the artifact, resumption and processes):
>>> # study = open_study("sqlite:///t/study.db", "s", sampler=make_sampler("tpe", params, seed=0),
>>> #                    pruner=make_pruner("median"), meta={"algorithm": "fedavg", "partition": sha})
>>> # study.optimize(Objective(data, cfg, params), n_trials=12, catch=(TrialFailed,))

Each trial draws the searched keys (:func:`pfl_cli.tune.space.suggest`), trains with
:func:`pfl_cli.fl.api.train_federated` on the tuning partition (:mod:`pfl_cli.tune.split`) and
returns the headline accuracy on the group the method is for (the train clients' validation split,
or the validation clients). Every evaluation is reported to the pruner, which stops a trial whose
curve trails the others (median rule, Optuna's MedianPruner; or successive halving, Li et al. 2018).
A trial that diverges or whose drawn config is invalid is recorded as failed with its reason and the
study goes on.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import os
import time
from dataclasses import dataclass
from typing import Any, Callable, Mapping, Sequence

import numpy as np

from pfl_cli.errors import ConfigError, InputError, PflxError

SAMPLERS = ("tpe", "random", "grid")
PRUNERS = ("median", "halving", "none")
# A study's identity: every setting that changes what one of its trials computes. A resumed study (the same
# --storage and --study-name, or the staging study beside --out) must have been made with all of them equal,
# or its trials and the new ones would be ranked together (best.yaml: a config never evaluated). Each name
# is stored as a user attribute of the study; the flag is what the refusal tells the user to look at.
IDENTITY = {
    "algorithm": "--algorithm",
    "config": "--config / --set / training flags",
    "space": "--space",
    "rounds": "--rounds",
    "objective": "--label-mask",
    "validation": "--validation-fraction / --validation-clients",
    "partition": "--partition",
    "version": "the pflx version",
}
# Config keys that are not part of the identity: where it runs, what is also written, and the keys that are
# identity components of their own (label_mask is the objective's metric).
_NOT_IDENTITY = ("device", "write_nonprivate", "algorithm", "rounds", "label_mask")


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


def objective_of(algorithm_class: type, label_mask: bool) -> dict[str, str]:
    """The group and metric a study maximizes: the method's own clients, its headline metric."""
    group = "holdout" if getattr(algorithm_class, "tune_group", "train") == "new" else "train"
    return {"group": group, "scored_on": "validation clients" if group == "holdout" else
            "train clients' validation samples",
            "metric": "mean_accuracy_lm" if label_mask else "mean_accuracy"}


def make_sampler(kind: str, params: Sequence, *, seed: int | None):
    import optuna

    if kind not in SAMPLERS:
        raise ConfigError(f"--sampler must be one of {', '.join(SAMPLERS)}; got {kind!r}.")
    if kind == "grid":
        return optuna.samplers.GridSampler({p.key: p.stored_values() for p in params}, seed=seed)
    if kind == "random":
        return optuna.samplers.RandomSampler(seed=seed)
    # a few random trials first, as TPE needs (Bergstra et al. 2011); fewer than Optuna's 10 so that a
    # 12-trial study still models the space
    return optuna.samplers.TPESampler(seed=seed, n_startup_trials=4)


def grid_size(params: Sequence) -> int:
    return int(np.prod([len(p.stored_values()) for p in params]))


def make_pruner(kind: str, *, rounds: int = 0):
    """The pruner; no trial is judged before a quarter of its ``rounds`` (hypernetwork methods such as PeFLL
    rise late, and a first evaluation says little about where a curve ends)."""
    import optuna

    if kind not in PRUNERS:
        raise ConfigError(f"--pruner must be one of {', '.join(PRUNERS)}; got {kind!r}.")
    warmup = max(int(rounds) // 4, 0)
    if kind == "median":
        # a trial is stopped once its curve is below the median of earlier trials at the same round; the
        # first four trials (the sampler's random start) run whole so the median means something
        return optuna.pruners.MedianPruner(n_startup_trials=4, n_warmup_steps=warmup)
    if kind == "halving":
        return optuna.pruners.SuccessiveHalvingPruner(min_resource=max(warmup, 1), reduction_factor=3)
    return optuna.pruners.NopPruner()


def open_storage(url: str):
    """An Optuna RDB storage at ``url`` (``sqlite:///PATH``, ``postgresql://...``); InputError if it cannot open
    (:func:`pfl_cli.tune.storage.open_storage`: the driver, and the schema created by one process at a time)."""
    from pfl_cli.tune.storage import open_storage as open_rdb

    return open_rdb(url)


def study_identity(cfg, params: Sequence, objective: Mapping[str, str], *, validation: Mapping[str, Any],
                   partition: str) -> dict[str, Any]:
    """The identity (IDENTITY) of a study of ``cfg`` over ``params``: JSON values, as stored in the study."""
    import json

    from pfl_cli import __version__
    from pfl_cli.config import config_to_dict

    searched = {p.key for p in params}
    base = {k: v for k, v in config_to_dict(cfg).items() if k not in _NOT_IDENTITY and k not in searched}
    ident = {"algorithm": cfg.algorithm, "config": base, "space": canonical_space(params), "rounds": int(cfg.rounds),
             "objective": f"{objective['group']}:{objective['metric']}", "validation": dict(validation),
             "partition": partition, "version": __version__}
    assert set(ident) == set(IDENTITY)
    return json.loads(json.dumps(ident))  # as the storage gives it back (tuples as lists)


def canonical_space(params: Sequence) -> dict[str, str]:
    """The space as the study draws and stores it, one text per key: two spellings of one space are one text.

    A numeric choice is stored by its rank among its values (``Param.ordered``), so its values are listed sorted
    and typed (``choice:0,0.5`` and ``choice:0.5,0.0`` of a float key are ``choice:0,0.5``); any other choice is
    stored by its label, in the order given (Optuna's categorical distribution), so it stays as typed. A bound
    is the shortest text that reads back as the same float (``%g``, or all its digits where ``%g`` loses some:
    0.1000001 is not 0.1)."""
    def show(v) -> str:
        if isinstance(v, int) and not isinstance(v, bool):
            return str(v)
        short = f"{float(v):g}"
        return short if float(short) == float(v) else repr(float(v))

    out = {}
    for p in params:
        if p.ordered:
            out[p.key] = "choice:" + ",".join(show(v) for v in sorted(p.choices))
        elif p.kind == "choice":
            out[p.key] = p.spec()
        else:
            bound = (lambda v: str(int(v))) if p.kind == "int" else show
            out[p.key] = f"{p.kind}:{bound(p.low)}:{bound(p.high)}"
    return out


def identity_digest(identity: Mapping[str, Any]) -> str:
    import hashlib
    import json

    return hashlib.sha256(json.dumps(identity, sort_keys=True).encode()).hexdigest()[:16]


def identity_differences(have: Mapping[str, Any], want: Mapping[str, Any]) -> list[str]:
    """One short phrase per identity component that differs: ``rounds (--rounds): 4 in the study, 2 now``."""
    def short(v: Any) -> str:
        text = v if isinstance(v, str) else ",".join(f"{k}={x}" for k, x in v.items()) if isinstance(v, dict) \
            else str(v)
        return text if len(text) <= 60 else text[:57] + "..."

    out, missing = [], [key for key in IDENTITY if key in want and key not in have]
    if missing:
        out.append(f"{', '.join(missing)}: not recorded in the study (made by an earlier pflx)")
    for key, flag in IDENTITY.items():
        if key not in want or key not in have:
            continue
        if have[key] != want[key]:
            a, b = have[key], want[key]
            if isinstance(a, dict) and isinstance(b, dict):  # name the keys, not two long dicts
                keys = sorted(k for k in set(a) | set(b) if a.get(k, "-") != b.get(k, "-"))
                a, b = {k: a.get(k, "-") for k in keys}, {k: b.get(k, "-") for k in keys}
            out.append(f"{key} ({flag}): {short(a)} in the study, {short(b)} now")
    return out


def open_study(storage, name: str, *, sampler, pruner, meta: Mapping[str, Any], force: bool = False,
               on_replaced: Callable[[str], None] | None = None):
    """Create the study, or load it when it exists and has the same identity (``meta``, see
    :func:`study_identity`); a study of another identity is refused naming what differs, or with ``force``
    deleted and made afresh (``on_replaced`` is told what was deleted). Empty ``meta``: load without checking
    (worker processes of a study the parent opened). Under :func:`pfl_cli.tune.storage.exclusive`: processes
    that start together on one database open the study one at a time, so none reads a half-stored identity."""
    from pfl_cli.tune.storage import exclusive

    with exclusive(storage):
        return _open_study(storage, name, sampler=sampler, pruner=pruner, meta=meta, force=force,
                           on_replaced=on_replaced)


def _open_study(storage, name: str, *, sampler, pruner, meta: Mapping[str, Any], force: bool = False,
                on_replaced: Callable[[str], None] | None = None):
    import optuna

    study = optuna.create_study(storage=storage, study_name=name, sampler=sampler, pruner=pruner,
                                direction="maximize", load_if_exists=True)
    if not meta:
        return study
    have = study.user_attrs
    if not have and not study.trials:  # a new study: it takes this command's identity
        for key, value in meta.items():
            study.set_user_attr(key, value)
        return study
    differ = identity_differences(have, meta)
    if not differ:
        return study
    if force:
        n = len(study.trials)
        optuna.delete_study(study_name=name, storage=storage)
        if on_replaced is not None:
            on_replaced(f"--force: deleted the study {name!r} ({n} trials; it differed in "
                        f"{', '.join(d.split(' (')[0].split(':')[0] for d in differ)}) and started a fresh one.")
        return _open_study(storage, name, sampler=sampler, pruner=pruner, meta=meta)
    if not any(key in have for key in IDENTITY):  # giving settings again cannot make such a study resumable
        raise InputError(f"--storage / --out: the existing study {name!r} ({len(study.trials)} trials) was made by "
                         "an earlier pflx, which did not record its settings, so pflx cannot tell whether its trials "
                         "are of this search; give another --study-name or --out, or --force to delete that study "
                         "and start a fresh one.")
    raise refusal(name, differ)


def refusal(name: str, differ: Sequence[str]) -> InputError:
    return InputError(f"--storage / --out: the existing study {name!r} was made with other settings, and a study "
                      f"resumes only the same search: {'; '.join(differ)}. Give the study's settings again, or "
                      "another --study-name or --out, or --force to delete that study and start a fresh one.")


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
        or the exception that ends it (``optuna.TrialPruned``, :class:`TrialFailed`, another error). Each trial
        reports and is pruned on its own curve; a pruned trial leaves the stack and the others go on."""
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

        hooks = [self._reporter(trial, cfg, on_round(j)) for j, (_, trial, cfg) in enumerate(started)]
        d = self.data
        results = train_stacked(d.x, d.y, d.num_classes, d.partition, [cfg for _, _, cfg in started],
                                labeled=d.labeled, vocab_size=d.vocab_size,
                                on_progress=lambda j, done, total, status: hooks[j](done, total, status))
        for (i, trial, cfg), got in zip(started, results):
            try:
                out[i] = self._finish(trial, cfg, got.run, got.error)
            except BaseException as err:  # noqa: BLE001 - handed to the loop, which tells the trial's state
                out[i] = err
        return out

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


INTERRUPTED = "interrupted (not counted: the same command runs this config again)"


def still_rising(study) -> int | None:
    """The last round when every finished trial's validation curve still rises there, else None.

    A curve rises at its end when its last reported value is above the one before it (a study's
    trials all train the same ``--rounds``): then the budget, not the settings, may be what limits
    the best score, and more rounds are worth a try. Pruned trials stopped early and do not count.
    """
    import optuna

    ends = []
    for t in study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.COMPLETE,)):
        if "duplicate_of" in t.user_attrs:
            continue
        curve = sorted(t.intermediate_values.items())
        if len(curve) < 2 or not curve[-1][1] > curve[-2][1]:
            return None
        ends.append(curve[-1][0])
    return max(ends) if ends else None


def rounds_done(study, rounds: int, trials: int) -> int:
    """Rounds trained so far for ``--trials`` trials of ``rounds`` each: all of a finished trial's (pruned ones
    included: their rest is not to be trained), the last reported round of a running one (the workers of
    ``--jobs`` report at each evaluation)."""
    import optuna

    finished = running = 0
    for t in study.get_trials(deepcopy=False):
        if t.state == optuna.trial.TrialState.WAITING or t.system_attrs.get("pflx_interrupted"):
            continue
        if t.state == optuna.trial.TrialState.RUNNING:
            running += max(t.intermediate_values, default=0)
        else:
            finished += 1
    return min(min(finished, trials) * rounds + running, trials * rounds)


def counted(study) -> int:
    """The trials that count against --trials: all but the interrupted ones (Ctrl-C, a killed process) and
    the queued ones."""
    import optuna

    return sum(1 for t in study.get_trials(deepcopy=False) if t.state != optuna.trial.TrialState.WAITING
               and not t.system_attrs.get("pflx_interrupted"))


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
    storage.set_trial_system_attr(trial_id, "pflx_interrupted", True)
    storage.set_trial_user_attr(trial_id, "error", f"{INTERRUPTED}: {why}")
    if not storage.get_trial(trial_id).state.is_finished():
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


def trial_rows(study, params: Sequence) -> tuple[list[str], list[list]]:
    """trials.csv: number, state, value, each searched key, selected round, seconds, error, the validation curve."""
    keys = [p.key for p in params]
    header = ["number", "state", "value", *keys, "selected_round", "seconds", "error", "curve"]
    rows = []
    for t in study.trials:
        if t.system_attrs.get("pflx_surplus"):  # asked by a process that came second, never run
            continue
        seconds = (t.datetime_complete - t.datetime_start).total_seconds() if t.datetime_complete and \
            t.datetime_start else None
        curve = ";".join(f"{step}:{v:.6g}" for step, v in sorted(t.intermediate_values.items()))
        rows.append([t.number, _state(t), t.value,
                     *(p.label(t.params[p.key]) if p.key in t.params else None for p in params),
                     t.user_attrs.get("selected_round"), None if seconds is None else round(seconds, 3),
                     t.user_attrs.get("error", ""), curve])
    return header, rows


def best_trial(study):
    """The completed trial of the highest value; InputError-free None when no trial completed."""
    import optuna

    done = [t for t in study.trials if t.state == optuna.trial.TrialState.COMPLETE and t.value is not None]
    return max(done, key=lambda t: (t.value, -t.number)) if done else None


def best_values(trial, params: Sequence) -> dict[str, Any]:
    """The typed config values of ``trial`` (choices mapped back from the ranks or labels the study stores)."""
    out = {}
    for p in params:
        v = trial.params[p.key]
        out[p.key] = p.decode(v)
    return out


def state_counts(study) -> dict[str, int]:
    counts: dict[str, int] = {}
    for t in study.trials:
        if t.system_attrs.get("pflx_surplus"):
            continue
        counts[_state(t)] = counts.get(_state(t), 0) + 1
    return counts


def _state(trial) -> str:
    """complete | pruned | fail | running, or interrupted (a failed trial that does not count)."""
    return "interrupted" if trial.system_attrs.get("pflx_interrupted") else trial.state.name.lower()
