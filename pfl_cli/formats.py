"""Bytes on disk: the file formats of artifacts and checkpoints, and their digests.

Nothing is pickled: arrays are ``.npz`` written byte-for-byte deterministically (fixed zip
timestamps, no object arrays), tables CSV, documents JSON (no NaN, no infinity). A single file
is replaced atomically by :func:`write_atomic` (the round loop's checkpoint; an artifact
directory is written by :class:`pfl_cli.artifacts.ArtifactWriter`). This module sits at the
bottom of the artifact layers: it imports nothing of pflx but :mod:`pfl_cli.errors`.
"""

from __future__ import annotations

import csv
import hashlib
import io
import json
import os
import zipfile
from pathlib import Path
from typing import Any, Iterable, Sequence

import numpy as np

from pfl_cli.errors import ArtifactError, InputError

_ZIP_EPOCH = (1980, 1, 1, 0, 0, 0)


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
