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

DP release contract. An artifact written under ``--dp`` (``ArtifactWriter(..., dp=True)``)
carries ``"dp": true`` in its manifest, and every output entry a ``"release"`` class:

- ``"mechanism"`` -- the output of a DP mechanism whose events are in ``privacy.json``;
- ``"post-processing"`` -- a function of mechanism outputs and public inputs only (the
  config, public data such as the server's dataset, user-given bounds); ``privacy.json``
  itself is post-processing of the public config;
- ``"nonprivate"`` -- a diagnostic computed on the private data. Written only when the user
  asks (``--write-nonprivate``), to a file whose name starts with ``nonprivate``.

The writer refuses to finish a DP artifact holding an unclassified file or a
``nonprivate`` file under another name. Under ``--dp`` the manifest withholds the sha256
of private inputs (a hash tells two neighbouring datasets apart with certainty); inputs
marked with :func:`public_input` keep theirs. :func:`check_release_contract` checks a
finished artifact directory file by file.
"""

from __future__ import annotations

import csv
import datetime as _dt
import errno
import fcntl
import glob
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
from pfl_cli.errors import ArtifactError, ConfigError, InputError

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
    "compare": "pflx compare",
    "tune": "pflx tune",
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
def write_atomic(path: str | Path, data: bytes) -> None:
    """Write ``data`` to ``path`` so that a kill leaves the previous file or this one, never a torn file."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    with open(tmp, "wb") as fh:
        fh.write(data)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)


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


def read_utf8(path: str | Path, what: str, error: type[InputError] = InputError) -> str:
    """The UTF-8 text of ``path`` (a leading byte-order mark dropped); else one-line ``error`` naming ``what``."""
    try:
        data = Path(path).read_bytes()
    except OSError as err:
        raise error(f"{what} {path}: cannot be read ({err.strerror or err}).") from None
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as err:
        raise error(f"{what} {path}: not UTF-8 text (byte 0x{data[err.start]:02x} at offset {err.start}); save it "
                    "as UTF-8.") from None


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


# ---------------------------------------------------------------------------- DP release contract
MECHANISM = "mechanism"
POST_PROCESSING = "post-processing"
NONPRIVATE = "nonprivate"
RELEASE_CLASSES = (MECHANISM, POST_PROCESSING, NONPRIVATE)
NONPRIVATE_PREFIX = "nonprivate"
PRIVACY_FILE = "privacy.json"
# Keys that hold exact counts or exact statistics of the private data; a released (not
# nonprivate) JSON document or CSV header under --dp must not contain them.
EXACT_COUNT_KEYS = frozenset({
    "num_clients", "num_points", "num_samples_seen", "cohort_size", "cohort_sizes", "clients", "clipped_fraction",
    "skipped_empty_clients", "server_points_kept_exact", "kmeans_cost", "normalized_cost", "log_likelihood",
    "mean_log_likelihood", "max_samples_seen", "holdout_normalized_cost", "centralized_normalized_cost",
})


def public_input(ref: Mapping[str, str]) -> dict[str, Any]:
    """Mark an input reference as public data: a DP manifest keeps its sha256."""
    return {**ref, "public": True}


def is_nonprivate_name(name: str) -> bool:
    return Path(name).name.startswith(NONPRIVATE_PREFIX)


def _check_release(name: str, release: str | None) -> None:
    if release not in RELEASE_CLASSES:
        raise ValueError(f"release class of {name} must be one of {', '.join(RELEASE_CLASSES)}; got {release!r}.")
    if (release == NONPRIVATE) != is_nonprivate_name(name):
        raise ValueError(f"{name}: a file is release class {NONPRIVATE!r} exactly when its name starts with "
                         f"{NONPRIVATE_PREFIX!r}; got class {release!r}.")


