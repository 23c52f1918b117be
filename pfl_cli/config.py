"""Stage configuration: defaults < config file < flags < ``--set key=value``.

Each stage declares a frozen dataclass whose fields map one to one onto its flags
(``num_clients`` <-> ``--num-clients``). :func:`resolve_config` merges the four layers,
refuses unknown keys with a "did you mean" hint, and returns the frozen dataclass. A
config file is flat YAML; a recipe may hold one section per stage (``partition:``,
``train:``), and a stage reads its own section plus the file's top-level scalars.
"""

from __future__ import annotations

import dataclasses
import difflib
from pathlib import Path
from typing import Any, Mapping, Sequence, TypeVar

import yaml

from pfl_cli.errors import ConfigError

T = TypeVar("T")

STAGES = ("partition", "mdm-fit", "simulate", "train", "predict", "cluster", "privacy-account", "attack")


def _key(name: str) -> str:
    return name.strip().replace("-", "_")


def parse_overrides(items: Sequence[str]) -> dict[str, Any]:
    """Parse ``key=value`` strings; values are YAML scalars or lists.

    The split is on the first ``=`` so values may contain ``=`` themselves.
    """
    result: dict[str, Any] = {}
    for item in items:
        if "=" not in item:
            raise ConfigError(f"--set takes key=value; got {item!r}. Example: --set num_clients=20")
        key, raw = item.split("=", 1)
        if not key.strip():
            raise ConfigError(f"--set key must not be empty; got {item!r}.")
        try:
            value = yaml.safe_load(raw) if raw.strip() else ""
        except yaml.YAMLError as err:
            raise ConfigError(f"--set {key}: value {raw!r} is not valid YAML ({err.problem}).") from None
        result[_key(key)] = value
    return result


def load_config_file(path: str | Path | None, stage: str) -> dict[str, Any]:
    """Read the keys of ``stage`` from a YAML config or recipe file."""
    if path is None:
        return {}
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"--config {path}: no such file.")
    try:
        data = yaml.safe_load(path.read_text())
    except yaml.YAMLError as err:
        raise ConfigError(f"--config {path}: not valid YAML ({err}).".replace("\n", " ")) from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(f"--config {path}: expected a mapping of key: value; got {type(data).__name__}.")
    section = data.get(stage)
    if isinstance(section, dict):
        # A recipe: top-level scalars (seed, out_root, ...) are shared, the stage section wins.
        shared = {k: v for k, v in data.items() if not isinstance(v, dict) and k not in STAGES}
        return {_key(k): v for k, v in {**shared, **section}.items()}
    if any(isinstance(data.get(s), dict) for s in STAGES):
        return {_key(k): v for k, v in data.items() if not isinstance(v, dict) and k not in STAGES}
    return {_key(k): v for k, v in data.items()}


def resolve_config(
    cls: type[T],
    *,
    file_values: Mapping[str, Any] | None = None,
    flag_values: Mapping[str, Any] | None = None,
    overrides: Mapping[str, Any] | None = None,
    ignore: Sequence[str] = (),
) -> T:
    """Merge the layers over ``cls``'s defaults and build the frozen dataclass.

    Parameters
    ----------
    cls : dataclass type
        The stage's config dataclass; its defaults are the lowest layer.
    file_values, flag_values, overrides : mapping, optional
        The config file's keys, the flags given explicitly on the command line, and
        ``--set`` overrides, in increasing precedence.
    ignore : sequence of str, default=()
        Keys a file may hold that belong to the command rather than to the config
        (``out``, ``force``); they are dropped without error.
    """
    fields = {f.name for f in dataclasses.fields(cls)}
    merged: dict[str, Any] = {}
    for layer_name, layer in (("config file", file_values), ("flag", flag_values), ("--set", overrides)):
        for key, value in (layer or {}).items():
            key = _key(key)
            if key in ignore:
                continue
            if key not in fields:
                hint = difflib.get_close_matches(key, sorted(fields), n=1)
                tip = f" Did you mean {hint[0]!r}?" if hint else f" Known keys: {', '.join(sorted(fields))}."
                raise ConfigError(f"unknown {layer_name} key {key!r} for this stage.{tip}")
            merged[key] = value
    try:
        return cls(**merged)
    except TypeError as err:
        raise ConfigError(str(err)) from None


def config_to_dict(cfg: Any) -> dict[str, Any]:
    """A JSON-ready dict of a config dataclass (tuples become lists)."""
    def plain(v: Any) -> Any:
        if isinstance(v, (list, tuple)):
            return [plain(x) for x in v]
        if isinstance(v, dict):
            return {k: plain(x) for k, x in v.items()}
        return v

    return {k: plain(v) for k, v in dataclasses.asdict(cfg).items()}
