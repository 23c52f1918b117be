"""Datasets from specs of the form ``SCHEME:ARG[?key=value&...]`` (DESIGN.md section 4).

>>> ds = load_dataset("builtin:digits")
>>> ds.num_samples, ds.num_classes, ds.input_shape
(1797, 10, (64,))
"""

from __future__ import annotations

from pfl_cli.data.base import POOL_TEST, POOL_TRAIN, Dataset, validate_dataset
from pfl_cli.data.registry import SCHEMES, load_dataset, parse_spec

__all__ = ["Dataset", "POOL_TEST", "POOL_TRAIN", "SCHEMES", "load_dataset", "parse_spec", "validate_dataset"]
