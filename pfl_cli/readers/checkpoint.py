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
