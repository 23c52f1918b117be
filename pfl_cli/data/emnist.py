"""``emnist:DIR?split=byclass|bymerge|balanced|letters|digits|mnist``: the EMNIST release's IDX files.

Layout (the ``gzip.zip`` of https://www.nist.gov/itl/products-and-services/emnist-dataset, unpacked):
``DIR`` (the ``gzip`` folder or its parent) holds, for the chosen split S,
``emnist-S-train-images-idx3-ubyte``, ``emnist-S-train-labels-idx1-ubyte``,
``emnist-S-test-images-idx3-ubyte`` and ``emnist-S-test-labels-idx1-ubyte`` (plain or ``.gz``),
and optionally ``emnist-S-mapping.txt`` (one ``label ascii-code [ascii-code]`` line per class),
which gives the class names.

The release stores every image transposed (column-major) compared with MNIST (Cohen et al. 2017,
§II-B); the loader transposes them back, so a letter stands upright as in ``mnist:``. The
``letters`` split numbers its 26 classes 1..26 (0 is unused); they are shifted to 0..25.
Sample order: the train files (pool 0), then the test files (pool 1), the official split.
``x`` is uint8 (N, 1, 28, 28). HyperFL's EMNIST is ``split=byclass`` (62 classes), the default.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from pfl_cli.data.base import Dataset, check_options
from pfl_cli.data.mnist import read_split, train_test_dataset
from pfl_cli.errors import DatasetError

# Classes per split (EMNIST paper, Table II); letters' labels start at 1 in the files.
SPLIT_CLASSES = {"byclass": 62, "bymerge": 47, "balanced": 47, "letters": 26, "digits": 10, "mnist": 10}
DEFAULT_SPLIT = "byclass"


def load(arg: str, options: dict[str, str], spec: str) -> Dataset:
    """Load one EMNIST split from its IDX files.

    Parameters
    ----------
    arg : str
        The release's ``gzip`` directory, or the directory holding it.
    options : dict of str to str
        ``split``: one of :data:`SPLIT_CLASSES` (default ``byclass``).
    spec : str
        The full spec, for messages and ``Dataset.spec``.

    Returns
    -------
    Dataset
        x uint8 (N, 1, 28, 28) upright, y int64 in [0, classes of the split), train then test pool.

    Raises
    ------
    DatasetError
        Unknown split, missing directory or file, corrupt IDX, labels outside the split's range,
        a malformed mapping file.
    """
    check_options(spec, options, ("split",))
    split = options.get("split", DEFAULT_SPLIT)
    if split not in SPLIT_CLASSES:
        raise DatasetError(f"{spec}: option split must be one of {', '.join(SPLIT_CLASSES)}; got {split!r}.")
    root = _release_dir(Path(arg), split, spec)
    num_classes = SPLIT_CLASSES[split]
    offset = 1 if split == "letters" else 0
    xs, ys = [], []
    for part in ("train", "test"):
        images, labels = read_split(root, f"emnist-{split}-{part}", spec)
        y = labels.astype(np.int64) - offset
        bad = np.flatnonzero((y < 0) | (y >= num_classes))
        if bad.size:
            raise DatasetError(
                f"{spec}: emnist-{split}-{part}-labels: labels must lie in [{offset}, {num_classes + offset}) for "
                f"split {split}; got {int(labels[bad[0]])} at index {int(bad[0])}. Is it the right split's file?"
            )
        # The release writes each image transposed: swap rows and columns to stand it upright.
        xs.append(np.ascontiguousarray(images.transpose(0, 2, 1))[:, None])
        ys.append(y)
    names = _class_names(root / f"emnist-{split}-mapping.txt", num_classes, offset, spec)
    return train_test_dataset(spec, xs, ys, num_classes, names, {"emnist_split": split})


def _release_dir(path: Path, split: str, spec: str) -> Path:
    """``path`` or ``path/gzip``: whichever holds the split's train images."""
    if not path.is_dir():
        raise DatasetError(f"{spec}: no such directory {path}; point to the EMNIST release's gzip directory.")
    marker = f"emnist-{split}-train-images-idx3-ubyte"
    for candidate in (path, path / "gzip"):
        if (candidate / marker).is_file() or (candidate / f"{marker}.gz").is_file():
            return candidate
    raise DatasetError(
        f"{spec}: missing {marker} (or {marker}.gz) in {path} or {path / 'gzip'}; the EMNIST release's gzip "
        f"directory holds four IDX files per split."
    )


def _class_names(path: Path, num_classes: int, offset: int, spec: str) -> tuple[str, ...] | None:
    """Class names from the mapping file (``label code [code]`` per line); None when it is absent."""
    if not path.is_file():
        return None
    names: dict[int, str] = {}
    for lineno, line in enumerate(path.read_text(encoding="ascii", errors="replace").splitlines(), start=1):
        if not line.strip():
            continue
        cells = line.split()
        try:
            label, codes = int(cells[0]) - offset, [int(c) for c in cells[1:]]
            if not codes or not 0 <= label < num_classes:
                raise ValueError
            names[label] = "/".join(chr(c) for c in codes)
        except (ValueError, OverflowError):
            raise DatasetError(
                f"{spec}: {path.name}: line {lineno} must be 'label ascii-code [ascii-code]' with a label of "
                f"this split; got {line.strip()!r}."
            ) from None
    if sorted(names) != list(range(num_classes)):
        raise DatasetError(f"{spec}: {path.name}: must name all {num_classes} classes; it names {len(names)}.")
    return tuple(names[i] for i in range(num_classes))
