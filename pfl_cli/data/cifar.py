"""``cifar10:DIR`` and ``cifar100:DIR?labels=fine|coarse``: the python-version batches.

Layouts (as published at https://www.cs.toronto.edu/~kriz/cifar.html, unpacked):

- CIFAR-10: ``cifar-10-batches-py/{data_batch_1..5, test_batch, batches.meta}``
- CIFAR-100: ``cifar-100-python/{train, test, meta}``

``DIR`` is the batches directory itself or its parent. Sample order: the train batches in
order (pool 0), then the test batch (pool 1). ``x`` is uint8 of shape (N, 3, 32, 32).

The batches are Python pickles. They are read with :class:`RestrictedUnpickler`, which
resolves only the few globals a dict of lists and numpy arrays needs, so a tampered file
cannot run code.
"""

from __future__ import annotations

import codecs
import pickle
from pathlib import Path
from typing import Any

import numpy as np

from pfl_cli.data.base import POOL_TEST, POOL_TRAIN, Dataset, check_options
from pfl_cli.errors import DatasetError

try:  # numpy >= 2 moved the pickle helpers to numpy._core; old pickles still name numpy.core.
    from numpy._core.multiarray import _reconstruct
except ImportError:  # numpy 1.x
    from numpy.core.multiarray import _reconstruct

IMAGE_SHAPE = (3, 32, 32)
CIFAR10_DIR = "cifar-10-batches-py"
CIFAR10_TRAIN = tuple(f"data_batch_{i}" for i in range(1, 6))
CIFAR100_DIR = "cifar-100-python"

def _latin1_encode(text: str, encoding: str = "latin1") -> bytes:
    """``_codecs.encode`` as protocol 2 uses it for bytes; other codecs (zlib, ...) are refused."""
    if encoding.replace("-", "").lower() != "latin1" or not isinstance(text, str):
        raise pickle.UnpicklingError(f"_codecs.encode with {encoding!r} is not how a bytes object is pickled")
    return codecs.encode(text, "latin1")


# (module, name) pairs a CIFAR batch may reference, mapped to the object they stand for.
# Python 2 era numpy wrote numpy.core.multiarray, numpy 2 writes numpy._core.multiarray;
# Python 3 writes bytes under protocol 2 as _codecs.encode(str, "latin1").
_ALLOWED_GLOBALS: dict[tuple[str, str], Any] = {
    ("numpy.core.multiarray", "_reconstruct"): _reconstruct,
    ("numpy._core.multiarray", "_reconstruct"): _reconstruct,
    ("numpy", "ndarray"): np.ndarray,
    ("numpy", "dtype"): np.dtype,
    ("_codecs", "encode"): _latin1_encode,
}


class RestrictedUnpickler(pickle.Unpickler):
    """An unpickler that admits plain containers and numpy arrays, nothing else.

    Parameters
    ----------
    file : binary file
        The open pickle.
    where : str
        Names the file in error messages.
    """

    def __init__(self, file: Any, where: str) -> None:
        # encoding="bytes" as the CIFAR page prescribes: Python 2 str keys arrive as bytes.
        super().__init__(file, encoding="bytes")
        self.where = where

    def find_class(self, module: str, name: str) -> Any:
        """Resolve only the allowed globals; refuse any other before it can be called."""
        try:
            return _ALLOWED_GLOBALS[(module, name)]
        except KeyError:
            raise DatasetError(
                f"{self.where}: not a plain CIFAR batch; it references {module}.{name}, and only "
                f"numpy arrays and plain containers are allowed. Re-download the dataset."
            ) from None


def load_cifar10(arg: str, options: dict[str, str], spec: str) -> Dataset:
    """Load CIFAR-10 from its python batches.

    Parameters
    ----------
    arg : str
        ``cifar-10-batches-py`` or the directory holding it.
    options : dict of str to str
        None are accepted.
    spec : str
        The full spec, for messages and ``Dataset.spec``.

    Returns
    -------
    Dataset
        60000 samples in the published layout: x uint8 (N, 3, 32, 32), 10 classes, pools.

    Raises
    ------
    DatasetError
        Missing directory or batch, a file that is not a plain CIFAR pickle, bad shapes.
    """
    check_options(spec, options, ())
    root = _batches_dir(Path(arg), CIFAR10_DIR, "data_batch_1", spec)
    train = [_read_batch(root / name, spec) for name in CIFAR10_TRAIN]
    test = _read_batch(root / "test_batch", spec)
    names = _class_names(root / "batches.meta", "label_names", 10, spec)
    return _assemble(spec, train, test, "labels", 10, names, {})


