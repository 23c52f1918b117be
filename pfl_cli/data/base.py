"""The in-memory dataset every stage reads, and the checks every loader applies."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping

import numpy as np

from pfl_cli.errors import DatasetError, check_memory
from pfl_cli.formats import sha256_array

POOL_TRAIN = 0
POOL_TEST = 1


@dataclass(frozen=True)
class Dataset:
    """A centralized dataset in sample order.

    Attributes
    ----------
    spec : str
        The spec it was loaded from (``builtin:digits``, ``npz:PATH``, ...).
    x : ndarray of shape (n_samples, *input_shape)
        Features, in the dataset's native dtype (uint8 images stay uint8).
    y : ndarray of shape (n_samples,), int64, or None
        Class labels in ``[0, num_classes)``, -1 where a sample's label is unknown (npz
        ``y = -1``, an empty csv label cell); None for unlabelled data.
    client : ndarray of shape (n_samples,) or None
        Natural client ids (LEAF users, a client column), as str.
    pool : ndarray of shape (n_samples,), uint8, or None
        0 for the train pool, 1 for the dataset's official test pool; None when the
        dataset has a single pool. Partition indices point into this sample order.
    num_classes : int
    class_names : tuple of str, optional
    labeled : ndarray of shape (n_samples,), bool, or None
        Whose labels training may read (a csv ``labeled`` column). A sample outside it
        may still hold its true label in ``y``: a hidden label only an evaluator asked
        for it (``predict --evaluate-hidden-labels``) reads. None: every known label.
    """

    spec: str
    x: np.ndarray
    y: np.ndarray | None
    num_classes: int
    client: np.ndarray | None = None
    pool: np.ndarray | None = None
    class_names: tuple[str, ...] | None = None
    extra: Mapping[str, Any] = field(default_factory=dict)
    labeled: np.ndarray | None = None

    @property
    def label_visible(self) -> np.ndarray:
        """Bool (n_samples,): the sample has a label training may read."""
        if self.y is None:
            return np.zeros(self.num_samples, dtype=bool)
        known = np.asarray(self.y) >= 0
        return known if self.labeled is None else known & self.labeled

    @property
    def num_samples(self) -> int:
        return int(self.x.shape[0])

    @property
    def input_shape(self) -> tuple[int, ...]:
        return tuple(int(s) for s in self.x.shape[1:])

    @property
    def has_test_pool(self) -> bool:
        return self.pool is not None and bool(np.any(self.pool == POOL_TEST))

    @property
    def labels_sha256(self) -> str | None:
        return None if self.y is None else sha256_array(np.asarray(self.y, dtype=np.int64))

    @property
    def content_sha256(self) -> str:
        """Hash of the arrays themselves, so a moved or re-downloaded copy hashes the same."""
        import hashlib

        digest = hashlib.sha256()
        for arr in (self.x, self.y, self.client, self.pool):
            digest.update(b"-" if arr is None else sha256_array(np.asarray(arr)).encode())
        if self.labeled is not None:  # absent for fully labeled data: their hashes stay as they were
            digest.update(b"labeled" + sha256_array(np.asarray(self.labeled, dtype=np.uint8)).encode())
        return digest.hexdigest()

    def input_ref(self) -> dict[str, str]:
        """The manifest ``inputs`` entry of this dataset."""
        return {"path": self.spec, "stage": "dataset", "sha256": self.content_sha256}

    def features(self, indices: np.ndarray) -> np.ndarray:
        """Rows ``indices`` flattened to float64 vectors (for k-means, MDM bins, ...)."""
        return np.asarray(self.x[indices], dtype=np.float64).reshape(len(indices), -1)

    def info(self) -> dict[str, Any]:
        """The ``dataset.json`` document of a partition artifact."""
        doc: dict[str, Any] = {
            "spec": self.spec,
            "num_samples": self.num_samples,
            "num_classes": int(self.num_classes),
            "input_shape": list(self.input_shape),
            "dtype": str(self.x.dtype),
            "labels_sha256": self.labels_sha256,
            "has_test_pool": self.has_test_pool,
            "has_natural_clients": self.client is not None,
        }
        if self.y is not None and not self.label_visible.all():
            doc["num_unlabeled_samples"] = int(np.count_nonzero(~self.label_visible))
        if self.pool is not None:
            doc["pool_sizes"] = {
                "train": int(np.sum(self.pool == POOL_TRAIN)),
                "test": int(np.sum(self.pool == POOL_TEST)),
            }
        if self.class_names is not None:
            doc["class_names"] = list(self.class_names)
        doc.update(self.extra)
        return doc


def validate_dataset(ds: Dataset) -> Dataset:
    """Check a freshly loaded dataset; raise :class:`DatasetError` naming the problem."""
    n = ds.x.shape[0] if ds.x.ndim else 0
    where = ds.spec
    if ds.x.ndim < 2 or n == 0:
        raise DatasetError(f"{where}: x must have shape (n_samples, ...) with n_samples >= 1; got {ds.x.shape}.")
    if ds.x.dtype.kind not in "biuf":
        raise DatasetError(f"{where}: x must be numeric; got dtype {ds.x.dtype}.")
    if ds.x.dtype.kind == "f" and not np.isfinite(ds.x).all():
        bad = int(np.count_nonzero(~np.isfinite(ds.x).reshape(n, -1).all(axis=1)))
        raise DatasetError(f"{where}: x has NaN or infinite values in {bad} samples; clean or drop them first.")
    if ds.y is not None:
        if ds.y.shape != (n,):
            raise DatasetError(f"{where}: y must have shape ({n},) to match x; got {ds.y.shape}.")
        if ds.y.dtype.kind not in "biu":
            raise DatasetError(f"{where}: labels must be non-negative integers; got dtype {ds.y.dtype}.")
        if n and ds.y.min() < -1:
            raise DatasetError(f"{where}: labels must be non-negative integers, or -1 for an unknown label; "
                               f"got {int(ds.y.min())}.")
        if n and ds.y.max() >= ds.num_classes:
            raise DatasetError(f"{where}: label {int(ds.y.max())} is outside [0, {ds.num_classes}).")
    for name in ("client", "pool", "labeled"):
        arr = getattr(ds, name)
        if arr is not None and arr.shape != (n,):
            raise DatasetError(f"{where}: {name} must have shape ({n},) to match x; got {arr.shape}.")
    return ds


def labels_from_array(values: np.ndarray, where: str) -> np.ndarray:
    """Integer labels from an array that may hold integral floats; reject anything else."""
    values = np.asarray(values)
    if values.dtype.kind in "biu":
        return values.astype(np.int64)
    if values.dtype.kind == "f":
        if not np.isfinite(values).all():
            raise DatasetError(f"{where}: labels contain NaN or infinite values.")
        if np.any(values != np.round(values)):
            raise DatasetError(f"{where}: labels must be integers; got non-integer values such as {values[values != np.round(values)][0]}.")
        return values.astype(np.int64)
    raise DatasetError(f"{where}: labels must be non-negative integers; got dtype {values.dtype}.")


def check_options(spec: str, options: Mapping[str, str], allowed: tuple[str, ...]) -> None:
    """Reject spec options a loader does not know, so a typo never passes silently.

    Parameters
    ----------
    spec : str
        The full spec, quoted in the message.
    options : mapping of str to str
        The ``?key=value`` options parsed from the spec.
    allowed : tuple of str
        The option names the loader accepts (may be empty).

    Raises
    ------
    DatasetError
        When an option is not in ``allowed``.
    """
    unknown = sorted(set(options) - set(allowed))
    if unknown:
        takes = f"it takes {', '.join(allowed)}" if allowed else "it takes no options"
        raise DatasetError(f"{spec}: unknown option(s) {unknown}; {takes}. Remove or fix the option.")


def numeric_options(spec: str, options: Mapping[str, str], cls, ints: tuple[str, ...], floats: tuple[str, ...],
                    rules) -> Any:
    """Parse a generator's ``?key=value`` numbers into the dataclass ``cls`` and check its rules.

    ``rules(p)`` returns ``(name, ok, rule)`` triples; the first failing one is reported
    as "SPEC: option NAME must be RULE; got VALUE."
    """
    check_options(spec, options, ints + floats)
    values: dict[str, float | int] = {}
    for name, raw in options.items():
        try:
            values[name] = int(raw) if name in ints else float(raw)
        except ValueError:
            kind = "an integer" if name in ints else "a number"
            raise DatasetError(f"{spec}: option {name} must be {kind}; got {raw!r}.") from None
    p = cls(**values)
    for name, ok, rule in rules(p):
        if not ok:
            raise DatasetError(f"{spec}: option {name} must be {rule}; got {getattr(p, name)!r}.")
    return p


def option_num_classes(spec: str, options: Mapping[str, str]) -> int | None:
    """The ``num_classes`` option as a positive int, or None when it is not given.

    Raises
    ------
    DatasetError
        When the value is not a positive integer.
    """
    raw = options.get("num_classes")
    if raw is None:
        return None
    try:
        value = int(raw)
    except ValueError:
        value = 0
    if value < 1:
        raise DatasetError(f"{spec}: option num_classes must be a positive integer; got {raw!r}.")
    # Per-class arrays (label histograms of every client, class shares) are sized by this number.
    check_memory(f"{spec}: option num_classes {value}", 8.0 * 16 * value, fix="Give the real number of classes.")
    return value
