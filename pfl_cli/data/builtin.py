"""Datasets embedded in installed packages: no download ever."""

from __future__ import annotations

import numpy as np

from pfl_cli.data.base import Dataset
from pfl_cli.errors import DatasetError

NAMES = ("digits",)


def load(name: str, options: dict[str, str], spec: str) -> Dataset:
    if options:
        raise DatasetError(f"{spec}: builtin datasets take no options; got {sorted(options)}.")
    if name != "digits":
        raise DatasetError(f"unknown builtin dataset {name!r}; known: {', '.join(NAMES)}.")
    from sklearn.datasets import load_digits

    bunch = load_digits()
    # Sample order exactly as sklearn returns it; pixel values are integers 0..16.
    x = np.asarray(bunch.data, dtype=np.float32)
    y = np.asarray(bunch.target, dtype=np.int64)
    return Dataset(spec=spec, x=x, y=y, num_classes=10, class_names=tuple(str(c) for c in range(10)))
