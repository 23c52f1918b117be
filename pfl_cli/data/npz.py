"""``npz:PATH``: arrays ``x`` (samples first), optional ``y`` (-1 for an unknown label), ``client`` and ``pool``."""

from __future__ import annotations

import zipfile
from pathlib import Path

import numpy as np

from pfl_cli.data.base import Dataset, labels_from_array, option_num_classes
from pfl_cli.errors import DatasetError


def load(arg: str, options: dict[str, str], spec: str) -> Dataset:
    path = Path(arg)
    if not path.is_file():
        raise DatasetError(f"{spec}: no such file {path}.")
    unknown = set(options) - {"num_classes"}
    if unknown:
        raise DatasetError(f"{spec}: unknown option(s) {sorted(unknown)}; npz takes num_classes.")
    try:
        with np.load(path, allow_pickle=False) as data:
            arrays = {k: data[k] for k in data.files}
    except ValueError as err:
        raise DatasetError(f"{spec}: holds object arrays, which need pickle; pflx never unpickles ({err}).") from None
    except (OSError, zipfile.BadZipFile, EOFError) as err:
        raise DatasetError(f"{spec}: not a readable .npz file ({err}).") from None
    if "x" not in arrays:
        raise DatasetError(f"{spec}: no array named 'x'; found {sorted(arrays)}.")
    x = arrays["x"]
    if x.ndim == 1:
        x = x[:, None]
    y = labels_from_array(arrays["y"], spec) if "y" in arrays else None
    client = arrays["client"].astype(str) if "client" in arrays else None
    pool = arrays.get("pool")
    if pool is not None:  # checked before the cast: NaN or 2.5 must not become a valid uint8
        if pool.dtype.kind not in "biuf" or not np.isin(pool, (0, 1)).all():
            bad = pool.reshape(-1)[~np.isin(pool.reshape(-1), (0, 1))][:1] if pool.dtype.kind in "biuf" else pool.dtype
            raise DatasetError(f"{spec}: pool must hold 0 (train) or 1 (test) for every sample; got {bad!s}.")
        pool = pool.astype(np.uint8)
    if "num_classes" in options:
        num_classes = option_num_classes(spec, options)
    else:
        num_classes = int(y.max()) + 1 if y is not None and len(y) else 0
    return Dataset(spec=spec, x=x, y=y, num_classes=num_classes, client=client, pool=pool)
