"""The train stage as a library: what `pflx train` runs, with the same checks and refusals.

>>> from pfl_cli.train import run_train, run_train_seeds  # doctest: +SKIP
>>> run_train(cfg, partition="runs/part", out="runs/fedavg")  # doctest: +SKIP

``cfg`` is a TrainConfig (:func:`pfl_cli.registry.train_config`); the artifact is the one `pflx train` writes
(:mod:`pfl_cli.train.files`). ``events`` (:class:`TrainEvents`) hears what the run says.
"""

# The names load on first use (PEP 562): an up-to-date `pflx train` imports only what it reads.
_WHERE = {
    "run_train": "run", "TrainResult": "run", "with_model_files": "run",
    "run_train_seeds": "stack", "train_stack": "stack", "StackMember": "stack", "check_seeds": "stack",
    "TrainEvents": "events",
    "train_metrics": "files", "write_train_files": "files", "write_dp_artifact": "files",
}
__all__ = sorted(_WHERE)


def __getattr__(name: str):
    if name not in _WHERE:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(f"{__name__}.{_WHERE[name]}"), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
