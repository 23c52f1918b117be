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


def _builtin(arg: str, options: dict[str, str], spec: str) -> Dataset:
    from pfl_cli.data import builtin

    return builtin.load(arg, options, spec)


def _npz(arg: str, options: dict[str, str], spec: str) -> Dataset:
    from pfl_cli.data import npz

    return npz.load(arg, options, spec)


def _csv(arg: str, options: dict[str, str], spec: str) -> Dataset:
    from pfl_cli.data import csvfile

    return csvfile.load(arg, options, spec)


def _cifar10(arg: str, options: dict[str, str], spec: str) -> Dataset:
    from pfl_cli.data import cifar

    return cifar.load_cifar10(arg, options, spec)


def _cifar100(arg: str, options: dict[str, str], spec: str) -> Dataset:
    from pfl_cli.data import cifar

    return cifar.load_cifar100(arg, options, spec)


def _mnist(arg: str, options: dict[str, str], spec: str) -> Dataset:
    from pfl_cli.data import mnist

    return mnist.load_mnist(arg, options, spec)


def _fashion_mnist(arg: str, options: dict[str, str], spec: str) -> Dataset:
    from pfl_cli.data import mnist

    return mnist.load_fashion_mnist(arg, options, spec)


def _leaf(arg: str, options: dict[str, str], spec: str) -> Dataset:
    from pfl_cli.data import leaf

    return leaf.load(arg, options, spec)


def _gmm(arg: str, options: dict[str, str], spec: str) -> Dataset:
    from pfl_cli.data import synthetic

    return synthetic.load(arg, options, spec)


SCHEMES: dict[str, Loader] = {
    "builtin": _builtin,
    "npz": _npz,
    "csv": _csv,
    "cifar10": _cifar10,
    "cifar100": _cifar100,
    "mnist": _mnist,
    "fashion-mnist": _fashion_mnist,
    "leaf": _leaf,
    "gmm": _gmm,
}


def load_dataset(spec: str) -> Dataset:
    """Load and validate the dataset named by ``spec``.

    Parameters
    ----------
    spec : str
        ``builtin:digits``, ``npz:PATH``, ``csv:PATH?label=COL&client=COL``,
        ``cifar10:DIR``, ``cifar100:DIR``, ``mnist:DIR``, ``fashion-mnist:DIR``,
        ``leaf:DIR`` and the synthetic generators.

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
