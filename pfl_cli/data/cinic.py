"""``cinic10:DIR?valid=train|drop``: CINIC-10 in its published folder layout.

Layout (https://github.com/BayesWatch/cinic-10, ``CINIC-10.tar.gz`` unpacked): ``DIR`` holds
``train/``, ``valid/`` and ``test/``, each with one folder per class (:data:`CLASSES`, CIFAR-10's
names and order) of 32 x 32 ``*.png`` images, 9,000 per class and split (270,000 in all).

Pools follow the official split: ``train`` is pool 0 and ``test`` pool 1. ``valid`` (a third
split of the same size) joins the train pool by default (``valid=train``, as the CINIC-10 authors
suggest when no validation set is needed; pflx holds validation data out of each client's
train data instead) or is left out (``valid=drop``). Sample order: train, then valid (when
kept), then test; classes in :data:`CLASSES` order, files sorted by name. ``x`` is uint8
(N, 3, 32, 32); the few grayscale ImageNet images are converted to RGB. Needs Pillow
(``pip install 'pflx[hf]'``).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from pfl_cli.data.base import POOL_TEST, POOL_TRAIN, Dataset, check_options
from pfl_cli.data.pngs import png_files, read_pngs
from pfl_cli.errors import DatasetError

CLASSES = ("airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse", "ship", "truck")
SPLITS = ("train", "valid", "test")
VALID_MODES = ("train", "drop")


def load(arg: str, options: dict[str, str], spec: str) -> Dataset:
    """Load CINIC-10 from its ``train/valid/test/<class>/*.png`` folders.

    Parameters
    ----------
    arg : str
        The unpacked CINIC-10 directory.
    options : dict of str to str
        ``valid=train`` (default: the valid split joins the train pool) or ``valid=drop``.
    spec : str
        The full spec, for messages and ``Dataset.spec``.

    Returns
    -------
    Dataset
        x uint8 (N, 3, 32, 32), 10 classes, train (and valid) pool 0, test pool 1.

    Raises
    ------
    DatasetError
        Missing directory, split, class folder or images; an unreadable PNG; Pillow absent.
    """
    check_options(spec, options, ("valid",))
    valid = options.get("valid", "train")
    if valid not in VALID_MODES:
        raise DatasetError(f"{spec}: option valid must be train or drop; got {valid!r}.")
    root = Path(arg)
    if not root.is_dir():
        raise DatasetError(f"{spec}: no such directory {root}; point to the unpacked CINIC-10 directory.")
    splits = [s for s in SPLITS if s != "valid" or valid == "train"]
    files: list[list[Path]] = []  # per (split, class), in order
    for split in splits:  # check the whole layout before decoding 270,000 images
        for name in CLASSES:
            folder = root / split / name
            if not folder.is_dir():
                raise DatasetError(f"{spec}: missing folder {split}/{name} in {root}; CINIC-10 has "
                                   f"{'/'.join(SPLITS)}/<class>/*.png for its 10 classes.")
            files.append(png_files(folder, spec))
    x = read_pngs([p for group in files for p in group], "RGB", None, spec, side=32)
    counts = [len(group) for group in files]
    y = np.repeat(np.tile(np.arange(len(CLASSES), dtype=np.int64), len(splits)), counts)
    split_of = np.repeat(np.repeat(np.arange(len(splits)), len(CLASSES)), counts)
    pool = np.where(np.asarray(splits)[split_of] == "test", POOL_TEST, POOL_TRAIN).astype(np.uint8)
    return Dataset(spec=spec, x=x, y=y, num_classes=len(CLASSES), pool=pool, class_names=CLASSES,
                   extra={"cinic10_valid": valid})
