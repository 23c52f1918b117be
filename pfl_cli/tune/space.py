"""Search spaces of `pflx tune`: one parameter spec per config key, parsed and checked against the algorithm.

A spec is text, as the user types it after ``--space KEY=``:

- ``log:LOW:HIGH``  a float drawn on a log scale (``LOW > 0``);
- ``float:LOW:HIGH`` a float drawn uniformly;
- ``int:LOW:HIGH``  an integer in ``[LOW, HIGH]`` (integer keys only);
- ``choice:A,B,...`` one of the listed values, each typed as the key declares; ``[A,B,...]`` is the same
  (a spec's ``space: {lr: [0.1, 0.01]}`` too).

Each algorithm declares its own space beside its config (``Algorithm.search_space``, from its paper's
tuning protocol); ``--space`` entries replace a declared key or add one.

>>> parse_spec("lr", "log:1e-3:1")
Param(key='lr', kind='log', low=0.001, high=1.0, choices=(), labels=())
>>> parse_spec("lr", "log:0:1")
Traceback (most recent call last):
...
pfl_cli.errors.ConfigError: --space lr: a log range needs LOW > 0; got 'log:0:1'.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

from pfl_cli.errors import ConfigError

KINDS = ("log", "float", "int", "choice")
# Keys a search may never touch: the privacy budget and its bounds are the user's promise, not a
# knob to optimize against private data, and the seed is what a comparison repeats over.
FORBIDDEN = ("seed", "algorithm", "device", "write_nonprivate", "evaluate_hidden_labels")
FORBIDDEN_PREFIX = "dp_"
# A declared space for an algorithm that declares none: its client step size, the one key every
# federated method tunes (each paper's lr grid spans about two decades around its default).
FALLBACK = {"lr": "log:1e-3:1"}


@dataclass(frozen=True)
class Param:
    """One searched key: ``kind`` in KINDS, a range (``low``, ``high``) or ``choices``."""

    key: str
    kind: str
    low: float = 0.0
    high: float = 0.0
    choices: tuple = ()   # typed as the key declares
    labels: tuple = ()    # the choices as typed on the command line (what the study stores)

    def spec(self) -> str:
        if self.kind == "choice":
            return "choice:" + ",".join(self.labels or (str(c) for c in self.choices))
        show = (lambda v: str(int(v))) if self.kind == "int" else (lambda v: f"{v:g}")
        return f"{self.kind}:{show(self.low)}:{show(self.high)}"

    @property
    def ordered(self) -> bool:
        """A choice of numbers: the study stores its rank among them, so a model-based sampler (TPE) sees
        that 0.01 lies between 0.003 and 0.03 instead of treating the values as unrelated categories."""
        return self.kind == "choice" and all(isinstance(c, (int, float)) and not isinstance(c, bool)
                                             for c in self.choices)

    def _ranked(self) -> list[int]:
        return sorted(range(len(self.choices)), key=lambda i: self.choices[i])

    def stored_values(self) -> list:
        """What the study stores for each value a grid visits (ranks, labels, or the values)."""
        if self.ordered:
            return list(range(len(self.choices)))
        if self.kind == "choice":
            return list(self.labels)
        return self.grid()

    def decode(self, stored):
        """The typed config value of what the study stored."""
        if self.ordered:
            return self.choices[self._ranked()[int(stored)]]
        if self.kind == "choice":
            return self.choices[self.labels.index(stored)]
        return int(stored) if self.kind == "int" else float(stored)

    def label(self, stored) -> str:
        """What a person reads for a stored value (the choice as typed on the command line)."""
        if self.ordered:
            return self.labels[self._ranked()[int(stored)]]
        return str(stored) if self.kind == "choice" else stored

    def grid(self) -> list:
        """The values a grid search visits: the choices, or every integer of an int range."""
        if self.kind == "choice":
            return list(self.choices)
        if self.kind == "int":
            return list(range(int(self.low), int(self.high) + 1))
        raise ConfigError(f"--space {self.key}: a grid search needs a finite set of values (choice:A,B,... or "
                          f"int:LOW:HIGH); got {self.spec()!r}. Use --sampler tpe or list the values.")


def _number(key: str, text: str, spec: str, integer: bool) -> float:
    try:
        value = int(text) if integer else float(text)
    except ValueError:
        what = "an integer" if integer else "a number"
        raise ConfigError(f"--space {key}: bounds must be {what}; got {spec!r}.") from None
    if not math.isfinite(value):
        raise ConfigError(f"--space {key}: bounds must be finite; got {spec!r}.")
    return value


def parse_spec(key: str, spec: str) -> Param:
    """``spec`` (``KIND:...``, or ``[A,B,...]`` for a choice) of ``key`` as a :class:`Param`; a malformed one is a
    ConfigError naming the key."""
    if isinstance(spec, str) and spec.strip().startswith("[") and spec.strip().endswith("]"):
        spec = "choice:" + spec.strip()[1:-1]  # a list of values: a categorical choice among them
    if not isinstance(spec, str) or ":" not in spec:
        raise ConfigError(f"--space {key}: expected KIND:... with KIND one of {', '.join(KINDS)} (e.g. "
                          f"{key}=log:1e-3:1), or a list of values [A,B,...]; got {spec!r}.")
    kind, _, rest = spec.partition(":")
    kind = kind.strip().lower()
    if kind not in KINDS:
        raise ConfigError(f"--space {key}: KIND must be one of {', '.join(KINDS)}; got {kind!r} in {spec!r}.")
    if kind == "choice":
        values = tuple(v.strip() for v in _top_level_split(rest) if v.strip())
        if not values:
            raise ConfigError(f"--space {key}: choice needs at least one value (choice:A,B); got {spec!r}.")
        if len(set(values)) != len(values):
            raise ConfigError(f"--space {key}: choice lists a value twice; got {spec!r}.")
        return Param(key, kind, choices=values, labels=values)
    bounds = rest.split(":")
    if len(bounds) != 2:
        raise ConfigError(f"--space {key}: {kind} needs two bounds, {kind}:LOW:HIGH; got {spec!r}.")
    low, high = (_number(key, b.strip(), spec, kind == "int") for b in bounds)
    if low >= high:
        raise ConfigError(f"--space {key}: LOW must be < HIGH; got {spec!r}.")
    if kind == "log" and low <= 0:
        raise ConfigError(f"--space {key}: a log range needs LOW > 0; got {spec!r}.")
    return Param(key, kind, float(low), float(high))


def _top_level_split(text: str) -> list[str]:
    """``text`` split on the commas outside brackets: ``[1, 2],[2, 3]`` is two values (a tuple key's choices)."""
    out, depth, start = [], 0, 0
    for i, ch in enumerate(text):
        depth += {"[": 1, "{": 1, "]": -1, "}": -1}.get(ch, 0)
        if ch == "," and depth == 0:
            out.append(text[start:i])
            start = i + 1
    return out + [text[start:]]


def parse_space_args(items: Sequence[str]) -> dict[str, str]:
    """``--space KEY=SPEC`` items as {key: spec}; an item without ``=`` or a key given twice is refused."""
    out: dict[str, str] = {}
    for item in items:
        key, sep, spec = str(item).partition("=")
        key = key.strip().replace("-", "_")
        if not sep or not key or not spec.strip():
            raise ConfigError(f"--space: expected KEY=SPEC (e.g. lr=log:1e-3:1); got {item!r}.")
        if key in out:
            raise ConfigError(f"--space: key {key!r} is given twice; give each key once.")
        out[key] = spec.strip()
    return out


def declared_space(algorithm_class: type) -> dict[str, str]:
    """The algorithm's own space (``search_space``), or the client lr when it declares none."""
    own = dict(getattr(algorithm_class, "search_space", {}) or {})
    return own or dict(FALLBACK)


def resolve_space(entry, overrides: Mapping[str, str] | None = None) -> tuple[Param, ...]:
    """The algorithm's declared space with ``overrides`` (from ``--space``), every key checked.

    Parameters
    ----------
    entry : pfl_cli.registry.Entry
        The algorithm (its class and config class).
    overrides : mapping of str to str
        KEY -> SPEC; replaces a declared key or adds one.
    """
    from pfl_cli.registry import unknown_key

    specs = {**declared_space(entry.algorithm), **dict(overrides or {})}
    fields = {f.name: f for f in dataclasses.fields(entry.config)}
    params = []
    for key, spec in specs.items():
        if key in FORBIDDEN or key.startswith(FORBIDDEN_PREFIX):
            raise ConfigError(f"--space {key}: {key} cannot be searched (the privacy budget and its bounds, the seed "
                              "and the algorithm are fixed by the user; compare seeds with pflx compare).")
        if key not in fields:
            raise unknown_key(key, entry, where="--space ")
        if key in entry.algorithm.inert_keys:  # trials that differ only in it would compute the same model
            from pfl_cli.fl.config import inert_refusal

            raise inert_refusal(key, entry.name, entry.algorithm.inert_keys[key], where="--space ")
        param = parse_spec(key, spec)
        params.append(_typed(param, entry.config, fields[key]))
    return tuple(params)


def _typed(param: Param, cls: type, field) -> Param:
    """``param`` checked against the key's declared type: int ranges on int keys, ranges on numeric keys,
    choices typed (and validated) by the key's own schema."""
    from pfl_cli.schema import coerce_field, field_types

    tp = field_types(cls)[param.key]
    base = _numeric_kind(tp)
    if param.kind == "choice":
        from pfl_cli.config import parse_overrides

        try:
            typed = tuple(coerce_field(cls, param.key, parse_overrides([f"{param.key}={v}"])[param.key])
                          for v in param.choices)
        except ConfigError as err:  # the value's own message, under the option the user typed
            raise ConfigError(f"--space {param.key}: {param.spec()!r}: "
                              f"{str(err).removeprefix(f'--set {param.key}: ')}") from None
        for value in typed:
            _obeys_rules(cls, param, value)
        return dataclasses.replace(param, choices=typed)
    if base is None:
        raise ConfigError(f"--space {param.key}: {param.key} is not a number; search it with choice:A,B; got "
                          f"{param.spec()!r}.")
    if param.kind == "int" and base is not int:
        raise ConfigError(f"--space {param.key}: {param.key} is a float key, an int range does not fit it; use "
                          f"float:LOW:HIGH or log:LOW:HIGH; got {param.spec()!r}.")
    if param.kind in ("log", "float") and base is int:
        raise ConfigError(f"--space {param.key}: {param.key} is an integer key; use int:LOW:HIGH; got "
                          f"{param.spec()!r}.")
    for bound in (param.low, param.high):  # each bound passes the key's own rules (e.g. lr > 0)
        _obeys_rules(cls, param, coerce_field(cls, param.key, int(bound) if base is int else bound))
    return param


def _obeys_rules(cls: type, param: Param, value: Any) -> None:
    """``value`` of the searched key passes the config's own validation (ranges such as lr > 0)."""
    try:
        dataclasses.replace(cls(), **{param.key: value}).validate()
    except ConfigError as err:
        raise ConfigError(f"--space {param.key}: {param.spec()!r} reaches {value!r}, which the key does not take "
                          f"({err})") from None


def _numeric_kind(tp: Any) -> type | None:
    import typing

    args = [a for a in typing.get_args(tp) if a is not type(None)] if typing.get_origin(tp) is typing.Union else [tp]
    for a in args:
        if a is bool:
            return None
        if a is int:
            return int
        if a is float:
            return float
    return None


def suggest(trial, params: Sequence[Param]) -> dict[str, Any]:
    """The config values ``trial`` (an Optuna trial) draws from ``params``."""
    out: dict[str, Any] = {}
    for p in params:
        if p.kind == "log":
            out[p.key] = trial.suggest_float(p.key, p.low, p.high, log=True)
        elif p.kind == "float":
            out[p.key] = trial.suggest_float(p.key, p.low, p.high)
        elif p.kind == "int":
            out[p.key] = trial.suggest_int(p.key, int(p.low), int(p.high))
        elif p.ordered:  # the rank of a numeric choice, so TPE models its order (Param.ordered)
            out[p.key] = p.decode(trial.suggest_int(p.key, 0, len(p.choices) - 1))
        else:  # the study stores the label (Optuna keeps plain values only); the config gets the typed value
            out[p.key] = p.decode(trial.suggest_categorical(p.key, list(p.labels)))
    return out


def describe(params: Sequence[Param]) -> dict[str, str]:
    return {p.key: p.spec() for p in params}
