"""Typed config values, derived from each stage's frozen dataclass annotations.

Every value of a stage config, whether it came from a flag, a config file or ``--set``,
goes through :func:`coerce_field` before anything runs, so a value refused through one route is
refused through all three with the same message. The rules follow the annotation:

- ``bool``: ``True`` or ``False`` only (YAML 1.2 ``true``/``false``); ``"false"``, ``1`` or
  ``"perhaps"`` are refused, never read as true;
- ``int``: an integer (or its decimal text); ``1.5``, ``True`` and ``"ten"`` are refused;
- ``float``: a number (or its text); NaN and infinities are refused unless the field's
  metadata says ``allow_nonfinite=True``;
- ``str``: a string (numbers become their text, as a flag would give them);
- ``Optional[X]`` / ``X | None``: None or an X; other unions: the first alternative that fits;
- ``list[X]`` / ``tuple[X, ...]`` / bare ``list``/``tuple``: a list (a scalar is a list of one),
  each element typed as X; ``dict``: a mapping; ``Any``: anything;
- ``Literal[...]``, field metadata ``choices=...`` or :func:`register_choices`: one of the
  allowed values;
- every field named ``seed``: an integer >= 0 (seeds feed ``numpy.random.SeedSequence``).

A field added to a stage dataclass is typed by its annotation without any edit here.
"""

from __future__ import annotations

import dataclasses
import difflib
import functools
import math
import re
import types
import typing
from typing import Any, Mapping

from pfl_cli.errors import ConfigError

_INT_TEXT = re.compile(r"^\s*[-+]?[0-9]+\s*$")
_NONE = type(None)


