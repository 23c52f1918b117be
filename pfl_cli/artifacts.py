"""Artifact directories: the contract between stages (DESIGN.md section 3, schema 1).

Compatibility contract. An artifact directory holds payload files and ``manifest.json``,
written last::

    {"tool": "pflx", "version": "0.1.0", "schema": 1, "stage": "partition",
     "created_utc": "...", "argv": [...], "config": {...}, "seed": 0,
     "inputs": [{"path": ..., "stage": ..., "sha256": ...}],
     "outputs": [{"path": "clients.npz", "sha256": ..., "bytes": 123}]}

Writes are atomic: the directory is built as a hidden temporary sibling and renamed into
place, so a killed run leaves no half-written artifact. Re-running with the same resolved
config and the same input hashes is a no-op. Readers check ``tool``, ``schema`` and
``stage`` and verify the payload hashes. Nothing is pickled: arrays are ``.npz`` written
byte-for-byte deterministically, tables CSV, documents JSON.
"""

from __future__ import annotations

import csv
import datetime as _dt
import hashlib
import io
import json
import os
import shutil
import sys
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence

import numpy as np

from pfl_cli import __version__
from pfl_cli.errors import ArtifactError, InputError

SCHEMA = 1
MANIFEST = "manifest.json"
_ZIP_EPOCH = (1980, 1, 1, 0, 0, 0)

# Which command writes each stage, for error messages that say how to fix things.
PRODUCER = {
    "partition": "pflx partition (or pflx simulate)",
    "mdm-fit": "pflx mdm-fit",
    "train": "pflx train",
    "predict": "pflx predict",
    "cluster": "pflx cluster",
    "attack": "pflx attack",
}


# ---------------------------------------------------------------------------- hashing
def sha256_bytes(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def sha256_file(path: str | Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def sha256_array(array: np.ndarray) -> str:
    """Hash of an array's dtype, shape and bytes (C order)."""
    array = np.ascontiguousarray(array)
    head = f"{array.dtype.str}{array.shape}".encode()
    return sha256_bytes(head + array.tobytes())


def canonical_json(obj: Any) -> str:
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), allow_nan=False)


# ---------------------------------------------------------------------------- file formats
def save_npz(path: str | Path, **arrays: np.ndarray) -> None:
    """Write an ``.npz`` whose bytes depend only on the arrays (fixed zip timestamps)."""
    with zipfile.ZipFile(path, "w", compression=zipfile.ZIP_DEFLATED, compresslevel=6) as zf:
        for name, array in arrays.items():
            array = np.asarray(array)
            if array.dtype == object:
                raise TypeError(f"refusing to write object array {name!r}: pflx never pickles.")
            buf = io.BytesIO()
            np.lib.format.write_array(buf, array, allow_pickle=False)
            info = zipfile.ZipInfo(f"{name}.npy", date_time=_ZIP_EPOCH)
            info.compress_type = zipfile.ZIP_DEFLATED
            info.external_attr = 0o644 << 16
            zf.writestr(info, buf.getvalue())


def load_npz(path: str | Path) -> dict[str, np.ndarray]:
    """Read every array of an ``.npz`` file (pickles refused)."""
    try:
        with np.load(path, allow_pickle=False) as data:
            return {k: data[k] for k in data.files}
    except (OSError, ValueError, zipfile.BadZipFile, EOFError) as err:
        raise ArtifactError(f"{path}: not a readable .npz file ({err}).") from None


def dump_json(obj: Any) -> str:
    return json.dumps(obj, indent=2, allow_nan=False) + "\n"


def load_json(path: str | Path) -> Any:
    try:
        return json.loads(Path(path).read_text())
    except FileNotFoundError:
        raise ArtifactError(f"{path}: no such file.") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise ArtifactError(f"{path}: not valid JSON ({err}).") from None


def dump_csv(header: Sequence[str], rows: Iterable[Sequence[Any]]) -> str:
    buf = io.StringIO()
    writer = csv.writer(buf, lineterminator="\n")
    writer.writerow(header)
    writer.writerows(rows)
    return buf.getvalue()


