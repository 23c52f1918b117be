"""Open an artifact directory: its manifest checked, its payload hashes verified, its stage the one asked for.

:func:`read_artifact` is the first step of every command that reads an artifact; the payload
files are then read through the reader of their kind (the other modules of
:mod:`pfl_cli.readers`). :func:`load_partition` reads a whole partition artifact.
"""

from __future__ import annotations

import fcntl
import os
from pathlib import Path
from typing import Any, Mapping, Sequence

from pfl_cli.errors import ArtifactError
from pfl_cli.formats import load_json, sha256_file
from pfl_cli.manifest import MANIFEST, PRODUCER, SCHEMA, Artifact, check_manifest, lock_file


def _describe(stage: str | Sequence[str]) -> str:
    stages = [stage] if isinstance(stage, str) else list(stage)
    return " or ".join(repr(s) for s in stages)


def read_artifact(path: str | Path, stage: str | Sequence[str], *, flag: str = "input", verify: bool = True) -> Artifact:
    """Open the artifact at ``path`` and check it is one of ``stage``.

    Parameters
    ----------
    path : path-like
        The artifact directory.
    stage : str or sequence of str
        Accepted stage name(s).
    flag : str, default="input"
        The option the user passed the path with, named in error messages.
    verify : bool, default=True
        Check that every payload file exists with the recorded sha256.
    """
    path = Path(path)
    expected = [stage] if isinstance(stage, str) else list(stage)
    producer = PRODUCER.get(expected[0], "the matching pflx command")
    # One stage: the command that makes it. Several (show, privacy-account): no one command to suggest.
    create = (f"Create it with `{producer} --out {path}`." if len(expected) == 1 else
              "Pass the --out directory of a pflx command"
              + (f" ({_describe(expected)} artifacts)." if len(expected) <= 3 else "."))
    if not path.exists():
        writer = _writer_of(path)
        if writer is not None:  # its writer holds the lock: the directory appears when it finishes
            raise ArtifactError(f"{flag} {path}: not written yet: it is being written by process {writer} (lock "
                                f"{lock_file(path)}); wait for it to finish, then run again.")
        raise ArtifactError(f"{flag} {path}: no such directory. {create}")
    if not path.is_dir():
        raise ArtifactError(f"{flag} {path}: expected an artifact directory, found a file.")
    manifest_path = path / MANIFEST
    if not manifest_path.is_file():
        raise ArtifactError(f"{flag} {path}: not a pflx artifact (no {MANIFEST}). {create}")
    manifest = load_json(manifest_path)
    if not isinstance(manifest, dict) or manifest.get("tool") != "pflx":
        raise ArtifactError(f"{flag} {path}: {MANIFEST} was not written by pflx.")
    if manifest.get("schema") != SCHEMA:
        raise ArtifactError(
            f"{flag} {path}: artifact schema {manifest.get('schema')!r} is not supported; this pflx reads schema {SCHEMA}."
        )
    found = manifest.get("stage")
    if found not in expected and isinstance(found, str):
        raise ArtifactError(
            f"{flag} {path}: expected a {_describe(expected)} artifact, found stage {found!r} ({MANIFEST}). "
            f"Pass the output of `{producer}`."
        )
    if found not in expected:
        raise ArtifactError(f"{flag} {path}: {MANIFEST} 'stage' must be a stage name; got {found!r}.")
    check_manifest(manifest, f"{flag} {path}: {MANIFEST}")
    artifact = Artifact(path=path, manifest=manifest)
    if verify:
        for out in manifest.get("outputs", []):
            target = path / out["path"]
            if not target.is_file():
                raise ArtifactError(f"{flag} {path}: {out['path']} is missing; the artifact is incomplete.")
            if sha256_file(target) != out["sha256"]:
                raise ArtifactError(
                    f"{flag} {path}: {out['path']} does not match its sha256 in {MANIFEST}; the artifact is corrupt "
                    "or was edited. Re-create it."
                )
    return artifact


def input_location(art: Artifact, ref: Mapping[str, Any]) -> Path:
    """Where the input artifact that ``art``'s manifest names in ``ref`` is now.

    Tried in order: the path relative to ``art`` (recorded since inputs carry ``relative_path``:
    it holds in a tree of artifacts moved or copied together, from any working directory), the
    absolute path it had where recorded (``absolute_path``), then the path as it was typed (from
    the working directory). A candidate counts
    when it is an artifact of the recorded stage whose content hash is the recorded sha256 (any
    such artifact when the hash is withheld under --dp). None found: the typed path, for the
    caller to report missing.
    """
    typed = Path(str(ref["path"]))
    candidates = []
    if ref.get("relative_path"):
        # folded by the letters, as recorded (os.path.relpath of two abspaths): from an artifact in a linked
        # directory (runs -> /scratch/runs) ``runs/model/../../part`` is the tree's ``part``, where the kernel
        # would go up from /scratch/runs; the path as the kernel reads it comes second
        rel = str(ref["relative_path"])
        folded, read = Path(os.path.normpath(os.path.join(os.path.abspath(art.path), rel))), art.path / rel
        candidates = [read] if _same_dir(folded, read) else [folded, read]  # the shorter form where both agree
    if ref.get("absolute_path"):  # where it was (a --dp train's partition: a model copied away alone)
        candidates.append(Path(str(ref["absolute_path"])))
    for where in [*candidates, typed]:
        if not (where / MANIFEST).is_file():
            continue
        try:  # of the recorded stage (under --dp, where the hash is withheld, that is all there is to check)
            found = read_artifact(where, str(ref["stage"]), verify=False)
        except ArtifactError:
            continue
        if ref.get("sha256") is None or found.content_hash == ref["sha256"]:
            return where
    return typed


def _same_dir(a: Path, b: Path) -> bool:
    try:
        return os.path.samefile(a, b)
    except OSError:
        return False


def _writer_of(out: Path) -> str | None:
    """The process id written in ``out``'s lock while another process holds it (None: nobody writes ``out``)."""
    try:
        fd = os.open(lock_file(out), os.O_RDONLY)
    except OSError:
        return None
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            return os.pread(fd, 32, 0).decode(errors="replace").strip() or "unknown"
        fcntl.flock(fd, fcntl.LOCK_UN)
        return None
    finally:
        os.close(fd)


def load_partition(path: str | Path, *, flag: str = "--partition"):
    """Read a partition artifact (written by ``partition`` or ``simulate``), every file checked.

    Returns
    -------
    partition : pfl_cli.partition.Partition
    dataset_info : dict
        The ``dataset.json`` document (spec, num_classes, labels_sha256, ...).
    artifact : Artifact
    """
    from pfl_cli.partition.base import Partition
    from pfl_cli.readers.clients import read_partition_files

    artifact = read_artifact(path, "partition", flag=flag)
    dataset_info, arrays, stats = read_partition_files(artifact, flag)
    part = Partition.from_arrays(arrays, info=stats.get("scheme_info", {}))
    return part, dataset_info, artifact
