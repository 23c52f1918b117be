"""``hf:PATH[?split=S&label=COL&client=COL&image=COL&features=A,B&text=COL&tokenizer=DIR&max_length=L&num_classes=K]``:
Hugging Face data on disk.

``PATH`` is a directory written by ``datasets``' ``save_to_disk`` (a ``Dataset`` or a
``DatasetDict``; read with ``datasets.load_from_disk``) or a folder of ``.parquet`` files, such as a
Hub dataset's ``data/`` folder (read with pyarrow; a file's split is the prefix of its name before
``-``, as in ``train-00000-of-00001.parquet``). Nothing is downloaded. Needs ``pip install "pflx[hf]"``.

Splits and pools: ``split=S`` reads one split; without it, ``train`` and ``test`` splits become the
train pool and the official test pool (test data matched to each client's labels, as for CIFAR),
and a single split is read as is.

Columns: ``label`` (default ``label``, then ``labels``, then ``y`` if present; integer, ClassLabel
names become class names), ``client`` (natural client ids, kept as str), ``image`` (default: the
first image column; decoded with Pillow to uint8 (C, H, W), all images the same size), otherwise
``features`` (default: every other column; numeric scalars or fixed-length numeric lists).

Text: ``text=COL&tokenizer=DIR[&max_length=L]`` reads column COL (strings) as the only feature, tokenized with the
transformers tokenizer in DIR, the checkpoint ``--model-arch hf:DIR`` trains, into L token ids per row (64 by
default; :mod:`pfl_cli.data.text`, as the csv text path). Columns other than the text, label and client ones are
not read.
"""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any

import numpy as np

from pfl_cli.data.base import POOL_TEST, POOL_TRAIN, Dataset, check_options, labels_from_array, option_num_classes
from pfl_cli.errors import DatasetError

OPTIONS = ("split", "label", "client", "image", "features", "num_classes", "text", "tokenizer", "max_length")
DEFAULT_LABEL_COLUMNS = ("label", "labels", "y")
EXTRA = "pip install 'pflx[hf]'"


def load(arg: str, options: dict[str, str], spec: str) -> Dataset:
    """Load a saved Hugging Face dataset or a parquet folder (see the module docstring).

    Raises
    ------
    DatasetError
        Missing path, a directory that is neither, unknown split or column, images of mixed sizes,
        non-numeric features, non-integer labels, the extra not installed.
    """
    check_options(spec, options, OPTIONS)
    path = Path(arg)
    if not path.exists():
        raise DatasetError(f"{spec}: no such directory {path}; give a folder written by save_to_disk or of .parquet files.")
    splits = _read_splits(path, spec)
    chosen = _choose_splits(splits, options.get("split"), spec)
    tables = [splits[name] for name in chosen]
    columns = tables[0].column_names
    for name, table in zip(chosen[1:], tables[1:]):
        if table.column_names != columns:
            raise DatasetError(f"{spec}: splits {chosen[0]} and {name} have different columns; read one with ?split=.")
    label_col = _label_column(columns, options, spec)
    client_col = _named(columns, options.get("client"), "client", spec)
    text = None
    if {"text", "tokenizer", "max_length"} & set(options):
        text = _text_column(tables[0], options, (label_col, client_col), spec)
    image_col = None if text is not None else _image_column(tables[0], options.get("image"), spec)
    used = {label_col, client_col, image_col} - {None}
    if len(used) < len([c for c in (label_col, client_col, image_col) if c is not None]):
        raise DatasetError(f"{spec}: the label, client and image columns must differ.")
    extra: dict[str, Any] = {"hf_splits": list(chosen)}
    if text is not None:
        from pfl_cli.data.text import tokenize

        column, tokenizer, max_length = text
        texts = [s for t in tables for s in t.column(column).to_pylist()]
        x, tokens = tokenize(texts, tokenizer, max_length, spec)
        extra.update(tokens)
        feature_names = None
    elif image_col is not None:
        x = np.concatenate([_images(t.column(image_col).to_pylist(), image_col, spec) for t in tables])
        feature_names = None
    else:
        feature_names = _feature_columns(columns, used, options.get("features"), spec)
        x = np.concatenate([_features(t, feature_names, spec) for t in tables])
    y = None
    if label_col is not None:
        y = labels_from_array(np.concatenate([np.asarray(t.column(label_col).to_numpy(zero_copy_only=False))
                                              for t in tables]), f"{spec}: label column {label_col!r}")
    client = None
    if client_col is not None:
        client = np.concatenate([np.asarray(t.column(client_col).to_pylist(), dtype=object).astype(str) for t in tables])
    class_names = _class_names(tables[0], label_col)
    num_classes = option_num_classes(spec, options)
    if num_classes is None:
        num_classes = len(class_names) if class_names else (int(y.max()) + 1 if y is not None and len(y) else 0)
    pool = None
    if len(tables) == 2:
        pool = np.repeat(np.array([POOL_TRAIN, POOL_TEST], dtype=np.uint8), [len(tables[0]), len(tables[1])])
    if feature_names is not None:
        extra["feature_names"] = feature_names
    return Dataset(spec=spec, x=x, y=y, num_classes=num_classes, client=client, pool=pool,
                   class_names=tuple(class_names) if class_names else None, extra=extra)


