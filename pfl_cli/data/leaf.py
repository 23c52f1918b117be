"""``leaf:PATH?task=femnist|shakespeare``: LEAF JSON with users as natural clients.

Each file is ``{"users": [uid, ...], "num_samples": [n, ...], "user_data": {uid: {"x": [...],
"y": [...]}}}`` with an optional ``"hierarchies"`` list (ignored). ``PATH`` is one of

- a directory with ``train/`` and ``test/`` sub-directories of ``*.json`` (LEAF's
  ``data/train`` and ``data/test``): pool 0 and pool 1; a user's test samples keep its id;
- a directory of ``*.json`` files, or a single ``.json`` file: one pool.

Sample order: pool 0 then pool 1; within a pool, files sorted by name, users in the order
of the file's ``users`` list, each user's samples in order. ``client`` is the user id.

Tasks (detected from the type of ``x`` unless ``task=`` is given):

- ``femnist``: ``x`` is 784 pixel values -> float32 (N, 1, 28, 28); ``y`` in [0, 62).
- ``shakespeare``: ``x`` is a string -> int64 letter codes (N, len); ``y`` is the next
  character -> its code; 80 classes over LEAF's alphabet :data:`SHAKESPEARE_LETTERS`.
  ``dataset.json`` records ``vocab_size`` 80: text data, which ``train`` reads as codes
  into LEAF's LSTM (``model_arch`` auto -> lstm).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np

from pfl_cli.data.base import POOL_TEST, POOL_TRAIN, Dataset, check_options
from pfl_cli.errors import DatasetError

# LEAF's ALL_LETTERS (models/utils/language_utils.py); a letter's index is its class.
SHAKESPEARE_LETTERS = "\n !\"&'(),-.0123456789:;>?ABCDEFGHIJKLMNOPQRSTUVWXYZ[]abcdefghijklmnopqrstuvwxyz}"
_LETTER_INDEX = {c: i for i, c in enumerate(SHAKESPEARE_LETTERS)}
FEMNIST_CLASSES = 62
FEMNIST_PIXELS = 784
TASKS = ("femnist", "shakespeare")


def load(arg: str, options: dict[str, str], spec: str) -> Dataset:
    """Load LEAF JSON files.

    Parameters
    ----------
    arg : str
        A ``data`` directory with ``train/`` and ``test/``, a directory of json files,
        or one json file.
    options : dict of str to str
        ``task=femnist|shakespeare``; detected from the data when absent.
    spec : str
        The full spec, for messages and ``Dataset.spec``.

    Returns
    -------
    Dataset
        Natural clients (user ids as str); pools when train/ and test/ are given.

    Raises
    ------
    DatasetError
        Missing path, no json files, unreadable json, ``num_samples`` that disagree with
        the data, users missing from ``user_data``, samples that do not fit the task.
    """
    check_options(spec, options, ("task",))
    task = options.get("task")
    if task is not None and task not in TASKS:
        raise DatasetError(f"{spec}: option task must be one of {', '.join(TASKS)}; got {task!r}.")
    pools = _pool_files(Path(arg), spec)
    clients, flat_x, flat_y, pool_ids = _collect(pools, spec)
    if not flat_x:
        raise DatasetError(f"{spec}: the LEAF files hold no samples.")
    task = task or _detect_task(flat_x[0], spec)
    convert = _femnist if task == "femnist" else _shakespeare
    x, y, num_classes, class_names = convert(flat_x, flat_y, spec)
    single_pool = len(pools) == 1
    return Dataset(
        spec=spec,
        x=x,
        y=y,
        num_classes=num_classes,
        client=np.asarray(clients, dtype=str),
        pool=None if single_pool else np.asarray(pool_ids, dtype=np.uint8),
        class_names=class_names,
        # Shakespeare's x are character codes: the vocabulary marks them as text (token sequences) for the
        # engine, which reads them as codes (no standardization) into LEAF's LSTM (pfl_cli.models.sequence).
        extra={"leaf_task": task, **({"vocab_size": len(SHAKESPEARE_LETTERS)} if task == "shakespeare" else {})},
    )


def _collect(pools: list[tuple[int, list[Path]]], spec: str) -> tuple[list[str], list[Any], list[Any], list[int]]:
    """Client id, x, y and pool of every sample, flattened in the documented order."""
    clients: list[str] = []
    flat_x: list[Any] = []
    flat_y: list[Any] = []
    pool_ids: list[int] = []
    for pool, files in pools:
        seen: dict[str, str] = {}
        for path in files:
            for uid, x, y in _read_users(path, spec):
                # A user twice in one pool means two copies of the data (e.g. the outputs of
                # two preprocess runs in one directory): its samples would count double.
                if uid in seen:
                    raise DatasetError(
                        f"{spec}: user {uid!r} appears in both {seen[uid]} and {path.name} of the same "
                        f"pool; each user's data must come once. Keep one file per LEAF split in the directory."
                    )
                seen[uid] = path.name
                clients.extend([uid] * len(y))
                flat_x.extend(x)
                flat_y.extend(y)
                pool_ids.extend([pool] * len(y))
    return clients, flat_x, flat_y, pool_ids


def _pool_files(path: Path, spec: str) -> list[tuple[int, list[Path]]]:
    """The json files of each pool, sorted by name: ``[(pool, files), ...]``."""
    if path.is_file():
        return [(POOL_TRAIN, [path])]
    if not path.is_dir():
        raise DatasetError(f"{spec}: no such file or directory {path}; give a LEAF data directory or json file.")
    if (path / "train").is_dir() and (path / "test").is_dir():
        return [(POOL_TRAIN, _json_files(path / "train", spec)), (POOL_TEST, _json_files(path / "test", spec))]
    return [(POOL_TRAIN, _json_files(path, spec))]


def _json_files(directory: Path, spec: str) -> list[Path]:
    files = sorted(p for p in directory.glob("*.json") if p.is_file())
    if not files:
        raise DatasetError(
            f"{spec}: no *.json files in {directory}; give LEAF's data directory (with train/ and test/), "
            f"a directory of json files, or one json file."
        )
    return files


def _read_users(path: Path, spec: str) -> list[tuple[str, list[Any], list[Any]]]:
    """``(uid, x, y)`` for each user of one file, in the order of its ``users`` list."""
    where = f"{spec}: {path.name}"
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        raise DatasetError(f"{where}: not readable JSON ({err}).") from None
    if not isinstance(doc, dict) or not all(k in doc for k in ("users", "num_samples", "user_data")):
        raise DatasetError(f"{where}: a LEAF file is an object with users, num_samples and user_data.")
    uids, counts, data = doc["users"], doc["num_samples"], doc["user_data"]
    if not isinstance(uids, list) or not isinstance(counts, list) or len(uids) != len(counts):
        raise DatasetError(f"{where}: users and num_samples must be lists of the same length.")
    out = []
    for uid, count in zip(uids, counts):
        record = data.get(str(uid)) if isinstance(data, dict) else None
        if not isinstance(record, dict) or "x" not in record or "y" not in record:
            raise DatasetError(f"{where}: user {uid!r} is listed in users but has no x and y in user_data.")
        x, y = record["x"], record["y"]
        if not isinstance(x, list) or not isinstance(y, list) or not len(x) == len(y) == count:
            got = (len(x), len(y)) if isinstance(x, list) and isinstance(y, list) else "non-lists"
            raise DatasetError(
                f"{where}: user {uid!r} must have num_samples = {count} samples in x and y; got {got}."
            )
        out.append((str(uid), x, y))
    return out


def _detect_task(sample: Any, spec: str) -> str:
    """``shakespeare`` for a string sample, ``femnist`` for a list of numbers."""
    if isinstance(sample, str):
        return "shakespeare"
    if isinstance(sample, list):
        return "femnist"
    raise DatasetError(f"{spec}: cannot tell the LEAF task from an x of type {type(sample).__name__}; give ?task=.")


def _femnist(xs: list[Any], ys: list[Any], spec: str) -> tuple[np.ndarray, np.ndarray, int, None]:
    """784 pixel values per sample -> float32 (N, 1, 28, 28); integer labels."""
    bad = next((i for i, s in enumerate(xs) if not isinstance(s, list) or len(s) != FEMNIST_PIXELS), None)
    if bad is not None:
        got = len(xs[bad]) if isinstance(xs[bad], list) else type(xs[bad]).__name__
        raise DatasetError(f"{spec}: FEMNIST samples must be {FEMNIST_PIXELS} pixel values; sample {bad} has {got}.")
    try:
        x = np.asarray(xs, dtype=np.float32).reshape(-1, 1, 28, 28)
    except (TypeError, ValueError):
        raise DatasetError(f"{spec}: FEMNIST pixel values must be numbers.") from None
    if not all(isinstance(v, int) and not isinstance(v, bool) for v in ys):
        bad_y = next(v for v in ys if not isinstance(v, int) or isinstance(v, bool))
        raise DatasetError(f"{spec}: FEMNIST labels must be integers in [0, {FEMNIST_CLASSES}); got {bad_y!r}.")
    return x, np.asarray(ys, dtype=np.int64), FEMNIST_CLASSES, None


def _shakespeare(xs: list[Any], ys: list[Any], spec: str) -> tuple[np.ndarray, np.ndarray, int, tuple[str, ...]]:
    """Strings -> letter codes (N, len); next characters -> class codes."""
    if not all(isinstance(s, str) for s in xs) or not all(isinstance(c, str) and len(c) == 1 for c in ys):
        raise DatasetError(f"{spec}: Shakespeare x must be strings and y single characters.")
    lengths = {len(s) for s in xs}
    if len(lengths) != 1:
        raise DatasetError(f"{spec}: Shakespeare x strings must all have the same length; got lengths {sorted(lengths)[:5]}.")
    x = _letter_codes("".join(xs), spec).reshape(len(xs), lengths.pop())
    y = _letter_codes("".join(ys), spec)
    return x, y, len(SHAKESPEARE_LETTERS), tuple(SHAKESPEARE_LETTERS)


def _letter_codes(text: str, spec: str) -> np.ndarray:
    """LEAF's index of every character of ``text``, by table lookup (millions of letters).

    LEAF's own ``letter_to_index`` maps unknown letters to -1, which later indexes the
    embedding from the end; pflx refuses them instead.
    """
    table = np.full(256, -1, dtype=np.int64)
    table[np.frombuffer(SHAKESPEARE_LETTERS.encode("ascii"), dtype=np.uint8)] = np.arange(len(SHAKESPEARE_LETTERS))
    # The alphabet is ASCII: any other character becomes "?" here and is reported below.
    raw = np.frombuffer(text.encode("ascii", errors="replace"), dtype=np.uint8)
    codes = table[raw]
    unknown = codes < 0
    if text.isascii() and not unknown.any():
        return codes
    first = int(np.argmax(unknown)) if unknown.any() else next(i for i, c in enumerate(text) if not c.isascii())
    raise DatasetError(
        f"{spec}: character {text[first]!r} is not in LEAF's 80-letter Shakespeare alphabet; "
        f"the file was not produced by LEAF's preprocessing."
    )
