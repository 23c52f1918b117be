"""Spec parsing and the scheme -> loader registry."""

from __future__ import annotations

from typing import Callable
from urllib.parse import parse_qsl

from pfl_cli.data.base import Dataset, validate_dataset
from pfl_cli.errors import DatasetError

Loader = Callable[[str, dict[str, str], str], Dataset]


def parse_spec(spec: str) -> tuple[str, str, dict[str, str]]:
    """Split ``SCHEME:ARG?k=v&k2=v2`` into ``(scheme, arg, options)``."""
    if not isinstance(spec, str) or ":" not in spec:
        raise DatasetError(
            f"dataset spec must look like SCHEME:ARG (e.g. builtin:digits, npz:data.npz); got {spec!r}. "
            f"Known schemes: {', '.join(sorted(SCHEMES))}."
        )
    scheme, rest = spec.split(":", 1)
    arg, _, query = rest.partition("?")
    options = dict(parse_qsl(query, keep_blank_values=True)) if query else {}
    return scheme.strip().lower(), arg, options


def _lazy(module: str, function: str) -> Loader:
    """A loader that imports ``pfl_cli.data.<module>`` on first use (keeps `pflx -h` fast)."""

    def load(arg: str, options: dict[str, str], spec: str) -> Dataset:
        from importlib import import_module

        return getattr(import_module(f"pfl_cli.data.{module}"), function)(arg, options, spec)

    return load


SCHEMES: dict[str, Loader] = {
    "builtin": _lazy("builtin", "load"),
    "npz": _lazy("npz", "load"),
    "csv": _lazy("csvfile", "load"),
    "cifar10": _lazy("cifar", "load_cifar10"),
    "cifar100": _lazy("cifar", "load_cifar100"),
    "mnist": _lazy("mnist", "load_mnist"),
    "fashion-mnist": _lazy("mnist", "load_fashion_mnist"),
    "emnist": _lazy("emnist", "load"),
    "cinic10": _lazy("cinic", "load"),
    "omniglot": _lazy("omniglot", "load"),
    "leaf": _lazy("leaf", "load"),
    "gmm": _lazy("synthetic", "load"),
    "ring": _lazy("ring", "load"),
    "hf": _lazy("hf", "load"),
}


def load_dataset(spec: str) -> Dataset:
    """Load and validate the dataset named by ``spec``.

    Parameters
    ----------
    spec : str
        ``builtin:digits``, ``npz:PATH``, ``csv:PATH?label=COL&client=COL``,
        ``cifar10:DIR``, ``cifar100:DIR``, ``mnist:DIR``, ``fashion-mnist:DIR``,
        ``emnist:DIR?split=S``, ``cinic10:DIR``, ``omniglot:DIR``,
        ``leaf:DIR``, ``hf:DIR?split=..&label=..&client=..&image=..`` and the synthetic generators.

    Raises
    ------
    DatasetError
        Unknown scheme, missing or corrupt file, labels that are not non-negative
        integers, NaN features.
    """
    scheme, arg, options = parse_spec(spec)
    loader = SCHEMES.get(scheme)
    if loader is None:
        raise DatasetError(f"unknown dataset scheme {scheme!r} in {spec!r}; known: {', '.join(sorted(SCHEMES))}.")
    return validate_dataset(loader(arg, options, spec))
