"""Where ``train`` keeps its checkpoint: ``.<out>.checkpoint/state.pt`` beside ``--out``.

The content of a checkpoint is read (sealed and fingerprinted) by
:func:`pfl_cli.fl.checkpoint.read_checkpoint`; this checks the location before any work, so a
run never trains for hours and then fails to write (or resume) its first checkpoint.
"""

from __future__ import annotations

from pathlib import Path

from pfl_cli.errors import ArtifactError


def check_checkpoint_location(folder: Path, file: Path, *, resume: bool) -> None:
    """Refuse (exit 2) a checkpoint folder that is not a directory, or a checkpoint file that is not a file."""
    flag = "--resume: " if resume else ""
    if folder.exists() and not folder.is_dir():
        raise ArtifactError(f"{flag}the checkpoint folder {folder} is a file, not a directory (pflx keeps the "
                            f"checkpoint of --out there); move or delete it and run again.")
    if file.exists() and not file.is_file():
        raise ArtifactError(f"{flag}the checkpoint {file} is not a regular file (a directory or a special file); "
                            f"delete {folder} and run again{' without --resume to start over' if resume else ''}.")


def check_checkpoint_state(state: dict, path: Path) -> None:
    """Refuse (exit 2) a sealed checkpoint whose top-level fields do not have the round loop's types.

    The seal (sha256) and the fingerprint prove the file is this run's; this catches a checkpoint
    written by another pflx version, or forged with a valid seal. (The algorithm's tensors are
    checked when the algorithm loads them.)
    """
    if state.get("private_run"):  # a --dp checkpoint keeps released and client-held state only (fl.dp.private_snapshot)
        rules = {"algorithm": (dict, "an object"), "client_held": (dict, "an object")}
    else:
        rules = {"algorithm": (dict, "an object"), "history": (list, "a list"), "loss_acc": (list, "a list"),
                 "traffic": (dict, "an object"), "best": ((dict, type(None)), "an object or null")}
    for key, (kind, what) in rules.items():
        if not isinstance(state.get(key), kind):
            raise ArtifactError(f"--resume: checkpoint {path}: {key} must be {what}; got "
                                f"{type(state.get(key)).__name__}. Delete {path.parent} and run without --resume "
                                "to start over.")
    if state.get("private_run"):
        return
    acc = state["loss_acc"]
    if len(acc) != 2 or not all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in acc):
        raise ArtifactError(f"--resume: checkpoint {path}: loss_acc must be two numbers; got {acc!r:.60}. Delete "
                            f"{path.parent} and run without --resume to start over.")
    if not all(isinstance(row, (list, tuple)) and len(row) == 4 for row in state["history"]):
        raise ArtifactError(f"--resume: checkpoint {path}: history must hold (round, group, metric, value) rows. "
                            f"Delete {path.parent} and run without --resume to start over.")
    if state["best"] is None and state["history"]:  # every evaluation selects a model: one ran, so one was kept
        raise ArtifactError(f"--resume: checkpoint {path}: best must hold the selected model once an evaluation has "
                            f"run (its history has {len(state['history'])} rows); got null. Delete {path.parent} and "
                            "run without --resume to start over.")