# ---------------------------------------------------------------------------- reading splits
def _read_splits(path: Path, spec: str) -> dict[str, Any]:
    """Split name -> pyarrow Table."""
    if (path / "dataset_dict.json").is_file() or (path / "state.json").is_file():
        try:
            import datasets
        except ImportError:
            raise DatasetError(f"{spec}: reading a save_to_disk folder needs the hf extra: {EXTRA}.") from None
        try:
            loaded = datasets.load_from_disk(str(path))
        except Exception as err:  # datasets raises several types for a damaged folder
            raise DatasetError(f"{spec}: datasets.load_from_disk failed: {type(err).__name__}: {err}") from None
        parts = loaded if isinstance(loaded, datasets.DatasetDict) else {"train": loaded}
        # save_to_disk writes flat tables; a dataset with an indices mapping would need flatten_indices().
        return {name: (ds.flatten_indices() if getattr(ds, "_indices", None) is not None else ds).data.table
                for name, ds in parts.items()}
    files = sorted(path.rglob("*.parquet")) if path.is_dir() else []
    if not files:
        raise DatasetError(
            f"{spec}: {path} is not a saved dataset (no dataset_dict.json or state.json from save_to_disk) and holds "
            "no .parquet files."
        )
    try:
        import pyarrow as pa
        import pyarrow.parquet as pq
    except ImportError:
        raise DatasetError(f"{spec}: reading parquet files needs the hf extra: {EXTRA}.") from None
    by_split: dict[str, list] = {}
    for file in files:
        by_split.setdefault(file.name.split("-")[0].split(".")[0], []).append(file)
    try:
        return {name: pa.concat_tables([pq.read_table(f) for f in group]) for name, group in by_split.items()}
    except (pa.ArrowInvalid, OSError) as err:
        raise DatasetError(f"{spec}: cannot read the parquet files: {err}") from None


def _choose_splits(splits: dict[str, Any], split: str | None, spec: str) -> list[str]:
    if split is not None:
        if split not in splits:
            raise DatasetError(f"{spec}: no split {split!r}; the splits are {sorted(splits)}.")
        return [split]
    if "train" in splits and "test" in splits:
        return ["train", "test"]
    if len(splits) == 1:
        return list(splits)
    raise DatasetError(f"{spec}: several splits {sorted(splits)}; choose one with ?split=NAME.")


# ---------------------------------------------------------------------------- columns
def _named(columns: list[str], name: str | None, role: str, spec: str) -> str | None:
    if name is not None and name not in columns:
        raise DatasetError(f"{spec}: {role} column {name!r} is not in the dataset; columns are {columns}.")
    return name


def _label_column(columns: list[str], options: dict[str, str], spec: str) -> str | None:
    if "label" in options:
        return _named(columns, options["label"] or None, "label", spec)
    return next((c for c in DEFAULT_LABEL_COLUMNS if c in columns), None)


