"""The train stage as a library: what `pflx train` runs, with the same checks and refusals.

>>> from pfl_cli.train import run_train, run_train_seeds  # doctest: +SKIP
>>> run_train(cfg, partition="runs/part", out="runs/fedavg")  # doctest: +SKIP

``cfg`` is a TrainConfig (:func:`pfl_cli.registry.train_config`); the artifact is the one `pflx train` writes
(:mod:`pfl_cli.train.files`). ``events`` (:class:`TrainEvents`) hears what the run says.
"""

from pfl_cli.lazy import lazy_names

# The names load on first use (PEP 562): an up-to-date `pflx train` imports only what it reads.
_WHERE = {
    "run_train": "run", "TrainResult": "run", "with_model_files": "run",
    "run_train_seeds": "stack", "train_stack": "stack", "StackMember": "stack", "check_seeds": "stack",
    "TrainEvents": "events",
    "train_metrics": "files", "write_train_files": "files", "write_dp_artifact": "files",
}
__all__ = sorted(_WHERE)

__getattr__, __dir__ = lazy_names(__name__, _WHERE)