# ---------------------------------------------------------------------------- reading
@dataclass(frozen=True)
class Artifact:
    """A verified artifact directory and its manifest."""

    path: Path
    manifest: Mapping[str, Any]

    @property
    def stage(self) -> str:
        return self.manifest["stage"]

    @property
    def config(self) -> Mapping[str, Any]:
        return self.manifest.get("config", {})

    @property
    def content_hash(self) -> str:
        """Hash of the payload alone: a byte-identical re-run keeps it unchanged."""
        outputs = [(o["path"], o["sha256"]) for o in self.manifest["outputs"]]
        return sha256_bytes(canonical_json([self.stage, outputs]).encode())

    def file(self, name: str) -> Path:
        return self.path / name

    def has(self, name: str) -> bool:
        return any(o["path"] == name for o in self.manifest["outputs"])

    def input_ref(self) -> dict[str, str]:
        return {"path": str(self.path), "stage": self.stage, "sha256": self.content_hash}


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
    if not path.exists():
        raise ArtifactError(f"{flag} {path}: no such directory. Create it with `{producer} --out {path}`.")
    if not path.is_dir():
        raise ArtifactError(f"{flag} {path}: expected an artifact directory, found a file.")
    manifest_path = path / MANIFEST
    if not manifest_path.is_file():
        raise ArtifactError(
            f"{flag} {path}: not a pflx artifact (no {MANIFEST}). Create it with `{producer} --out {path}`."
        )
    manifest = load_json(manifest_path)
    if not isinstance(manifest, dict) or manifest.get("tool") != "pflx":
        raise ArtifactError(f"{flag} {path}: {MANIFEST} was not written by pflx.")
    if manifest.get("schema") != SCHEMA:
        raise ArtifactError(
            f"{flag} {path}: artifact schema {manifest.get('schema')!r} is not supported; this pflx reads schema {SCHEMA}."
        )
    found = manifest.get("stage")
    if found not in expected:
        raise ArtifactError(
            f"{flag} {path}: expected a {_describe(expected)} artifact, found stage {found!r} ({MANIFEST}). "
            f"Pass the output of `{producer}`."
        )
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


