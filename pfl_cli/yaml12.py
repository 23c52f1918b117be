"""YAML as configs need it: the YAML 1.2 core schema, duplicate keys refused, UTF-8 only.

PyYAML implements YAML 1.1, where ``yes``, ``no``, ``on`` and ``off`` are booleans, ``017`` is
octal, ``1e-3`` is a string and ``2020-01-01`` a date. pflx reads config files and ``--set``
values with the YAML 1.2 core schema instead (https://yaml.org/spec/1.2.2/#103-core-schema):
only ``true``/``false`` are booleans, integers are decimal, ``0o`` octal or ``0x`` hex, ``1e-3``
is a float, and everything else is a string that the stage's schema then types or refuses.
A mapping that repeats a key is an error, not "the last one wins". Files are read as UTF-8
(:func:`pfl_cli.formats.read_utf8`).
"""

from __future__ import annotations

import re
from typing import Any

import yaml



class Loader(yaml.SafeLoader):
    """SafeLoader with the YAML 1.2 core schema's implicit types and unique mapping keys."""


Loader.yaml_implicit_resolvers = {}  # drop the YAML 1.1 resolvers inherited from SafeLoader


def _resolver(tag: str, pattern: str, first: str) -> None:
    Loader.add_implicit_resolver(tag, re.compile(pattern, re.X), list(first))


_resolver("tag:yaml.org,2002:bool", r"^(?:true|True|TRUE|false|False|FALSE)$", "tTfF")
_resolver("tag:yaml.org,2002:int", r"^(?:[-+]?[0-9]+|0o[0-7]+|0x[0-9a-fA-F]+)$", "-+0123456789")
_resolver("tag:yaml.org,2002:float",
          r"^(?:[-+]?(?:\.[0-9]+|[0-9]+(?:\.[0-9]*)?)(?:[eE][-+]?[0-9]+)?|[-+]?\.(?:inf|Inf|INF)|\.(?:nan|NaN|NAN))$",
          "-+0123456789.")
_resolver("tag:yaml.org,2002:null", r"^(?:~|null|Null|NULL|)$", ["~", "n", "N", ""])


def _construct_int(loader: Loader, node: yaml.Node) -> int:
    text = loader.construct_scalar(node)
    if text.startswith("0o"):
        return int(text[2:], 8)
    if text.startswith("0x"):
        return int(text[2:], 16)
    return int(text, 10)


def _construct_float(loader: Loader, node: yaml.Node) -> float:
    text = loader.construct_scalar(node).lower()
    if text.endswith(".inf"):
        return float("-inf") if text.startswith("-") else float("inf")
    if text == ".nan":
        return float("nan")
    return float(text)


def _construct_mapping(loader: Loader, node: yaml.MappingNode, deep: bool = False) -> dict:
    seen: dict[Any, Any] = {}
    for key_node, _ in node.value:
        key = loader.construct_object(key_node, deep=True)
        if isinstance(key, (str, int, float, bool)) and key in seen:
            raise yaml.constructor.ConstructorError(
                None, None, f"duplicate key {key!r} (first on line {seen[key] + 1})", key_node.start_mark)
        if isinstance(key, (str, int, float, bool)):
            seen[key] = key_node.start_mark.line
    return yaml.SafeLoader.construct_mapping(loader, node, deep=deep)


Loader.add_constructor("tag:yaml.org,2002:int", _construct_int)
Loader.add_constructor("tag:yaml.org,2002:float", _construct_float)
Loader.add_constructor("tag:yaml.org,2002:map", lambda loader, node: _construct_mapping(loader, node, deep=True))


def loads(text: str) -> Any:
    """Parse ``text`` (raises ``yaml.YAMLError``, duplicate keys included)."""
    return yaml.load(text, Loader=Loader)  # noqa: S506 - Loader is a SafeLoader subclass


def describe_error(err: yaml.YAMLError) -> str:
    """A YAML error as one short clause: the problem and its line."""
    problem = getattr(err, "problem", None) or str(err)
    mark = getattr(err, "problem_mark", None)
    return " ".join((f"{problem}, line {mark.line + 1}" if mark is not None else str(problem)).split())