def show(value: Any) -> str:
    """A refused value as the message shows it: strings quoted, so ``'false'`` is not mistaken for false."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return repr(value)
    if value is None:
        return "null"
    return repr(value)


@functools.lru_cache(maxsize=None)
def field_types(cls: type) -> dict[str, Any]:
    """Field name -> resolved annotation of dataclass ``cls`` (string annotations evaluated)."""
    hints = typing.get_type_hints(cls)
    return {f.name: hints.get(f.name, Any) for f in dataclasses.fields(cls)}


_CHOICES: dict[type, dict[str, Any]] = {}


def register_choices(cls: type, **choices: Any) -> None:
    """Declare the allowed values of fields of ``cls``: a tuple, or a callable returning one.

    A callable is called at each check, so a choice tuple that another module extends later
    (new algorithms) is seen as it is then.
    """
    _CHOICES.setdefault(cls, {}).update(choices)


def _choices(cls: type, name: str) -> tuple | None:
    field = next(f for f in dataclasses.fields(cls) if f.name == name)
    allowed = field.metadata.get("choices") or _CHOICES.get(cls, {}).get(name)
    if callable(allowed):
        allowed = allowed()
    return tuple(allowed) if allowed is not None else None


def coerce_field(cls: type, name: str, value: Any) -> Any:
    """``value`` parsed to the type field ``name`` of ``cls`` declares; :class:`ConfigError` if it cannot be.

    Examples
    --------
    >>> from dataclasses import dataclass
    >>> @dataclass(frozen=True)
    ... class C:
    ...     flag: bool = False
    ...     rate: float = 0.5
    >>> coerce_field(C, "rate", 1)
    1.0
    >>> coerce_field(C, "flag", "perhaps")
    Traceback (most recent call last):
    ...
    pfl_cli.errors.ConfigError: flag must be true or false; got 'perhaps'.
    """
    field = next((f for f in dataclasses.fields(cls) if f.name == name), None)
    if field is None:
        return value
    nonfinite = bool(field.metadata.get("allow_nonfinite", False))
    parsed = _parse(name, field_types(cls)[name], value, nonfinite)
    allowed = _choices(cls, name)
    open_form = isinstance(parsed, str) and any(parsed.startswith(p) and len(parsed) > len(p)
                                                for p in field.metadata.get("open_prefixes", ()))
    if allowed is not None and parsed is not None and parsed not in allowed and not open_form:
        near = difflib.get_close_matches(str(parsed), [str(a) for a in allowed], n=1)
        tip = f" (did you mean {near[0]!r}?)" if near else ""
        raise ConfigError(f"{name} must be one of {', '.join(map(str, allowed))}; got {show(value)}{tip}.")
    if name == "seed" and parsed is not None and parsed < 0:
        raise ConfigError(f"seed must be an integer >= 0; got {show(value)}.")
    return parsed


def coerce_values(cls: type, values: Mapping[str, Any]) -> dict[str, Any]:
    """Every entry of ``values`` typed by :func:`coerce_field`."""
    return {key: coerce_field(cls, key, value) for key, value in values.items()}


# ---------------------------------------------------------------------------- the rules
def _describe(tp: Any) -> str:
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if tp is bool:
        return "true or false"
    if tp is int:
        return "an integer"
    if tp is float:
        return "a number"
    if tp is str:
        return "a string"
    if origin is typing.Literal:
        return "one of " + ", ".join(map(str, args))
    if origin in (typing.Union, types.UnionType):
        return " or ".join(_describe(a) for a in args if a is not _NONE)
    if tp in (list, tuple) or origin in (list, tuple):
        inner = [a for a in args if a is not Ellipsis]
        plural = {bool: "true/false values", int: "integers", float: "numbers", str: "strings"}
        return "a list" + (f" of {plural.get(inner[0], 'values')}" if inner else "")
    if tp is dict or origin is dict:
        return "a mapping of key: value"
    return getattr(tp, "__name__", str(tp))


def _refuse(name: str, tp: Any, value: Any) -> ConfigError:
    return ConfigError(f"{name} must be {_describe(tp)}; got {show(value)}.")


def _parse(name: str, tp: Any, value: Any, nonfinite: bool) -> Any:
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if tp is Any or tp is object:
        return value
    if origin in (typing.Union, types.UnionType):
        if value is None and _NONE in args:
            return None
        options = [a for a in args if a is not _NONE]
        errors = []
        for option in sorted(options, key=_rank):
            try:
                return _parse(name, option, value, nonfinite)
            except ConfigError as err:
                errors.append(err)
        if len(options) == 1:
            raise errors[0]
        raise _refuse(name, tp, value)
    if origin is typing.Literal:
        if value in args:
            return value
        raise _refuse(name, tp, value)
    if tp is bool:
        if isinstance(value, bool):
            return value
        raise _refuse(name, tp, value)
    if tp is int:
        return _parse_int(name, value)
    if tp is float:
        return _parse_float(name, value, nonfinite)
    if tp is str:
        if isinstance(value, str):
            return value
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return str(value)
        raise _refuse(name, tp, value)
    if tp in (list, tuple) or origin in (list, tuple):
        return _parse_sequence(name, tp, value, nonfinite)
    if tp is dict or origin is dict:
        if isinstance(value, Mapping):
            return dict(value)
        raise _refuse(name, tp, value)
    return value  # a type this schema does not know: the stage validates it


def _rank(tp: Any) -> int:
    # Try scalars before containers so that `float | list[float]` reads 0.5 as a float.
    return 1 if tp in (list, tuple, dict) or typing.get_origin(tp) in (list, tuple, dict) else 0


def _parse_int(name: str, value: Any) -> int:
    if isinstance(value, bool):
        raise _refuse(name, int, value)
    if isinstance(value, int):
        return value
    if hasattr(value, "dtype") and getattr(value, "dtype").kind in "iu":  # numpy integers (library callers)
        return int(value)
    if isinstance(value, str) and _INT_TEXT.match(value):
        return int(value)
    raise _refuse(name, int, value)


def _parse_float(name: str, value: Any, nonfinite: bool) -> float:
    number: float | None = None
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        number = float(value)
    elif hasattr(value, "dtype") and getattr(value, "dtype").kind in "iuf":
        number = float(value)
    elif isinstance(value, str):
        try:
            number = float(value)
        except ValueError:
            number = None
    if number is None:
        raise _refuse(name, float, value)
    if not nonfinite and not math.isfinite(number):
        raise ConfigError(f"{name} must be a finite number; got {show(number)}.")
    return number


def _parse_sequence(name: str, tp: Any, value: Any, nonfinite: bool) -> Any:
    container = tuple if (tp is tuple or typing.get_origin(tp) is tuple) else list
    args = [a for a in typing.get_args(tp) if a is not Ellipsis]
    if isinstance(value, (str, int, float)) and not isinstance(value, bool):
        items = [value]  # one value where a list is expected: a list of one
    elif isinstance(value, (list, tuple)):
        items = list(value)
    else:
        raise _refuse(name, tp, value)
    if args:
        try:
            items = [_parse(name, args[0], item, nonfinite) for item in items]
        except ConfigError:
            raise _refuse(name, tp, value) from None
    return container(items)

