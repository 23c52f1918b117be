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
    x, y = _digits_arrays()
    return Dataset(spec=spec, x=x, y=y, num_classes=10, class_names=tuple(str(c) for c in range(10)))


def _digits_arrays() -> tuple[np.ndarray, np.ndarray]:
    """The 1797 digits exactly as ``sklearn.datasets.load_digits`` returns them (sample order, values 0..16).

    Read straight from the CSV that scikit-learn ships (what ``load_digits`` itself parses):
    importing scikit-learn costs ~1-7 s of a cold start, the file ~20 ms. Falls back to
    ``load_digits`` if a scikit-learn release moves the file.
    """
    import importlib.util
    from pathlib import Path

    spec = importlib.util.find_spec("sklearn")
    roots = list(spec.submodule_search_locations or ()) if spec is not None else []
    for root in roots:
        path = Path(root) / "datasets" / "data" / "digits.csv.gz"
        if path.is_file():
            table = np.loadtxt(path, delimiter=",")
            return table[:, :-1].astype(np.float32), table[:, -1].astype(np.int64)
    from sklearn.datasets import load_digits

    bunch = load_digits()
    return np.asarray(bunch.data, dtype=np.float32), np.asarray(bunch.target, dtype=np.int64)
