"""The study of `pflx tune`: its sampler and pruner, its storage and identity, and what it holds.

>>> # a sketch of the library use (the CLI adds the artifact, resumption and processes):
>>> # study = open_study(open_storage("sqlite:///t/study.db"), "s", sampler=make_sampler("tpe", params, seed=0),
>>> #                    pruner=make_pruner("median"), meta={"algorithm": "fedavg", "partition": sha})
>>> # optimize(study, Objective(data, cfg, params, group="train", metric="mean_accuracy"), 12)

Each trial (:mod:`pfl_cli.tune.trial`) draws the searched keys (:func:`pfl_cli.tune.space.suggest`), trains with
:func:`pfl_cli.fl.api.train_federated` on the tuning partition (:mod:`pfl_cli.tune.split`) and returns the
headline accuracy on the group the method is for (the train clients' validation split, or the validation
clients). Every evaluation is reported to the pruner, which stops a trial whose curve trails the others (median
rule, Optuna's MedianPruner; or successive halving, Li et al. 2018). The ask-and-tell loop, stacks of trials,
and the trials of processes that stopped are :mod:`pfl_cli.tune.loop`'s. A trial that diverges or whose drawn
config is invalid is recorded as failed with its reason and the study goes on.
"""

from __future__ import annotations

from typing import Any, Callable, Mapping, Sequence

import numpy as np

from pfl_cli.errors import ConfigError, InputError

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