def _json_keys(obj: Any) -> Iterable[str]:
    """Keys of every nested object whose value is set (a ``null`` releases nothing)."""
    if isinstance(obj, dict):
        for key, value in obj.items():
            if value is not None:
                yield str(key)
            yield from _json_keys(value)
    elif isinstance(obj, list):
        for value in obj:
            yield from _json_keys(value)


def _numbers_in_text(text: str) -> set[float]:
    import re

    found = set()
    for token in re.findall(r"-?\d+(?:\.\d+)?(?:[eE][-+]?\d+)?", text):
        try:
            found.add(float(token))
        except ValueError:
            pass
    return found


def release_contract_violations(path: str | Path, *, private_values: Iterable[float] = ()) -> list[str]:
    """Every way the DP artifact at ``path`` breaks the release contract (empty: none).

    Walks every file of the directory. Checks that the manifest says ``"dp": true``, that
    each file is listed with a valid release class, that ``nonprivate`` files (and only
    they) are named ``nonprivate*``, that ``privacy.json`` holds events and is not
    nonprivate, that private inputs' hashes are withheld, that no released JSON document
    or CSV header holds an exact-count key (:data:`EXACT_COUNT_KEYS`), and that no released
    text file holds any number of ``private_values`` (exact counts the caller knows, e.g.
    the true number of clients, written as a number token).
    """
    path = Path(path)
    try:
        manifest = load_json(path / MANIFEST)
    except ArtifactError as err:
        return [str(err)]
    problems = []
    if manifest.get("dp") is not True:
        problems.append(f"{MANIFEST}: 'dp' is {manifest.get('dp')!r}, expected true for a DP artifact")
    listed = {o.get("path"): o for o in manifest.get("outputs", [])}
    on_disk = {p.relative_to(path).as_posix() for p in path.rglob("*") if p.is_file()} - {MANIFEST}
    for name in sorted(on_disk - set(listed)):
        problems.append(f"{name}: on disk but not in {MANIFEST} (unclassified)")
    for name in sorted(set(listed) - on_disk):
        problems.append(f"{name}: in {MANIFEST} but missing")
    for ref in manifest.get("inputs", []):
        if not ref.get("public") and ref.get("sha256") is not None:
            problems.append(f"{MANIFEST}: private input {ref.get('path')} is fingerprinted by its sha256")
    secrets = {float(v) for v in private_values}
    for name in sorted(on_disk & set(listed)):
        release = listed[name].get("release")
        try:
            _check_release(name, release)
        except ValueError as err:
            problems.append(str(err))
            continue
        if release == NONPRIVATE:
            continue
        problems.extend(_released_file_problems(path / name, name, secrets))
    if PRIVACY_FILE not in listed:
        problems.append(f"{PRIVACY_FILE}: missing; a DP artifact records its mechanisms' events there")
    else:
        doc = load_json(path / PRIVACY_FILE) if (path / PRIVACY_FILE).is_file() else {}
        if not isinstance(doc, dict) or not doc.get("events"):
            problems.append(f"{PRIVACY_FILE}: holds no events")
    return problems


def _released_file_problems(file: Path, name: str, secrets: set[float]) -> list[str]:
    problems = []
    suffix = file.suffix.lower()
    if suffix in (".json", ".csv", ".txt", ".yaml", ".yml"):
        text = file.read_text()
        if suffix == ".json":
            bad = sorted(set(_json_keys(json.loads(text))) & EXACT_COUNT_KEYS)
        elif suffix == ".csv":
            bad = sorted(set(text.splitlines()[0].split(",") if text else []) & EXACT_COUNT_KEYS)
        else:
            bad = []
        if bad:
            problems.append(f"{name}: released file holds exact-count fields {bad}")
        leaked = sorted(_numbers_in_text(text) & secrets)
        if leaked:
            problems.append(f"{name}: released file contains the private value(s) {leaked}")
    return problems


def check_release_contract(path: str | Path, *, private_values: Iterable[float] = ()) -> None:
    """Raise :class:`ArtifactError` listing every release-contract violation of a DP artifact."""
    problems = release_contract_violations(path, private_values=private_values)
    if problems:
        raise ArtifactError(f"{path}: breaks the DP release contract: " + "; ".join(problems))


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