def load_cifar100(arg: str, options: dict[str, str], spec: str) -> Dataset:
    """Load CIFAR-100 from its python files.

    Parameters
    ----------
    arg : str
        ``cifar-100-python`` or the directory holding it.
    options : dict of str to str
        ``labels=fine`` (default, 100 classes) or ``labels=coarse`` (20 superclasses).
    spec : str
        The full spec, for messages and ``Dataset.spec``.

    Returns
    -------
    Dataset
        x uint8 (N, 3, 32, 32), train then test pool.

    Raises
    ------
    DatasetError
        Missing directory or file, a file that is not a plain CIFAR pickle, a bad option.
    """
    check_options(spec, options, ("labels",))
    granularity = options.get("labels", "fine")
    if granularity not in ("fine", "coarse"):
        raise DatasetError(f"{spec}: option labels must be fine or coarse; got {granularity!r}.")
    num_classes = 100 if granularity == "fine" else 20
    root = _batches_dir(Path(arg), CIFAR100_DIR, "train", spec)
    train = [_read_batch(root / "train", spec)]
    test = _read_batch(root / "test", spec)
    names = _class_names(root / "meta", f"{granularity}_label_names", num_classes, spec)
    return _assemble(spec, train, test, f"{granularity}_labels", num_classes, names, {"cifar100_labels": granularity})


def _batches_dir(path: Path, subdir: str, marker: str, spec: str) -> Path:
    """The directory holding the batch files: ``path`` itself or ``path / subdir``."""
    for candidate in (path, path / subdir):
        if (candidate / marker).is_file():
            return candidate
    raise DatasetError(
        f"{spec}: no {marker} in {path} or {path / subdir}; point to the unpacked {subdir} "
        f"directory (python version of the dataset) or its parent."
    )


def _read_pickle(path: Path, spec: str) -> dict[str, Any]:
    """Unpickle one file with the restricted unpickler; keys come back as str."""
    where = f"{spec}: {path.name}"
    if not path.is_file():
        raise DatasetError(f"{where}: file is missing; the published layout has it next to the other batches.")
    try:
        with open(path, "rb") as fh:
            obj = RestrictedUnpickler(fh, where).load()
    except DatasetError:
        raise
    except Exception as err:  # any parse failure of a corrupt file: the unpickler raises many kinds
        raise DatasetError(f"{where}: not a readable CIFAR pickle ({type(err).__name__}: {err}). Re-download it.") from None
    if not isinstance(obj, dict):
        raise DatasetError(f"{where}: a CIFAR batch must be a dict; got {type(obj).__name__}.")
    # Python 2 pickles give bytes keys under encoding="bytes"; re-pickled copies may use str.
    return {k.decode("latin1") if isinstance(k, bytes) else k: v for k, v in obj.items()}


def _read_batch(path: Path, spec: str) -> dict[str, Any]:
    """One batch, with ``data`` checked to be uint8 images of 3072 bytes."""
    batch = _read_pickle(path, spec)
    data = batch.get("data")
    if not isinstance(data, np.ndarray) or data.dtype != np.uint8 or data.ndim != 2 or data.shape[1] != 3072:
        got = data.shape if isinstance(data, np.ndarray) else type(data).__name__
        raise DatasetError(f"{spec}: {path.name}: 'data' must be a uint8 array of shape (N, 3072); got {got}.")
    batch["_file"] = path.name
    return batch


def _batch_labels(batch: dict[str, Any], key: str, spec: str) -> np.ndarray:
    """The label list of a batch, one per image."""
    if key not in batch:
        raise DatasetError(f"{spec}: {batch['_file']}: no {key!r} entry; found {sorted(k for k in batch if k != '_file')}.")
    labels = np.asarray(batch[key])
    if labels.shape != (batch["data"].shape[0],) or labels.dtype.kind not in "iu":
        raise DatasetError(
            f"{spec}: {batch['_file']}: {key!r} must be {batch['data'].shape[0]} integer labels; "
            f"got shape {labels.shape}, dtype {labels.dtype}."
        )
    return labels.astype(np.int64)


def _class_names(path: Path, key: str, num_classes: int, spec: str) -> tuple[str, ...] | None:
    """Class names from the meta file; None when the file is absent (it is optional)."""
    if not path.is_file():
        return None
    names = _read_pickle(path, spec).get(key)
    if not isinstance(names, list) or len(names) != num_classes:
        raise DatasetError(f"{spec}: {path.name}: {key!r} must list {num_classes} class names.")
    return tuple(n.decode("utf-8") if isinstance(n, bytes) else str(n) for n in names)


def _assemble(
    spec: str,
    train: list[dict[str, Any]],
    test: dict[str, Any],
    label_key: str,
    num_classes: int,
    class_names: tuple[str, ...] | None,
    extra: dict[str, Any],
) -> Dataset:
    """Concatenate the train batches then the test batch; reshape rows to (3, 32, 32)."""
    batches = [*train, test]
    # Each row is 1024 red, then 1024 green, then 1024 blue bytes, rows of 32: channel first.
    x = np.concatenate([b["data"] for b in batches]).reshape(-1, *IMAGE_SHAPE)
    y = np.concatenate([_batch_labels(b, label_key, spec) for b in batches])
    n_train = sum(b["data"].shape[0] for b in train)
    pool = np.full(len(y), POOL_TRAIN, dtype=np.uint8)
    pool[n_train:] = POOL_TEST
    return Dataset(spec=spec, x=x, y=y, num_classes=num_classes, pool=pool, class_names=class_names, extra=extra)