# ---------------------------------------------------------------------------- writing
class ArtifactWriter:
    """Build an artifact in a temporary sibling directory and move it into place.

    Usage::

        writer = ArtifactWriter(out, stage="partition", config=cfg, seed=0, inputs=[...], force=False)
        if writer.up_to_date():      # same config and inputs: nothing to do
            return
        with writer:                 # files go to writer.dir; manifest.json is written last
            writer.save_npz("clients.npz", ...)
    """

    def __init__(
        self,
        out: str | Path,
        *,
        stage: str,
        config: Mapping[str, Any],
        seed: int | None,
        inputs: Sequence[Mapping[str, str]] = (),
        force: bool = False,
        argv: Sequence[str] | None = None,
    ) -> None:
        self.out = Path(out)
        self.stage = stage
        self.config = json.loads(canonical_json(dict(config)))  # normalized, JSON-safe
        self.seed = seed
        self.inputs = [dict(i) for i in inputs]
        self.force = force
        self.argv = list(argv) if argv is not None else ["pflx", *sys.argv[1:]]
        self.dir: Path | None = None
        self._check_target()

    def _check_target(self) -> None:
        if self.out.exists() and not self.out.is_dir():
            raise InputError(f"--out {self.out}: is a file; give a directory path.")
        parent = self.out.parent
        if parent.exists() and not parent.is_dir():
            raise InputError(f"--out {self.out}: parent {parent} is a file.")

    def _existing_manifest(self) -> dict[str, Any] | None:
        try:
            manifest = json.loads((self.out / MANIFEST).read_text())
        except (OSError, json.JSONDecodeError, UnicodeDecodeError):
            return None
        return manifest if isinstance(manifest, dict) else None

    def up_to_date(self) -> bool:
        """True when ``out`` already holds this exact result; raise if it holds another.

        An existing, different, non-empty ``out`` is an error unless ``force``.
        """
        if not self.out.exists() or not any(self.out.iterdir()):
            return False
        manifest = self._existing_manifest()
        same = (
            manifest is not None
            and manifest.get("stage") == self.stage
            and manifest.get("schema") == SCHEMA
            and canonical_json(manifest.get("config")) == canonical_json(self.config)
            and manifest.get("seed") == self.seed
            and [i.get("sha256") for i in manifest.get("inputs", [])] == [i["sha256"] for i in self.inputs]
            and all(
                (self.out / o["path"]).is_file() and sha256_file(self.out / o["path"]) == o["sha256"]
                for o in manifest.get("outputs", [])
            )
        )
        if same:
            return True
        if self.force:
            return False
        what = f"a different {manifest.get('stage')!r} artifact" if manifest else "files that are not this artifact"
        raise ArtifactError(f"--out {self.out}: already holds {what}. Pass --force to replace it, or choose another --out.")

    # -- the build ---------------------------------------------------------------
    def __enter__(self) -> "ArtifactWriter":
        self.out.parent.mkdir(parents=True, exist_ok=True)
        self.dir = Path(tempfile.mkdtemp(prefix=f".{self.out.name}.tmp-", dir=self.out.parent))
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        assert self.dir is not None
        if exc_type is not None:
            shutil.rmtree(self.dir, ignore_errors=True)
            return
        try:
            self._write_manifest()
            self._swap_into_place()
        except BaseException:
            shutil.rmtree(self.dir, ignore_errors=True)
            raise

    def path(self, name: str) -> Path:
        """Where to write payload file ``name`` (sub-directories are created)."""
        if self.dir is None:
            raise RuntimeError("ArtifactWriter.path() outside `with writer:`")
        target = self.dir / name
        target.parent.mkdir(parents=True, exist_ok=True)
        return target

    def save_npz(self, name: str, **arrays: np.ndarray) -> None:
        save_npz(self.path(name), **arrays)

    def save_json(self, name: str, obj: Any) -> None:
        self.path(name).write_text(dump_json(obj))

    def save_csv(self, name: str, header: Sequence[str], rows: Iterable[Sequence[Any]]) -> None:
        self.path(name).write_text(dump_csv(header, rows))

    def save_text(self, name: str, text: str) -> None:
        self.path(name).write_text(text)

    def _write_manifest(self) -> None:
        assert self.dir is not None
        outputs = []
        for file in sorted(p for p in self.dir.rglob("*") if p.is_file()):
            rel = file.relative_to(self.dir).as_posix()
            outputs.append({"path": rel, "sha256": sha256_file(file), "bytes": file.stat().st_size})
        manifest = {
            "tool": "pflx",
            "version": __version__,
            "schema": SCHEMA,
            "stage": self.stage,
            "created_utc": _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
            "argv": self.argv,
            "config": self.config,
            "seed": self.seed,
            "inputs": self.inputs,
            "outputs": outputs,
        }
        (self.dir / MANIFEST).write_text(dump_json(manifest))

    def _swap_into_place(self) -> None:
        assert self.dir is not None
        os.chmod(self.dir, 0o755)  # mkdtemp makes 0700 directories
        if not self.out.exists():
            os.replace(self.dir, self.out)
            return
        # Move the old directory aside first so that `out` is never a mix of both.
        trash = Path(tempfile.mkdtemp(prefix=f".{self.out.name}.old-", dir=self.out.parent))
        os.replace(self.out, trash / "old")
        os.replace(self.dir, self.out)
        shutil.rmtree(trash, ignore_errors=True)


# ---------------------------------------------------------------------------- partition artifacts
def load_partition(path: str | Path, *, flag: str = "--partition"):
    """Read a partition artifact (written by ``partition`` or ``simulate``).

    Returns
    -------
    partition : pfl_cli.partition.Partition
    dataset_info : dict
        The ``dataset.json`` document (spec, num_classes, labels_sha256, ...).
    artifact : Artifact
    """
    from pfl_cli.partition.base import Partition

    artifact = read_artifact(path, "partition", flag=flag)
    dataset_info = load_json(artifact.file("dataset.json"))
    stats = load_json(artifact.file("stats.json")) if artifact.has("stats.json") else {}
    arrays = load_npz(artifact.file("clients.npz"))
    missing = {"client_id", "role", "train_offsets", "train_indices", "test_offsets", "test_indices"} - set(arrays)
    if missing:
        raise ArtifactError(f"{flag} {path}: clients.npz lacks {sorted(missing)}; re-create the partition.")
    part = Partition.from_arrays(arrays, info=stats.get("scheme_info", {}))
    try:
        part.check(int(dataset_info["num_samples"]))
    except (ValueError, KeyError) as err:
        raise ArtifactError(f"{flag} {path}: clients.npz is inconsistent with dataset.json ({err}).") from None
    return part, dataset_info, artifact