def _text_column(table, options: dict[str, str], used: tuple, spec: str) -> tuple[str, str, int]:
    """``(column, tokenizer directory, max_length)`` of a text dataset: a string column, the only feature."""
    import pyarrow as pa

    from pfl_cli.data.text import text_options

    column, tokenizer, max_length = text_options(options, spec)
    for other in ("image", "features"):
        if other in options:
            raise DatasetError(f"{spec}: with text={column} the text is the only feature; drop {other}=.")
    _named(table.column_names, column, "text", spec)
    if column in used:
        raise DatasetError(f"{spec}: the text column {column!r} is also the label or client column.")
    kind = table.schema.field(column).type
    if not (pa.types.is_string(kind) or pa.types.is_large_string(kind)):
        raise DatasetError(f"{spec}: text column {column!r} must hold strings; it is {kind}.")
    return column, tokenizer, max_length


def _is_image_type(arrow_type) -> bool:
    import pyarrow as pa

    return pa.types.is_struct(arrow_type) and {arrow_type.field(i).name for i in range(arrow_type.num_fields)} >= {"bytes"}


def _image_column(table, name: str | None, spec: str) -> str | None:
    if name is not None:
        _named(table.column_names, name, "image", spec)
        if not _is_image_type(table.schema.field(name).type):
            raise DatasetError(f"{spec}: image column {name!r} does not hold images (a struct of bytes/path); "
                               f"it is {table.schema.field(name).type}.")
        return name
    return next((f.name for f in table.schema if _is_image_type(f.type)), None)


def _images(cells: list[dict], name: str, spec: str) -> np.ndarray:
    """Decode image cells to one uint8 array (N, C, H, W); refuse mixed sizes, naming two rows."""
    try:
        from PIL import Image
    except ImportError:
        raise DatasetError(f"{spec}: image columns need Pillow: {EXTRA}.") from None
    arrays = []
    for row, cell in enumerate(cells):
        if cell is None or (cell.get("bytes") is None and cell.get("path") is None):
            raise DatasetError(f"{spec}: image column {name!r} is empty in row {row}.")
        source = io.BytesIO(cell["bytes"]) if cell.get("bytes") is not None else cell["path"]
        try:
            with Image.open(source) as im:
                a = np.asarray(im)
        except (OSError, ValueError) as err:
            raise DatasetError(f"{spec}: image column {name!r}, row {row}: cannot decode ({err}).") from None
        arrays.append(a[None] if a.ndim == 2 else np.moveaxis(a, -1, 0))  # (H, W) -> (1, H, W); (H, W, C) -> (C, H, W)
        if arrays[-1].shape != arrays[0].shape:
            raise DatasetError(
                f"{spec}: image column {name!r} has mixed sizes: row 0 is {_hw(arrays[0])}, row {row} is {_hw(arrays[-1])}; "
                "resize them to one size first."
            )
    return np.stack(arrays).astype(np.uint8, copy=False)


def _hw(a: np.ndarray) -> str:
    return f"{a.shape[0]}x{a.shape[1]}x{a.shape[2]} (channels x height x width)"


def _feature_columns(columns: list[str], used: set, wanted: str | None, spec: str) -> list[str]:
    if wanted:
        names = [c.strip() for c in wanted.split(",") if c.strip()]
        for c in names:
            _named(columns, c, "feature", spec)
        return names
    names = [c for c in columns if c not in used]
    if not names:
        raise DatasetError(f"{spec}: no feature columns left after the label and client columns; columns are {columns}.")
    return names


def _features(table, names: list[str], spec: str) -> np.ndarray:
    """Numeric scalar or fixed-length list columns, side by side as float64 (n, total width)."""
    blocks = []
    for name in names:
        values = table.column(name).to_pylist()
        try:
            block = np.asarray(values, dtype=np.float64)
        except (TypeError, ValueError):
            raise DatasetError(
                f"{spec}: feature column {name!r} must be numeric (numbers or equal-length lists of numbers); "
                f"got {str(values[0])[:40]!r}. Name the features to use with ?features=A,B, or image=COL for images."
            ) from None
        blocks.append(block.reshape(len(values), -1))
    return np.concatenate(blocks, axis=1)


def _class_names(table, label_col: str | None) -> list[str] | None:
    """ClassLabel names from the Hugging Face features stored in the arrow schema metadata."""
    meta = (table.schema.metadata or {}).get(b"huggingface")
    if label_col is None or meta is None:
        return None
    try:
        feature = json.loads(meta)["info"]["features"][label_col]
    except (KeyError, TypeError, ValueError):
        return None
    return list(feature["names"]) if isinstance(feature, dict) and feature.get("_type") == "ClassLabel" else None
