"""Glue every command shares: explicit flags, config layering, artifact writing."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence, TypeVar

import typer

from pfl_cli.cli._click import given_on_command_line

T = TypeVar("T")


def explicit_flags(ctx: typer.Context, names: Iterable[str]) -> dict[str, Any]:
    """The values of ``names`` that the user typed on the command line (not defaults)."""
    given = {}
    for name in names:
        if given_on_command_line(ctx, name):
            given[name] = ctx.params[name]
    return given


IGNORED_KEYS = ("out", "force", "format", "out_root", "config")  # a config file's command keys, not the stage's


def stage_config(
    cls: type[T],
    stage: str,
    *,
    config_file: Path | None,
    flags: Mapping[str, Any],
    sets: Sequence[str] | None,
) -> T:
    """Defaults < config file < explicit flags < ``--set``, as a frozen dataclass.

    A config that asks for a figure (``plot: true`` from any layer) is refused here, before any
    work, when matplotlib is not installed (the one rule of a plain install, :mod:`figures`).
    """
    from pfl_cli.config import load_config_file, parse_overrides, resolve_config  # numpy, yaml: not for --help

    cfg = resolve_config(
        cls,
        file_values=load_config_file(config_file, stage),
        flag_values=flags,
        overrides=parse_overrides(sets or ()),
        ignore=IGNORED_KEYS,
    )
    if getattr(cfg, "plot", False):
        from pfl_cli.cli.figures import require_matplotlib

        require_matplotlib("--plot")
    return cfg


def warn_plugin_problems() -> None:
    """Each plugin the registry left out, as one warning line naming it (the built-ins work regardless)."""
    import warnings

    from pfl_cli import registry
    from pfl_cli.errors import PflxWarning

    for line in registry.plugin_problems():
        warnings.warn(line, PflxWarning, stacklevel=2)


def train_stage_config(*, config_file: Path | None, flags: Mapping[str, Any], sets: Sequence[str] | None):
    """``pflx train``'s config: the named algorithm's own config class (:mod:`pfl_cli.registry`), its
    defaults < config file < explicit flags < ``--set``; a key the algorithm does not take is refused."""
    from pfl_cli import registry
    from pfl_cli.config import load_config_file, parse_overrides  # numpy, yaml: not for --help

    warn_plugin_problems()
    file_values, overrides = load_config_file(config_file, "train"), parse_overrides(sets or ())
    _refuse_another_algorithms_config(config_file, file_values, overrides.get("algorithm", flags.get("algorithm")))
    return registry.resolve_train_config(file_values=file_values, flag_values=flags, overrides=overrides,
                                         ignore=IGNORED_KEYS)


def _refuse_another_algorithms_config(config_file: Path | None, file_values: Mapping[str, Any], runs: Any) -> None:
    """A one-algorithm config file (tune's best.yaml, a train artifact's config.yaml: no stage sections) holds
    values chosen for the algorithm it names; another algorithm would train with them silently (SCAFFOLD's lr
    for FedAvg), so it is refused, as ``compare --spec`` refuses it. A recipe (``train:`` section) is shared."""
    from pfl_cli.config import is_recipe
    from pfl_cli.errors import ConfigError

    named = file_values.get("algorithm")
    if config_file is None or named is None or runs is None or str(runs) == str(named) or is_recipe(config_file):
        return
    raise ConfigError(f"--config {config_file} is a config of {named!r} (its values were chosen for it), not of "
                      f"{runs!r}; train {named} with it, or give a config of {runs!r} (e.g. the best.yaml of "
                      f"`pflx tune --algorithm {runs}`).")


def load_partition_dataset(partition: Path, *, flag: str = "--partition"):
    """A partition artifact and its dataset (:func:`pfl_cli.data.location.load_partition_dataset`: the tune
    workers load it below the CLI layer)."""
    from pfl_cli.data.location import load_partition_dataset as load  # numpy: not for --help

    return load(partition, flag=flag)
