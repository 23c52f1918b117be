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
import os
from pathlib import Path
from typing import Any, Mapping, Sequence, TypeVar

from pfl_cli.errors import ConfigError
from pfl_cli.formats import read_utf8
from pfl_cli.schema import coerce_field

T = TypeVar("T")

STAGES = ("partition", "mdm-fit", "simulate", "train", "predict", "cluster", "privacy-account", "attack")

# Each stage's config dataclass, imported lazily (the CLI types flag text with it on a parse error).
STAGE_CONFIGS = {
    "partition": "pfl_cli.partition.api:PartitionConfig",
    "mdm-fit": "pfl_cli.mdm.api:MDMFitConfig",
    "simulate": "pfl_cli.simulate.api:SimulateConfig",
    "train": "pfl_cli.fl.config:TrainConfig",
    "predict": "pfl_cli.fl.config:PredictConfig",
    "cluster": "pfl_cli.cluster.config:ClusterConfig",
    "privacy-account": "pfl_cli.privacy.query:PrivacyAccountConfig",
}


def stage_config_class(stage: str) -> type | None:
    """The config dataclass of ``stage`` (None for commands without one)."""
    import importlib

    target = STAGE_CONFIGS.get(stage)
    if target is None:
        return None
    module, name = target.split(":")
    return getattr(importlib.import_module(module), name)


def _key(name: str) -> str:
    return name.strip().replace("-", "_")


def parse_overrides(items: Sequence[str]) -> dict[str, Any]:
    """Parse ``key=value`` strings; values are YAML scalars or lists.

    The split is on the first ``=`` so values may contain ``=`` themselves. Values are read
    as YAML 1.2 (:mod:`pfl_cli.yaml12`): ``true``/``false`` are the only booleans.
    """
    if not items:
        return {}
    import yaml  # ~40 ms: only when there is YAML to read (a fast start for everything else)

    from pfl_cli import yaml12

    result: dict[str, Any] = {}
    for item in items:
        if "=" not in item:
            raise ConfigError(f"--set takes key=value; got {item!r}. Example: --set num_clients=20")
        key, raw = item.split("=", 1)
        if not key.strip():
            raise ConfigError(f"--set key must not be empty; got {item!r}.")
        try:
            value = yaml12.loads(raw) if raw.strip() else ""
        except yaml.YAMLError as err:
            raise ConfigError(f"--set {key}: value {raw!r} is not valid YAML ({yaml12.describe_error(err)}).") from None
        result[_key(key)] = value
    return result


def load_config_file(path: str | Path | None, stage: str) -> dict[str, Any]:
    """Read the keys of ``stage`` from a YAML config or recipe file."""
    if path is None:
        return {}
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"--config {path}: no such file.")
    import yaml

    from pfl_cli import yaml12

    try:
        data = yaml12.loads(read_utf8(path, "--config", ConfigError))
    except yaml.YAMLError as err:
        raise ConfigError(f"--config {path}: not valid YAML ({yaml12.describe_error(err)}).") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(f"--config {path}: expected a mapping of key: value; got {type(data).__name__}.")
    # a study's best.yaml says what chose it (pfl_cli.privacy.study reads it); not a key of any stage
    data = {k: v for k, v in data.items() if k != "provenance"}
    section = data.get(stage)
    if stage in data and section is None:  # an empty `train:` section
        section = {}
    if isinstance(section, dict):
        # A recipe: top-level scalars (seed, out_root, ...) are shared, the stage section wins.
        shared = {k: v for k, v in data.items() if not isinstance(v, dict) and k not in STAGES}
        return _relative_to_file(_normalized_keys({**shared, **section}, path), path, stage)
    if any(isinstance(data.get(s), dict) for s in STAGES):
        return _relative_to_file(_normalized_keys({k: v for k, v in data.items()
                                                   if not isinstance(v, dict) and k not in STAGES}, path), path, stage)
    return _relative_to_file(_normalized_keys(data, path), path, stage)


def _relative_to_file(values: dict[str, Any], path: Path, stage: str) -> dict[str, Any]:
    """A relative path-valued key (``backbone_weights``: pfl_cli.readers.files) read relative to the config file
    where it names a file there (a train artifact's config.yaml holds it relative to itself), else as typed."""
    if stage != "train":
        return values
    from pfl_cli.fl.config import TrainConfig
    from pfl_cli.readers.files import key_file, path_keys, with_key_file

    out = dict(values)
    for key in path_keys(TrainConfig):
        value = key_file(TrainConfig, key, out.get(key))
        if value and not Path(value).is_absolute():
            beside = path.parent / value
            if beside.exists():
                out[key] = with_key_file(TrainConfig, key, out[key], os.path.normpath(os.path.abspath(beside)))
    return out


def is_recipe(path: str | Path) -> bool:
    """Whether the config file ``path`` (read by :func:`load_config_file`) is a recipe: stage sections."""
    from pfl_cli import yaml12

    data = yaml12.loads(read_utf8(Path(path), "--config", ConfigError))
    return isinstance(data, dict) and any(isinstance(data.get(s), dict) for s in STAGES)


def _normalized_keys(data: Mapping[Any, Any], path: Path) -> dict[str, Any]:
    """Keys in snake_case; a non-string key, or two spellings of one key (num-clients, num_clients), refused."""
    out: dict[str, Any] = {}
    for key, value in data.items():
        if not isinstance(key, str):
            raise ConfigError(f"--config {path}: keys must be option names; got {key!r}.")
        name = _key(key)
        if name in out:
            raise ConfigError(f"--config {path}: duplicate key {name!r} (spelled twice, e.g. with - and _).")
        out[name] = value
    return out


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

    Every value is typed by the field's annotation (:mod:`pfl_cli.schema`) as it is merged,
    so a bad value is refused with the same message whichever layer it came from.
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
            merged[key] = coerce_field(cls, key, value)
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

    # An algorithm's keys without effect (Algorithm.inert_keys) are refused when given, even at their default, so a
    # resolved config (a train artifact's config.yaml, a study's best.yaml) leaves them out: it trains again as written.
    inert = getattr(getattr(cfg, "algorithm_class", None), "inert_keys", None) or {}
    return {k: plain(v) for k, v in dataclasses.asdict(cfg).items() if k not in inert}
