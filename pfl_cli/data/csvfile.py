"""``csv:PATH?label=COL&client=COL&labeled=COL&num_classes=K``: one sample per row, a header row first.

Text: ``text=COL&tokenizer=DIR[&max_length=L]`` reads column COL as text, tokenized with the transformers
tokenizer in DIR (:mod:`pfl_cli.data.text`; L = 64 by default) into L token ids per row, the only features.

Columns
-------
- the label column: ``label=COL``; by default ``label`` if the header has it, else ``y``,
  else the data is unlabelled (``label=`` with an empty value forces unlabelled).
  Labels must be non-negative integers (``3`` and ``3.0`` are both accepted); an empty cell
  or ``-1`` is an unknown label.
- the labeled column: ``labeled=COL``; by default ``labeled`` if the header has it. 1 (or
  true) marks a row whose label training may read, 0 (or false) an unlabeled row; the label
  cell of an unlabeled row, when filled, is a hidden label only an evaluator asked for it
  reads (``predict --evaluate-hidden-labels``).
- the client column, only when ``client=COL`` is given: natural client ids, kept as str.
- every other column is a numeric feature, parsed to float64 (lossless for decimal text).

Sample order is the row order of the file; there is a single pool.
"""

from __future__ import annotations

import csv
import io
from pathlib import Path

import numpy as np

from pfl_cli.data.base import Dataset, check_options, labels_from_array, option_num_classes
from pfl_cli.errors import DatasetError
from pfl_cli.formats import read_utf8

OPTIONS = ("label", "client", "labeled", "num_classes", "text", "tokenizer", "max_length")
DEFAULT_LABEL_COLUMNS = ("label", "y")
DEFAULT_LABELED_COLUMN = "labeled"
FLAG_VALUES = {"1": True, "0": False, "true": True, "false": False}


def load(arg: str, options: dict[str, str], spec: str) -> Dataset:
    """Load a CSV file with a header row.

    Parameters
    ----------
    arg : str
        Path of the CSV file.
    options : dict of str to str
        ``label``, ``client`` (column names) and ``num_classes``.
    spec : str
        The full spec, for messages and ``Dataset.spec``.

    Returns
    -------
    Dataset
        x float64 (n_rows, n_features), y int64 or None, client str or None, no pools.

    Raises
    ------
    DatasetError
        Missing file, no header, ragged rows, unknown columns or options, non-numeric
        features, non-integer labels.
    """
    check_options(spec, options, OPTIONS)
    header, rows = _read_rows(Path(arg), spec)
    label_col = _label_column(header, options, spec)
    client_col = _named_column(header, options.get("client"), "client", spec)
    if client_col is not None and client_col == label_col:
        raise DatasetError(f"{spec}: the label and client columns must differ; both are {client_col!r}.")
    labeled_col = _named_column(header, options.get("labeled"), "labeled", spec) if "labeled" in options else (
        DEFAULT_LABELED_COLUMN if DEFAULT_LABELED_COLUMN in header else None)
    if labeled_col is not None and labeled_col in (label_col, client_col):
        raise DatasetError(f"{spec}: the labeled column must differ from the label and client columns; "
                           f"got {labeled_col!r}.")
    if labeled_col is not None and label_col is None:
        raise DatasetError(f"{spec}: a labeled column ({labeled_col!r}) needs a label column; name it with label=COL.")
    columns = list(zip(*rows))
    if "text" in options or "tokenizer" in options:
        return _text_dataset(spec, options, header, columns, label_col, client_col, labeled_col)
    features = [i for i, name in enumerate(header) if name not in (label_col, client_col, labeled_col)]
    if not features:
        raise DatasetError(f"{spec}: no feature columns left after the label and client columns; header is {header}.")
    x = np.stack([_numeric_column(columns[i], header[i], spec) for i in features], axis=1)
    y = None if label_col is None else _labels(columns[header.index(label_col)], label_col, spec)
    client = None if client_col is None else np.asarray(columns[header.index(client_col)], dtype=str)
    labeled = None if labeled_col is None else _flags(columns[header.index(labeled_col)], labeled_col, spec)
    num_classes = option_num_classes(spec, options)
    if num_classes is None:
        num_classes = int(y.max()) + 1 if y is not None and y.max() >= 0 else 0
    return Dataset(
        spec=spec,
        x=x,
        y=y,
        num_classes=num_classes,
        client=client,
        extra={"feature_names": [header[i] for i in features]},
        labeled=labeled,
    )


