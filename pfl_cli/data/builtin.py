"""Datasets embedded in installed packages: no download ever."""

from __future__ import annotations

import numpy as np

from pfl_cli.data.base import Dataset
from pfl_cli.errors import DatasetError

NAMES = ("digits",)


def load(name: str, options: dict[str, str], spec: str) -> Dataset:
    """``builtin:digits``, or with ``?classes=5,6,7,8,9`` (or ``5-9``) only the samples of those digits.

    A class subset keeps the samples in their order and relabels the kept digits 0..k-1 in ascending order
    (``class_names`` names the digits): two specs with disjoint classes are disjoint sample sets, e.g. a public
    part to pretrain a backbone on and a private part for the clients (recipes/pretrain-then-personalize).
    """
    unknown = sorted(set(options) - {"classes"})
    if unknown:
        raise DatasetError(f"{spec}: unknown option(s) {unknown}; builtin:digits takes classes (e.g. classes=0-4).")
    if name != "digits":
        raise DatasetError(f"unknown builtin dataset {name!r}; known: {', '.join(NAMES)}.")
    x, y = _digits_arrays()
    if "classes" not in options:
        return Dataset(spec=spec, x=x, y=y, num_classes=10, class_names=tuple(str(c) for c in range(10)))
    keep = _classes(options["classes"], spec)
    rows = np.isin(y, keep)
    relabel = np.full(10, -1, dtype=np.int64)
    relabel[keep] = np.arange(len(keep))
    return Dataset(spec=spec, x=x[rows], y=relabel[y[rows]], num_classes=len(keep),
                   class_names=tuple(str(c) for c in keep))


def _classes(text: str, spec: str) -> np.ndarray:
    """The sorted digits of ``classes=``: comma-separated digits or ranges ``a-b`` (at least two distinct)."""
    picked: set[int] = set()
    try:
        for part in filter(None, (p.strip() for p in text.split(","))):
            low, _, high = part.partition("-")
            lo, hi = int(low), int(high or low)
            if not 0 <= lo <= hi <= 9:
                raise ValueError
            picked.update(range(lo, hi + 1))
    except ValueError:
        raise DatasetError(f"{spec}: classes must be digits 0-9, comma-separated or as ranges a-b (e.g. classes=0-4 "
                           f"or classes=1,3,5); got {text!r}.") from None
    if len(picked) < 2:
        raise DatasetError(f"{spec}: classes must name at least two digits (a classifier needs two classes); got "
                           f"{text!r}.")
    return np.array(sorted(picked), dtype=np.int64)


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
