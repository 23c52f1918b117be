"""A study as one step of a longer protocol (``pflx compare --spec``'s ``tune:`` entries): what ``pflx tune``
does -- the study resumed from its ``study.db`` after a kill, the tune artifact written exactly as the command
writes it, ``best.yaml`` in it -- called from another command.

A thin delegate to the tune command's body (:func:`pfl_cli.cli.tune_run.run_tune`, its option checks included)
until the study runner moves under ``pfl_cli/tune/`` (issue 41, item 1): one path, so that a study run by a spec
and the same study run by ``pflx tune`` are the same study (the same artifact, the same resume).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any


def tune_options(tune: Any, *, jobs: int = 1):
    """pflx tune's options for a spec's :class:`pfl_cli.compare.spec.TuneSpec` (``jobs``: trials at once, each in
    its own process, as ``pflx tune --jobs``)."""
    from pfl_cli.tune.plan import TuneOptions

    return TuneOptions(space=tuple(f"{k}={v}" for k, v in tune.space), trials=tune.trials, jobs=jobs,
                       sampler=tune.sampler, pruner=tune.pruner, validation_fraction=tune.validation_fraction,
                       validation_clients=tune.validation_clients)


def check_study(cfg: Any, options: Any) -> tuple:
    """The study's options checked as ``pflx tune`` checks them, before any work (ConfigError, one line);
    returns the resolved search space (its :class:`pfl_cli.tune.space.Param` s)."""
    from pfl_cli.tune.plan import check_options as _check_options
    from pfl_cli.fl.api import validate_train_config

    validate_train_config(cfg)
    return _check_options(cfg, options)[1]


def run_study(cfg: Any, options: Any, *, partition: Path, out: Path, force: bool, report: Any) -> Path:
    """Run (or resume, or find up to date) the study of ``cfg`` with ``options`` into the tune artifact ``out``;
    returns its ``best.yaml``."""
    import dataclasses

    from pfl_cli.cli.tune_run import run_tune

    if getattr(options, "log_dir", "") is None:  # no --log: where pflx tune's default would put its loggers' files
        options = dataclasses.replace(options, log_dir=Path(out).with_name(f"{Path(out).name}.logs"))
    run_tune(cfg, options, partition=partition, out=out, force=force, report=report)
    return Path(out) / "best.yaml"