def _manifest_problem(manifest: Mapping[str, Any]) -> str | None:
    """The first way ``manifest``'s fields break schema 1 (None: none); types only, files are checked by the reader."""
    if not isinstance(manifest.get("config", {}), dict):
        return f"'config' must be an object; got {_kind(manifest['config'])}"
    seed = manifest.get("seed")
    if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int)):
        return f"'seed' must be an integer or null; got {seed!r}"
    for key, needed in (("outputs", ("path", "sha256")), ("inputs", ("path", "stage"))):
        entries = manifest.get(key, [])
        if not isinstance(entries, list):
            return f"'{key}' must be a list of objects; got {_kind(entries)}"
        for i, entry in enumerate(entries):
            if not isinstance(entry, dict):
                return f"'{key}'[{i}] must be an object with {' and '.join(needed)}; got {_kind(entry)}"
            for field in needed:
                if not isinstance(entry.get(field), str) or not entry[field]:
                    return f"'{key}'[{i}].{field} must be a non-empty string; got {entry.get(field)!r}"
            digest = entry.get("sha256")
            if digest is not None and not (isinstance(digest, str) and len(digest) == 64
                                           and all(c in "0123456789abcdef" for c in digest)):
                return f"'{key}'[{i}].sha256 must be 64 hex digits{'' if key == 'outputs' else ' or null'}; got {digest!r}"
        if key == "outputs":
            names = [e["path"] for e in entries]
            for name in names:  # payload files live inside the artifact: no absolute path, no way up
                if Path(name).is_absolute() or ".." in Path(name).parts or name == MANIFEST:
                    return f"'outputs' path must name a file inside the artifact; got {name!r}"
            if len(set(names)) != len(names):
                return f"'outputs' lists a path twice ({sorted(n for n in set(names) if names.count(n) > 1)[0]!r})"
    return None


def _kind(value: Any) -> str:
    return "null" if value is None else f"{type(value).__name__} {value!r}"[:80]


def check_manifest(manifest: Mapping[str, Any], where: str) -> None:
    """Refuse (ArtifactError, exit 2) a manifest whose config, seed, inputs or outputs are malformed."""
    problem = _manifest_problem(manifest)
    if problem:
        raise ArtifactError(f"{where}: {problem}; the manifest is damaged. Re-create the artifact.")


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