def _text_dataset(spec, options, header, columns, label_col, client_col, labeled_col) -> Dataset:
    """A text column tokenized with a checkpoint's tokenizer: token ids (n, max_length), the only features."""
    from pfl_cli.data.text import text_options, tokenize

    text, tokenizer, max_length = text_options(options, spec)
    text_col = _named_column(header, text, "text", spec)
    others = [n for n in header if n not in (text_col, label_col, client_col, labeled_col)]
    if others:
        raise DatasetError(f"{spec}: with text={text_col} the text is the only feature; got other columns {others} "
                           "(name them with label=, client= or labeled=, or drop them).")
    x, extra = tokenize(columns[header.index(text_col)], tokenizer, max_length, spec)
    y = None if label_col is None else _labels(columns[header.index(label_col)], label_col, spec)
    num_classes = option_num_classes(spec, options)
    if num_classes is None:
        num_classes = int(y.max()) + 1 if y is not None and y.max() >= 0 else 0
    return Dataset(spec=spec, x=x, y=y, num_classes=num_classes,
                   client=None if client_col is None else np.asarray(columns[header.index(client_col)], dtype=str),
                   extra=extra,
                   labeled=None if labeled_col is None else _flags(columns[header.index(labeled_col)], labeled_col,
                                                                   spec))


def _flags(cells: tuple[str, ...], name: str, spec: str) -> np.ndarray:
    """The labeled column as bool: 1/0 or true/false."""
    values = [FLAG_VALUES.get(c.strip().lower()) for c in cells]
    if None in values:
        lineno = values.index(None) + 2
        raise DatasetError(f"{spec}: labeled column {name!r} must hold 1 or 0 (true or false); got "
                           f"{cells[lineno - 2]!r} in row {lineno}.")
    return np.asarray(values, dtype=bool)


def _read_rows(path: Path, spec: str) -> tuple[list[str], list[list[str]]]:
    """Header and data rows; every row must have as many cells as the header."""
    if not path.is_file():
        raise DatasetError(f"{spec}: no such file {path}; give the path of a CSV file with a header row.")
    # read_utf8 drops the byte-order mark spreadsheet exports put before the first column name.
    reader = csv.reader(io.StringIO(read_utf8(path, spec, DatasetError), newline=""))
    header = next(reader, None)
    if not header:
        raise DatasetError(f"{spec}: the file is empty; a header row naming the columns is required.")
    header = [name.strip() for name in header]
    rows = [row for row in reader if row]
    duplicates = sorted({name for name in header if header.count(name) > 1})
    if duplicates:
        raise DatasetError(f"{spec}: column names must be unique; got duplicates {duplicates}.")
    for lineno, row in enumerate(rows, start=2):
        if len(row) != len(header):
            raise DatasetError(
                f"{spec}: every row must have {len(header)} cells like the header; row {lineno} has {len(row)}."
            )
    if not rows:
        raise DatasetError(f"{spec}: no data rows after the header.")
    return header, rows


def _label_column(header: list[str], options: dict[str, str], spec: str) -> str | None:
    """The label column: the option if given (empty means none), else the first default present."""
    if "label" in options:
        return _named_column(header, options["label"] or None, "label", spec)
    return next((name for name in DEFAULT_LABEL_COLUMNS if name in header), None)


def _named_column(header: list[str], name: str | None, role: str, spec: str) -> str | None:
    """Check that a column named in an option exists."""
    if name is not None and name not in header:
        raise DatasetError(f"{spec}: {role} column {name!r} is not in the header; columns are {header}.")
    return name


def _numeric_column(cells: tuple[str, ...], name: str, spec: str) -> np.ndarray:
    """A feature column as float64; name the column and row of the first non-number."""
    try:
        return np.asarray(cells, dtype=np.float64)
    except ValueError:
        pass
    # Only on failure: find the offending cell for the message (row 1 is the header).
    lineno, cell = next((i, c) for i, c in enumerate(cells, start=2) if not _is_number(c))
    raise DatasetError(
        f"{spec}: feature column {name!r} must be numeric; got {cell!r} in row {lineno}. "
        f"Encode it as numbers, or name it with label= or client=."
    )


def _labels(cells: tuple[str, ...], name: str, spec: str) -> np.ndarray:
    """Label column as int64; integral floats such as ``3.0`` are accepted, an empty cell is -1 (unknown)."""
    cells = tuple("-1" if not c.strip() else c for c in cells)
    try:
        return np.asarray(cells, dtype=np.int64)
    except (ValueError, OverflowError):
        pass
    try:
        values = np.asarray(cells, dtype=np.float64)
    except ValueError:
        bad = next(c for c in cells if not _is_number(c))
        raise DatasetError(
            f"{spec}: label column {name!r} must hold non-negative integers; got {bad!r}. "
            f"Map class names to 0..K-1 first."
        ) from None
    return labels_from_array(values, f"{spec}: label column {name!r}")


def _is_number(cell: str) -> bool:
    """Whether ``float`` parses the cell, as numpy's string conversion does."""
    try:
        float(cell)
    except ValueError:
        return False
    return True
