"""A comparison spec: algorithms x seeds on one partition, each algorithm with its own config file
(e.g. a tune artifact's ``best.yaml``), for ``pflx compare --spec``. Parsing and validation only;
the command runs the trainings.

::

    partition: runs/part                 # the partition artifact every run trains on (required)
    seeds: [0, 1, 2]                     # one training per algorithm and seed (required)
    runs: runs/cmp-runs                  # where the train / predict artifacts go (default: <out>-runs)
    new_clients: true                    # predict --clients holdout for every run (default true)
    stack: 8                             # runs of a stackable algorithm trained at once on a run axis (default 8)
    algorithms:                          # name -> config (required)
      fedavg: runs/tune-fedavg/best.yaml           # a config file `train --config` takes
      ditto: {config: runs/tune-ditto/best.yaml, set: {rounds: 300}}
      local: {}                                    # the algorithm's defaults
      fedprox:                                     # tuned first: a study, then the seeds with its best.yaml
        tune: {trials: 20, rounds: 100, space: {mu: "log:1e-3:1"}}

An algorithm's ``tune:`` entry runs a study as ``pflx tune`` would (its keys are tune's options:
``trials``, ``rounds``, ``eval_every``, ``space`` (key -> SPEC), ``sampler``, ``pruner``,
``validation_fraction``, ``validation_clients``, ``seed``) on the algorithm's config file and ``set``
(except ``rounds``, the study's own budget), writing the tune artifact to ``<runs>/tune-<name>``; the
seeds then train with its ``best.yaml`` and the ``set`` on top. A key the study searches may be fixed
neither by the config file nor by ``set`` (the search would be moot or overridden).

``stack: K`` (an integer >= 1, default 8): the seeds of an algorithm whose runs stack on a run axis
(:mod:`pfl_cli.fl.stack`: those that declare it: fedavg, fedprox, pefll) train K at a time in one
process, as ``pflx train --seeds`` trains them -- each seed's artifact exactly where and as its own training
writes it, its model equal to the separate run's (bit-identical on the engine's equal-results tests) -- and its
study runs ``pflx tune --stack K`` (K trials asked, trained stacked, then told; with ``compare --jobs N`` > 1 the
study's trials run in N processes instead, one at a time each). ``stack: 1`` trains and tunes one run at a time.
Algorithms that do not stack always do. A ``tune:`` entry's own ``stack`` sets its study's ``--stack`` (refused,
as pflx tune refuses it, for an algorithm that cannot stack or with ``--jobs`` > 1).

Relative paths are read from the working directory, as on the command line. Precedence per run:
the algorithm's defaults < its config file < its ``set`` < the spec's seed.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping, Sequence

from pfl_cli.errors import ConfigError

KEYS = ("partition", "seeds", "runs", "new_clients", "stack", "algorithms")
STACK = 8  # the default of the spec's stack: runs of a stackable algorithm trained at once
ALGORITHM_KEYS = ("config", "set", "tune")
# A tune: entry's keys: pflx tune's options of the same names (pfl_cli.cli.tune).
TUNE_KEYS = ("trials", "rounds", "eval_every", "space", "sampler", "pruner", "validation_fraction",
             "validation_clients", "seed", "stack")


@dataclass(frozen=True)
class TuneSpec:
    """An algorithm's study: pflx tune's options (None: tune's default)."""

    trials: int
    rounds: int | None = None
    eval_every: int | None = None
    space: tuple[tuple[str, str], ...] = ()   # key -> SPEC, as --space KEY=SPEC
    sampler: str | None = None
    pruner: str | None = None
    validation_fraction: float = 0.2
    validation_clients: float | None = None
    seed: int = 0
    stack: int | None = None                  # --stack (None: the spec's stack where the algorithm stacks)

    def to_dict(self) -> dict[str, Any]:
        return {"trials": self.trials, "rounds": self.rounds, "eval_every": self.eval_every, "space": dict(self.space),
                "sampler": self.sampler, "pruner": self.pruner, "validation_fraction": self.validation_fraction,
                "validation_clients": self.validation_clients, "seed": self.seed,
                **({} if self.stack is None else {"stack": self.stack})}


@dataclass(frozen=True)
class AlgorithmSpec:
    name: str
    config: Path | None               # a config file train --config takes
    sets: tuple[tuple[str, Any], ...]  # key -> value, on top of the file
    tune: TuneSpec | None = None       # a study first: the seeds train with its best.yaml


@dataclass(frozen=True)
class CompareSpec:
    partition: Path
    seeds: tuple[int, ...]
    runs: Path | None
    new_clients: bool
    algorithms: tuple[AlgorithmSpec, ...]
    stack: int = STACK                 # runs of a stackable algorithm trained at once on a run axis
    path: Path | None = None           # the file it was read from (named in refusals; not part of the protocol)

    def to_dict(self) -> dict[str, Any]:
        """The resolved spec, JSON-ready (recorded in the compare artifact's config)."""
        return {"partition": str(self.partition), "seeds": list(self.seeds),
                "runs": None if self.runs is None else str(self.runs), "new_clients": self.new_clients,
                "stack": self.stack,
                "algorithms": {a.name: {"config": None if a.config is None else str(a.config), "set": dict(a.sets),
                                        **({} if a.tune is None else {"tune": a.tune.to_dict()})}
                               for a in self.algorithms}}


def _refuse(where: str, message: str) -> ConfigError:
    return ConfigError(f"--spec {where}: {message}")


def load_spec(path: str | Path, *, known: Sequence[str] = ()) -> CompareSpec:
    """Read and validate the spec file at ``path`` (ConfigError, exit 2, naming the key, otherwise); ``known`` as
    :func:`parse_spec` takes it."""
    import yaml

    from pfl_cli import yaml12
    from pfl_cli.formats import read_utf8

    path = Path(path)
    if not path.is_file():
        raise _refuse(str(path), "no such file.")
    try:
        doc = yaml12.loads(read_utf8(path, "--spec", ConfigError))
    except yaml.YAMLError as err:
        raise _refuse(str(path), f"not valid YAML ({yaml12.describe_error(err)}).") from None
    import dataclasses

    return dataclasses.replace(parse_spec(doc, where=str(path), known=known), path=path)


def parse_spec(doc: Any, *, where: str = "spec", known: Sequence[str] = ()) -> CompareSpec:
    """A :class:`CompareSpec` from the parsed YAML document ``doc``; ``known``: the algorithm names a spec may use
    (the caller's registry: this module stays below it), unchecked when empty."""
    if not isinstance(doc, Mapping):
        raise _refuse(where, f"expected a mapping with {', '.join(KEYS)}; got {type(doc).__name__}.")
    unknown = sorted(set(doc) - set(KEYS))
    if unknown:
        raise _refuse(where, f"unknown key {unknown[0]!r}; a spec has {', '.join(KEYS)}.")
    for key in ("partition", "seeds", "algorithms"):
        if key not in doc:
            raise _refuse(where, f"missing key {key!r}.")
    if not isinstance(doc["partition"], str) or not doc["partition"]:
        raise _refuse(where, f"partition must name a partition artifact; got {doc['partition']!r}.")
    seeds = doc["seeds"]
    if (not isinstance(seeds, list) or not seeds
            or not all(isinstance(s, int) and not isinstance(s, bool) and s >= 0 for s in seeds)):
        raise _refuse(where, f"seeds must be a non-empty list of integers >= 0; got {seeds!r}.")
    if len(set(seeds)) != len(seeds):
        raise _refuse(where, f"seeds must be distinct (each seed is one run); got {seeds!r}.")
    runs = doc.get("runs")
    if runs is not None and (not isinstance(runs, str) or not runs):
        raise _refuse(where, f"runs must be a directory path; got {runs!r}.")
    new_clients = doc.get("new_clients", True)
    if not isinstance(new_clients, bool):
        raise _refuse(where, f"new_clients must be true or false; got {new_clients!r}.")
    stack = doc.get("stack", STACK)
    if not _integer(stack) or stack < 1:
        raise _refuse(where, f"stack must be an integer >= 1 (runs trained at once on a run axis; 1: one at a time); "
                      f"got {stack!r}.")
    algorithms = doc["algorithms"]
    if not isinstance(algorithms, Mapping) or not algorithms:
        raise _refuse(where, "algorithms must map each algorithm's name to its config file or {config, set}.")
    parsed = []
    for name, value in algorithms.items():
        if not isinstance(name, str) or not name:
            raise _refuse(where, f"algorithms: a name must be a string; got {name!r}.")
        if value is None:
            value = {}
        if isinstance(value, str):
            value = {"config": value}
        if not isinstance(value, Mapping):
            raise _refuse(where, f"algorithms.{name} must be a config file path or a mapping with config and set; "
                          f"got {value!r}.")
        bad = sorted(set(value) - set(ALGORITHM_KEYS))
        if bad:
            raise _refuse(where, f"algorithms.{name}: unknown key {bad[0]!r}; it takes config, set and tune.")
        if known and name not in known:
            import difflib

            hint = difflib.get_close_matches(name, list(known), n=1)
            tip = f" (did you mean {hint[0]!r}?)" if hint else f" (e.g. {', '.join(list(known)[:3])})"
            raise _refuse(where, f"algorithms.{name}: no such algorithm{tip}; `pflx algorithms` lists them.")
        config = value.get("config")
        if config is not None:
            if not isinstance(config, str) or not Path(config).is_file():
                raise _refuse(where, f"algorithms.{name}.config {config!r}: no such file.")
            config = Path(config)
        sets = value.get("set") or {}
        if not isinstance(sets, Mapping) or not all(isinstance(k, str) for k in sets):
            raise _refuse(where, f"algorithms.{name}.set must map config keys to values; got {sets!r}.")
        if "seed" in sets or "algorithm" in sets:
            raise _refuse(where, f"algorithms.{name}.set: seed and algorithm come from the spec (seeds, the name).")
        tune = None if value.get("tune") is None else _parse_tune(value["tune"], f"algorithms.{name}.tune", where)
        parsed.append(AlgorithmSpec(name=name, config=config, sets=tuple(sets.items()), tune=tune))
    return CompareSpec(partition=Path(doc["partition"]), seeds=tuple(seeds), runs=None if runs is None else Path(runs),
                       new_clients=new_clients, algorithms=tuple(parsed), stack=stack)


def _integer(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _choice(values: list) -> str:
    """A YAML list of values as the SPEC ``choice:A,B,...`` (a list value, a tuple key's, in flow style)."""
    import json

    def text(v: Any) -> str:
        if isinstance(v, bool):
            return "true" if v else "false"
        return json.dumps(v) if isinstance(v, (list, dict)) else str(v)

    return "choice:" + ",".join(text(v) for v in values)


def _parse_tune(doc: Any, at: str, where: str) -> TuneSpec:
    """An algorithm's ``tune:`` entry (its values checked here for type and range; the space against the algorithm
    when the command resolves the study's config)."""
    if not isinstance(doc, Mapping):
        raise _refuse(where, f"{at} must be a mapping of pflx tune's options ({', '.join(TUNE_KEYS)}); got {doc!r}.")
    bad = sorted(set(doc) - set(TUNE_KEYS))
    if bad:
        raise _refuse(where, f"{at}: unknown key {bad[0]!r}; it takes {', '.join(TUNE_KEYS)} (pflx tune's options).")
    if "trials" not in doc:
        raise _refuse(where, f"{at}: missing key 'trials' (the study's budget: trials of --rounds each).")
    for key in ("trials", "rounds", "eval_every", "stack"):
        if key in doc and (not _integer(doc[key]) or doc[key] < 1):
            raise _refuse(where, f"{at}.{key} must be an integer >= 1; got {doc[key]!r}.")
    if "seed" in doc and (not _integer(doc["seed"]) or doc["seed"] < 0):
        raise _refuse(where, f"{at}.seed must be an integer >= 0 (the study's seed); got {doc['seed']!r}.")
    space = doc.get("space") or {}
    if isinstance(space, Mapping):  # a list of values is a choice among them: lr: [0.1, 0.01]
        space = {k: _choice(v) if isinstance(v, list) and v else v for k, v in space.items()}
    if not isinstance(space, Mapping) or not all(isinstance(k, str) and isinstance(v, str) for k, v in space.items()):
        raise _refuse(where, f"{at}.space must map keys to SPECs (log:LOW:HIGH | float:LOW:HIGH | int:LOW:HIGH | "
                      f"choice:A,B,... | a list of values), as --space KEY=SPEC; got {space!r}.")
    for key in ("sampler", "pruner"):
        if key in doc and not isinstance(doc[key], str):
            raise _refuse(where, f"{at}.{key} must be a name, as pflx tune --{key} takes; got {doc[key]!r}.")
    for key in ("validation_fraction", "validation_clients"):
        value = doc.get(key)
        if value is not None and (not isinstance(value, (int, float)) or isinstance(value, bool)):
            raise _refuse(where, f"{at}.{key} must be a number, as pflx tune --{key.replace('_', '-')} takes; "
                          f"got {value!r}.")
    return TuneSpec(trials=doc["trials"], rounds=doc.get("rounds"), eval_every=doc.get("eval_every"),
                    space=tuple(space.items()), sampler=doc.get("sampler"), pruner=doc.get("pruner"),
                    validation_fraction=float(doc.get("validation_fraction", 0.2)),
                    validation_clients=None if doc.get("validation_clients") is None
                    else float(doc["validation_clients"]), seed=int(doc.get("seed", 0)), stack=doc.get("stack"))