# ---------------------------------------------------------------------------- writing
def _non_finite(obj: Any, where: str = "") -> tuple[str, float] | None:
    """The first (key path, value) of ``obj`` holding a NaN or an infinity, else None."""
    if isinstance(obj, float) and not np.isfinite(obj):
        return where or "value", obj
    items = obj.items() if isinstance(obj, dict) else enumerate(obj) if isinstance(obj, (list, tuple)) else ()
    for key, value in items:
        found = _non_finite(value, f"{where}[{key}]" if isinstance(key, int) else f"{where}.{key}".lstrip("."))
        if found:
            return found
    return None


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
        dp: bool = False,
    ) -> None:
        self.out = Path(out)
        self.dp = bool(dp)
        self._release: dict[str, str] = {}
        self.stage = stage
        bad = _non_finite(dict(config))
        if bad:  # JSON has no NaN or infinity, and no option means anything with one
            raise ConfigError(f"{bad[0]} must be a finite number; got {bad[1]!r}.")
        self.config = json.loads(canonical_json(dict(config)))  # normalized, JSON-safe
        self.seed = seed
        # Under DP a private input's hash would tell neighbouring datasets apart: withhold it.
        self.inputs = [dict(i) if (not self.dp or i.get("public")) else {**i, "sha256": None} for i in inputs]
        self._input_hashes = [i.get("sha256") for i in inputs]
        self.force = force
        check_out_apart(self.out, inputs)
        self.argv = list(argv) if argv is not None else ["pflx", *sys.argv[1:]]
        self.dir: Path | None = None
        self._after_swap: list = []
        self._check_target()

    def _check_target(self) -> None:
        _check_name(self.out)
        if self.out.exists() and not self.out.is_dir():
            raise InputError(f"--out {self.out}: is a file; give a directory path.")
        parent = self.out.parent
        if parent.exists() and not parent.is_dir():
            raise InputError(f"--out {self.out}: parent {parent} is a file.")
        claim_out(self.out)  # from here to the final rename, no other process writes this --out

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
        same_run = (
            manifest is not None
            and manifest.get("stage") == self.stage
            and manifest.get("schema") == SCHEMA
            and canonical_json(manifest.get("config")) == canonical_json(self.config)
            and manifest.get("seed") == self.seed
        )
        if same_run and self.dp and any(i.get("sha256") is None for i in self.inputs):
            # The private inputs' hashes are withheld, so the old result cannot be verified
            # against them: recompute (same command, so replacing needs no --force).
            return False
        same = (
            same_run
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
        try:
            if exc_type is not None:
                shutil.rmtree(self.dir, ignore_errors=True)
                return
            try:
                self._write_manifest()
                self._swap_into_place()
            except BaseException:
                shutil.rmtree(self.dir, ignore_errors=True)
                raise
            for cleanup in self._after_swap:
                cleanup()
        finally:
            release_out(self.out)

    def after_swap(self, cleanup) -> None:
        """Run ``cleanup()`` once the artifact is in place, still holding the lock of ``out``
        (e.g. remove a checkpoint that the artifact now holds)."""
        self._after_swap.append(cleanup)

    def declare(self, name: str, release: str) -> None:
        """Record the DP release class of payload file ``name`` (see the module docstring)."""
        _check_release(name, release)
        self._release[name] = release

    def path(self, name: str, *, release: str | None = None) -> Path:
        """Where to write payload file ``name`` (sub-directories are created).

        ``release`` declares its DP release class (:meth:`declare`); a DP artifact needs one
        for every file before it can be finished.
        """
        if self.dir is None:
            raise RuntimeError("ArtifactWriter.path() outside `with writer:`")
        if release is not None:
            self.declare(name, release)
        target = self.dir / name
        target.parent.mkdir(parents=True, exist_ok=True)
        return target

    def save_npz(self, name: str, *, release: str | None = None, **arrays: np.ndarray) -> None:
        save_npz(self.path(name, release=release), **arrays)

    def save_json(self, name: str, obj: Any, *, release: str | None = None) -> None:
        self.path(name, release=release).write_text(dump_json(obj))

    def save_csv(self, name: str, header: Sequence[str], rows: Iterable[Sequence[Any]], *,
                 release: str | None = None) -> None:
        self.path(name, release=release).write_text(dump_csv(header, rows))

    def save_text(self, name: str, text: str, *, release: str | None = None) -> None:
        self.path(name, release=release).write_text(text)

    def _write_manifest(self) -> None:
        assert self.dir is not None
        outputs = []
        for file in sorted(p for p in self.dir.rglob("*") if p.is_file()):
            rel = file.relative_to(self.dir).as_posix()
            entry = {"path": rel, "sha256": sha256_file(file), "bytes": file.stat().st_size}
            if self.dp:
                if rel not in self._release:
                    raise RuntimeError(f"DP artifact {self.out}: {rel} has no release class; declare it "
                                       f"(mechanism, post-processing or nonprivate) before writing.")
                entry["release"] = self._release[rel]
            outputs.append(entry)
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
        if self.dp:
            manifest["dp"] = True
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


# ---------------------------------------------------------------------------- one writer per --out
# Locks this process holds: lock-file path -> open descriptor. A second ArtifactWriter on the same
# --out in this process shares the lock; the OS drops it when the process dies, even by kill -9.
_HELD: dict[str, int] = {}
_CREATED: dict[str, list[Path]] = {}  # parents claim_out made, removed again if they stay empty
_WAIT = [False]


def set_wait(wait: bool) -> None:
    """Whether :func:`claim_out` waits for another process's lock (``--wait``) or refuses at once."""
    _WAIT[0] = bool(wait)


def lock_file(out: str | Path) -> Path:
    """The sibling lock file of ``out``: ``.NAME.lock`` beside it."""
    out = Path(out)
    return out.parent / f".{out.name}.lock"


def _check_name(out: Path) -> None:
    if out.name in ("", ".", ".."):  # the artifact is renamed into place: it needs a name of its own
        raise InputError(f"--out {out}: give the artifact directory a name of its own (e.g. runs/part), not "
                         f"{str(out)!r}.")
    # Path.exists() raises, rather than answers, for a name the file system cannot hold.
    try:
        os.lstat(out)
    except OSError as err:
        if err.errno == errno.ENAMETOOLONG:
            raise InputError(f"--out {str(out)[:60]}...: {err.strerror} (the name has {len(out.name)} characters); "
                             "choose a shorter --out.") from None


GENERATED_SCHEMES = ("builtin", "gmm", "ring")


def _input_location(ref: Mapping[str, Any]) -> Path | None:
    """The file or directory an input reference reads (a dataset spec's path after ``SCHEME:``), if on disk."""
    text = str(ref.get("path", ""))
    if ref.get("stage") == "dataset":
        scheme, _, arg = text.partition(":")
        # Generated datasets name no file: builtin:digits, gmm:clients?..., ring:?seed=1.
        text = "" if scheme in GENERATED_SCHEMES else arg.split("?", 1)[0]
    if not text:
        return None
    path = Path(text)
    return path if path.exists() else None


def check_out_apart(out: str | Path, inputs: Iterable[Mapping[str, Any]]) -> None:
    """Refuse an ``--out`` that is, lies inside, or contains one of the command's inputs, ``--force`` or not.

    Replacing ``--out`` would destroy (or, inside it, orphan) the input the result was computed from.
    """
    target = Path(os.path.abspath(out))
    for ref in inputs:
        where = _input_location(ref)
        if where is None:
            continue
        source = Path(os.path.realpath(where))
        resolved = Path(os.path.realpath(target))
        how = ("is" if resolved == source else "is inside" if source in resolved.parents
               else "contains" if resolved in source.parents else None)
        if how:
            raise InputError(f"--out {out}: {how} the input {ref.get('path')}; writing there would replace what "
                             "this command reads, so it is refused even with --force. Choose another --out.")


def check_out_location(out: str | Path) -> list[Path]:
    """Check up front that ``out``'s parent lets pflx create and rename a directory there.

    The artifact is built in a hidden sibling and renamed into place at the end, so a
    read-only parent, a name too long or a dangling symlink would otherwise surface only
    after the work. Raises :class:`InputError` naming the path and the system's reason.
    Returns the parent directories it created (deepest first), for :func:`release_out` to
    remove again when no artifact came of it.
    """
    out = Path(out)
    if out.is_symlink() and not out.exists():
        raise InputError(f"--out {out}: is a dangling symbolic link (to {os.readlink(out)}); remove it or choose "
                         "another --out.")
    parent = out.parent
    for up in (parent, *parent.parents):
        if up.is_symlink() and not up.exists():
            raise InputError(f"--out {out}: {up} is a dangling symbolic link; remove it or choose another --out.")
    created = [up for up in (parent, *parent.parents) if not up.exists()]
    try:
        parent.mkdir(parents=True, exist_ok=True)
        # Named longer than any sibling pflx makes (.NAME.tmp-*, .NAME.checkpoint), and never
        # matched by the stale-temp sweep of a writer that holds the lock meanwhile.
        probe = Path(tempfile.mkdtemp(prefix=f".{out.name}.probe-", dir=parent))
        try:
            os.rename(probe, probe.with_name(probe.name + "-renamed"))
            probe = probe.with_name(probe.name + "-renamed")
        finally:
            os.rmdir(probe)
    except OSError as err:
        reason = err.strerror or str(err)
        if err.errno == errno.ENAMETOOLONG:
            reason += f" (the name {out.name[:40]}... has {len(out.name)} characters)"
        raise InputError(f"--out {out}: cannot create and rename a directory in {parent} ({reason}); choose "
                         "another --out.") from None
    return created


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


def claim_out(out: str | Path) -> None:
    """Hold the lock of ``out`` for this process; refuse (exit 2) while another process holds it.

    The lock is an ``fcntl`` lock on :func:`lock_file`, taken before the "already holds"
    check and kept to the final rename. Holding it, hidden temp folders of earlier writers of
    this ``out`` (killed mid-write) are known stale and removed.
    """
    out = Path(out)
    if os.environ.get("RANK", "0") != "0":  # torchrun / --nproc: rank 0 writes and holds the lock for the job
        return
    path = lock_file(out)
    key = os.path.abspath(path)
    if key in _HELD:
        return
    created, misses = check_out_location(out), 0
    while True:
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        except FileNotFoundError:  # a failed writer removed the parent it had created: make it again
            misses += 1
            if misses > 10:
                raise
            created = check_out_location(out) or created
            continue
        try:
            fcntl.flock(fd, fcntl.LOCK_EX if _WAIT[0] else fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 32, 0).decode(errors="replace").strip() or "unknown"
            os.close(fd)
            raise InputError(f"--out {out} is being written by process {holder}; wait for it to finish (or pass "
                             "--wait), or choose another --out.") from None
        try:  # a writer that releases unlinks the file: make sure ours is still the one at `path`
            current = os.stat(path).st_ino == os.fstat(fd).st_ino
        except FileNotFoundError:
            current = False
        if current:
            break
        os.close(fd)
    os.ftruncate(fd, 0)
    os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
    _HELD[key] = fd
    _CREATED[key] = created
    _remove_stale_temps(out)


def _remove_stale_temps(out: Path) -> None:
    pattern = glob.escape(f".{out.name}")
    for suffix in (".tmp-*", ".old-*"):
        for stale in out.parent.glob(pattern + suffix):
            if stale.is_dir() and not stale.is_symlink():
                shutil.rmtree(stale, ignore_errors=True)


def release_out(out: str | Path) -> None:
    """Give up the lock of ``out`` (no-op when this process does not hold it)."""
    _release(os.path.abspath(lock_file(out)))


def release_all_outs() -> None:
    """Give up every lock this process holds (the CLI calls it when a command ends)."""
    for key in list(_HELD):
        _release(key)


def _release(key: str) -> None:
    fd = _HELD.pop(key, None)
    if fd is None:
        return
    try:
        os.unlink(key)  # still locked: a waiting process re-checks the inode and retries
    except OSError:
        pass
    os.close(fd)
    for directory in _CREATED.pop(key, []):  # a refused run leaves no empty parents behind
        try:
            os.rmdir(directory)
        except OSError:
            break


# ---------------------------------------------------------------------------- partition artifacts
def load_partition(path: str | Path, *, flag: str = "--partition"):
    """Read a partition artifact (written by ``partition`` or ``simulate``), every file checked (``pfl_cli.readers``).

    Returns
    -------
    partition : pfl_cli.partition.Partition
    dataset_info : dict
        The ``dataset.json`` document (spec, num_classes, labels_sha256, ...).
    artifact : Artifact
    """
    from pfl_cli.partition.base import Partition
    from pfl_cli.readers import read_partition_files

    artifact = read_artifact(path, "partition", flag=flag)
    dataset_info, arrays, stats = read_partition_files(artifact, flag)
    part = Partition.from_arrays(arrays, info=stats.get("scheme_info", {}))
    return part, dataset_info, artifact
