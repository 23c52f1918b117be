"""``mnist:DIR`` and ``fashion-mnist:DIR``: the four IDX files as published.

``DIR`` holds ``train-images-idx3-ubyte``, ``train-labels-idx1-ubyte``,
``t10k-images-idx3-ubyte`` and ``t10k-labels-idx1-ubyte``, each plain or gzip'd (``.gz``).
Sample order: the train files (pool 0), then the t10k files (pool 1). ``x`` is uint8 of
shape (N, 1, rows, cols), channel first as a LeNet expects; 10 classes.

IDX format (http://yann.lecun.com/exdb/mnist/): two zero bytes, a type byte (0x08 for
unsigned bytes), a byte giving the number of dimensions, then each dimension as a
big-endian uint32, then the data in row-major order.
"""

from __future__ import annotations

import gzip
import struct
import zlib
from pathlib import Path

import numpy as np

from pfl_cli.data.base import POOL_TEST, POOL_TRAIN, Dataset, check_options
from pfl_cli.errors import DatasetError

IMAGES_MAGIC = 0x00000803  # unsigned bytes, 3 dimensions (count, rows, cols)
LABELS_MAGIC = 0x00000801  # unsigned bytes, 1 dimension (count)
NUM_CLASSES = 10
FASHION_CLASS_NAMES = (
    "T-shirt/top", "Trouser", "Pullover", "Dress", "Coat",
    "Sandal", "Shirt", "Sneaker", "Bag", "Ankle boot",
)  # fmt: skip


def load_mnist(arg: str, options: dict[str, str], spec: str) -> Dataset:
    """Load MNIST from its IDX files.

    Parameters
    ----------
    arg : str
        Directory holding the four IDX files (plain or ``.gz``).
    options : dict of str to str
        None are accepted.
    spec : str
        The full spec, for messages and ``Dataset.spec``.

    Returns
    -------
    Dataset
        x uint8 (N, 1, 28, 28), y int64 in [0, 10), train then t10k pool.

    Raises
    ------
    DatasetError
        Missing directory or file, corrupt gzip, wrong magic, sizes that disagree.
    """
    names = tuple(str(d) for d in range(NUM_CLASSES))
    return _load(arg, options, spec, names)


def load_fashion_mnist(arg: str, options: dict[str, str], spec: str) -> Dataset:
    """Load Fashion-MNIST from its IDX files (same layout and format as MNIST).

    Parameters
    ----------
    arg : str
        Directory holding the four IDX files (plain or ``.gz``).
    options : dict of str to str
        None are accepted.
    spec : str
        The full spec, for messages and ``Dataset.spec``.

    Returns
    -------
    Dataset
        x uint8 (N, 1, 28, 28), y int64 in [0, 10) with the Fashion-MNIST class names.

    Raises
    ------
    DatasetError
        Missing directory or file, corrupt gzip, wrong magic, sizes that disagree.
    """
    return _load(arg, options, spec, FASHION_CLASS_NAMES)


def _load(arg: str, options: dict[str, str], spec: str, class_names: tuple[str, ...]) -> Dataset:
    """Read both splits and stack them train first."""
    check_options(spec, options, ())
    root = Path(arg)
    if not root.is_dir():
        raise DatasetError(f"{spec}: no such directory {root}; point to the directory holding the IDX files.")
    xs, ys = [], []
    for split in ("train", "t10k"):
        images, labels = read_split(root, split, spec)
        xs.append(images[:, None, :, :])
        ys.append(labels.astype(np.int64))
    return train_test_dataset(spec, xs, ys, NUM_CLASSES, class_names)


def train_test_dataset(spec: str, xs: list[np.ndarray], ys: list[np.ndarray], num_classes: int,
                       class_names: tuple[str, ...] | None, extra: dict | None = None) -> Dataset:
    """The train split (pool 0) then the test split (pool 1), stacked."""
    pool = np.concatenate([np.full(len(y), p, dtype=np.uint8) for y, p in zip(ys, (POOL_TRAIN, POOL_TEST))])
    return Dataset(spec=spec, x=np.concatenate(xs), y=np.concatenate(ys), num_classes=num_classes, pool=pool,
                   class_names=class_names, extra=extra or {})


def read_split(root: Path, prefix: str, spec: str) -> tuple[np.ndarray, np.ndarray]:
    """``PREFIX-images-idx3-ubyte`` and ``PREFIX-labels-idx1-ubyte`` of ``root``, checked to have one label per image."""
    images = read_idx(find_idx(root, f"{prefix}-images-idx3-ubyte", spec), IMAGES_MAGIC, spec)
    labels = read_idx(find_idx(root, f"{prefix}-labels-idx1-ubyte", spec), LABELS_MAGIC, spec)
    if images.shape[0] != labels.shape[0]:
        raise DatasetError(
            f"{spec}: {prefix} images and labels must have the same count; got {images.shape[0]} "
            f"images and {labels.shape[0]} labels. Re-download the mismatched file."
        )
    return images, labels


def find_idx(root: Path, name: str, spec: str) -> Path:
    """The file ``name`` in ``root``, plain preferred over ``.gz``."""
    for candidate in (root / name, root / f"{name}.gz"):
        if candidate.is_file():
            return candidate
    raise DatasetError(f"{spec}: missing {name} (or {name}.gz) in {root}; the directory must hold all four IDX files.")


def read_idx(path: Path, magic: int, spec: str) -> np.ndarray:
    """Read one IDX file of unsigned bytes, checking its header against its size.

    Parameters
    ----------
    path : Path
        The file, gzip'd when its name ends in ``.gz``.
    magic : int
        The expected magic number (:data:`IMAGES_MAGIC` or :data:`LABELS_MAGIC`).
    spec : str
        The dataset spec, for messages.

    Returns
    -------
    ndarray of uint8
        Shaped by the header's dimensions.

    Raises
    ------
    DatasetError
        Corrupt or truncated gzip, wrong magic, a data size that differs from the header's.
    """
    where = f"{spec}: {path.name}"
    raw = _read_bytes(path, where)
    if len(raw) < 4:
        raise DatasetError(f"{where}: too short for an IDX header ({len(raw)} bytes). Re-download it.")
    (found,) = struct.unpack(">I", raw[:4])
    if found != magic:
        raise DatasetError(f"{where}: IDX magic number must be {magic:#010x}; got {found:#010x}. Is it the right file?")
    ndim = magic & 0xFF
    header = 4 + 4 * ndim
    if len(raw) < header:
        raise DatasetError(f"{where}: truncated IDX header ({len(raw)} bytes, need {header}). Re-download it.")
    dims = struct.unpack(f">{ndim}I", raw[4:header])
    expected = int(np.prod(dims, dtype=np.int64))
    if len(raw) - header != expected:
        raise DatasetError(
            f"{where}: header promises {'x'.join(map(str, dims))} = {expected} bytes of data; "
            f"got {len(raw) - header}. The file is truncated or corrupt; re-download it."
        )
    return np.frombuffer(raw, dtype=np.uint8, offset=header).reshape(dims)


def _read_bytes(path: Path, where: str) -> bytes:
    """The whole file, decompressed when it is a ``.gz``."""
    try:
        if path.suffix == ".gz":
            with gzip.open(path, "rb") as fh:
                return fh.read()
        return path.read_bytes()
    except (OSError, EOFError, zlib.error) as err:
        # gzip raises BadGzipFile (an OSError) for bad headers, EOFError for a cut-off stream.
        raise DatasetError(f"{where}: cannot read it ({type(err).__name__}: {err}); the file is corrupt, re-download it.") from None
