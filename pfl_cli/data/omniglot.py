"""``omniglot:DIR?set=all|background|evaluation&size=N``: Omniglot in its published folder layout.

Layout (https://github.com/brendenlake/omniglot, ``python/images_background.zip`` and
``images_evaluation.zip`` unpacked): ``DIR`` holds ``images_background/`` (30 alphabets, 964
characters) and ``images_evaluation/`` (20 alphabets, 659 characters), each
``<alphabet>/character<NN>/*.png``, 20 drawings of 105 x 105 per character.

pFedHN's setting (paper §5.1, App. B): the 1,623 characters are the classes and each of the
50 alphabets is one client, so label sets are disjoint and client sizes vary. ``client`` is the
alphabet's folder name (natural clients: ``partition --natural-id``); the class name is
``alphabet/characterNN``. The background/evaluation division is a split of alphabets, not a
train/test split, so there is one pool; ``partition --test-fraction`` splits each alphabet (pFedHN:
70/15/15). ``set=background`` or ``set=evaluation`` reads one half (default ``all``).
``size=N`` resizes the drawings to N x N (e.g. 28); by default they keep 105 x 105. Pixels are
as published (strokes 0, background 255), uint8 (N, 1, H, W). Needs Pillow (``pip install 'pflx[hf]'``).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from pfl_cli.data.base import Dataset, check_options
from pfl_cli.data.pngs import png_files, read_pngs
from pfl_cli.errors import DatasetError

SETS = {"all": ("background", "evaluation"), "background": ("background",), "evaluation": ("evaluation",)}


def load(arg: str, options: dict[str, str], spec: str) -> Dataset:
    """Load Omniglot from its ``images_background`` / ``images_evaluation`` folders.

    Parameters
    ----------
    arg : str
        The directory holding the unpacked ``images_*`` folders.
    options : dict of str to str
        ``set`` (all, background or evaluation) and ``size`` (resize to N x N).
    spec : str
        The full spec, for messages and ``Dataset.spec``.

    Returns
    -------
    Dataset
        x uint8 (N, 1, size, size), one class per character, ``client`` = alphabet, single pool.

    Raises
    ------
    DatasetError
        Missing directory or folder, an alphabet or character without drawings, an unreadable
        PNG, a bad option, Pillow absent.
    """
    check_options(spec, options, ("set", "size"))
    halves = SETS.get(options.get("set", "all"))
    if halves is None:
        raise DatasetError(f"{spec}: option set must be one of {', '.join(SETS)}; got {options['set']!r}.")
    size = _size(options.get("size"), spec)
    root = Path(arg)
    if not root.is_dir():
        raise DatasetError(f"{spec}: no such directory {root}; point to the directory holding images_background/.")
    files: list[list[Path]] = []
    class_names: list[str] = []
    alphabets: list[str] = []
    for half in halves:  # the whole layout is checked before any image is decoded
        folder = root / f"images_{half}"
        if not folder.is_dir():
            raise DatasetError(f"{spec}: missing folder images_{half} in {root}; unpack Omniglot's "
                               f"images_{half}.zip there.")
        for alphabet in _subdirs(folder, "alphabet", spec):
            for character in _subdirs(alphabet, "character", spec):
                files.append(png_files(character, spec))
                class_names.append(f"{alphabet.name}/{character.name}")
                alphabets.append(alphabet.name)
    x = read_pngs([p for group in files for p in group], "L", size, spec)
    counts = [len(group) for group in files]
    return Dataset(
        spec=spec,
        x=x,
        y=np.repeat(np.arange(len(files), dtype=np.int64), counts),
        num_classes=len(files),
        client=np.repeat(np.asarray(alphabets, dtype=str), counts),
        class_names=tuple(class_names),
        extra={"omniglot_set": options.get("set", "all")},
    )


def _subdirs(folder: Path, what: str, spec: str) -> list[Path]:
    found = sorted(p for p in folder.iterdir() if p.is_dir())
    if not found:
        raise DatasetError(f"{spec}: {folder} holds no {what} folders; the published layout is "
                           f"images_<set>/<alphabet>/character<NN>/*.png.")
    return found


def _size(value: str | None, spec: str) -> int | None:
    if value is None:
        return None
    if not value.isdigit() or not 1 <= int(value) <= 1024:
        raise DatasetError(f"{spec}: option size must be an integer in [1, 1024] (pixels); got {value!r}.")
    return int(value)
