"""Continuous-feature skew (Flower's ``ContinuousPartitioner``): ``--continuous COL --strictness S``.

Each sample gets the score b = S * z + (1 - S) * e, with z the column standardized over the
train pool and e ~ N(0, 1); samples are sorted by b and cut into J contiguous blocks whose sizes
differ by at most one. S = 0 is IID, S = 1 sorts the clients by the feature.
"""

from __future__ import annotations

import numpy as np

from pfl_cli.errors import ConfigError


def check_strictness(strictness) -> float:
    if isinstance(strictness, bool) or not isinstance(strictness, (int, float)) or not 0 <= strictness <= 1:
        raise ConfigError(f"strictness must be a number in [0, 1] (0 = IID, 1 = sorted by the column); got {strictness!r}.")
    return float(strictness)


def feature_column(x: np.ndarray, column, feature_names: list[str] | None, spec: str) -> np.ndarray:
    """The values of ``--continuous COL``: a feature name (csv, hf) or an index into the flattened features."""
    flat = x.reshape(len(x), -1)
    names = list(feature_names or [])
    if isinstance(column, str) and column in names:
        j = names.index(column)
    else:
        try:
            j = int(column)
        except (TypeError, ValueError):
            known = f"one of {names}" if names else f"an index in [0, {flat.shape[1]})"
            raise ConfigError(f"continuous column {column!r} is not a feature of {spec}; give {known}.") from None
        if not 0 <= j < flat.shape[1]:
            raise ConfigError(f"continuous column index must be in [0, {flat.shape[1]}) for {spec}; got {j}.")
    return np.asarray(flat[:, j], dtype=np.float64)


def continuous_owners(values: np.ndarray, *, num_clients: int, strictness: float,
                      rng: np.random.Generator) -> tuple[np.ndarray, dict]:
    """Owner of each sample under continuous-feature skew (see the module docstring)."""
    std = float(np.std(values))
    if not std > 0:
        raise ConfigError("continuous column is constant over the train pool; it cannot order the clients.")
    z = (values - values.mean()) / std
    score = strictness * z + (1.0 - strictness) * rng.standard_normal(len(values))
    order = np.argsort(score, kind="stable")
    owner = np.empty(len(values), dtype=np.int64)
    # np.array_split's block sizes: the first n % J blocks get one more sample.
    sizes = np.full(num_clients, len(values) // num_clients)
    sizes[: len(values) % num_clients] += 1
    owner[order] = np.repeat(np.arange(num_clients), sizes)
    return owner, {"strictness": strictness}
