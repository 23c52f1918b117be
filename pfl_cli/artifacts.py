"""Write artifact directories: the atomic writer and the lock that gives each ``--out`` one writer.

An artifact directory holds payload files and ``manifest.json``, written last (the contract:
:mod:`pfl_cli.manifest`). Writes are atomic: the directory is built as a hidden temporary
sibling and renamed into place, so a killed run leaves no half-written artifact. Re-running
with the same resolved config and the same input hashes is a no-op. Under ``--dp``
(``ArtifactWriter(..., dp=True)``) every payload file declares its release class and the
writer refuses to finish a DP artifact holding an unclassified file (the DP release contract
of :mod:`pfl_cli.manifest`).

Layers, bottom up (``tests/test_import_layers.py`` checks them):

- :mod:`pfl_cli.formats` -- file formats and digests (``.npz`` without pickles, JSON, CSV,
  UTF-8 text, :func:`write_atomic`, sha256);
- :mod:`pfl_cli.manifest` -- the contract: schema version, stage names and their producers,
  :class:`Artifact`, :func:`check_manifest`, the DP release classes and
  :func:`check_release_contract`;
- :mod:`pfl_cli.readers` -- :func:`read_artifact`, :func:`load_partition` and one reader per
  payload file kind;
- this module -- :class:`ArtifactWriter` and the ``--out`` locks. It is imported by the
  commands (``pfl_cli.cli``) and the Flower server app, which write artifacts; the engine
  (``pfl_cli.fl``) writes no artifact and never imports it (its checkpoint is one file,
  replaced with :func:`pfl_cli.formats.write_atomic`).

The names of the layers below are re-exported here, so ``from pfl_cli.artifacts import
read_artifact`` keeps working for the commands, tests and scripts; code below this layer
imports them from the module that defines them.
"""

from __future__ import annotations

import datetime as _dt
import errno
import fcntl
import glob
import json
import os
import secrets
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence

import numpy as np

from pfl_cli import __version__
from pfl_cli.errors import ArtifactError, ConfigError, InputError
from pfl_cli.formats import (  # noqa: F401 - re-exported
    canonical_json,
    dump_csv,
    dump_json,
    load_json,
    load_npz,
    read_utf8,
    save_npz,
    sha256_array,
    sha256_bytes,
    sha256_file,
    write_atomic,
)
from pfl_cli.manifest import (  # noqa: F401 - re-exported
    EXACT_COUNT_KEYS,
    MANIFEST,
    MECHANISM,
    NONPRIVATE,
    PARTITION_KEY,
    NONPRIVATE_PREFIX,
    POST_PROCESSING,
    PRIVACY_FILE,
    PRODUCER,
    RELEASE_CLASSES,
    SCHEMA,
    Artifact,
    _numbers_in_text,
    check_manifest,
    check_release_class,
    check_release_contract,
    is_nonprivate_name,
    lock_file,
    public_input,
    release_contract_violations,
)
from pfl_cli.readers import load_partition, read_artifact  # noqa: F401 - re-exported


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
        notes: Mapping[str, Any] | None = None,
    ) -> None:
        self.out = Path(out)
        self.dp = bool(dp)
        self.notes = dict(notes or {})  # extra manifest entries that are not config (how it was trained: "stacked")
        self._release: dict[str, str] = {}
        self.stage = stage
        bad = _non_finite(dict(config))
        if bad:  # JSON has no NaN or infinity, and no option means anything with one
            raise ConfigError(f"{bad[0]} must be a finite number; got {bad[1]!r}.")
        self.config = json.loads(canonical_json(dict(config)))  # normalized, JSON-safe
        self.seed = seed
        # Under DP a private input's hash would tell neighbouring datasets apart: withhold it.
        self.inputs = [dict(i) if (not self.dp or i.get("public")) else {**i, "sha256": None} for i in inputs]
        for ref in self.inputs:  # an input artifact is found again from another directory, or in a moved tree
            if ref.get("stage") != "dataset" and "relative_path" not in ref:
                ref["relative_path"] = os.path.relpath(os.path.abspath(ref["path"]), os.path.abspath(self.out))
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
        check_release_class(name, release)
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
        if self.stage == "partition":  # a secret drawn once per partition: see pfl_cli.manifest.partition_fingerprint
            manifest[PARTITION_KEY] = secrets.token_hex(32)
        manifest.update(self.notes)
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
