"""Spec parsing, the scheme registry and builtin:digits."""

from __future__ import annotations

import numpy as np
import pytest

from pfl_cli.data import SCHEMES, load_dataset, parse_spec
from pfl_cli.errors import DatasetError


def test_builtin_digits_matches_sklearn():
    from sklearn.datasets import load_digits

    ds = load_dataset("builtin:digits")
    assert ds.num_samples == 1797 and ds.num_classes == 10 and ds.input_shape == (64,)
    assert int(ds.y[0]) == int(load_digits().target[0])
    assert ds.y.dtype == np.int64 and ds.pool is None and ds.client is None


def test_every_published_layout_is_registered():
    for scheme in ("builtin", "npz", "csv", "cifar10", "cifar100", "mnist", "fashion-mnist", "emnist", "cinic10",
                   "omniglot", "leaf"):
        assert scheme in SCHEMES


def test_parse_spec_splits_options():
    assert parse_spec("CSV:/d/x.csv?label=cls&client=u") == ("csv", "/d/x.csv", {"label": "cls", "client": "u"})


def test_unknown_scheme_lists_the_known_ones():
    with pytest.raises(DatasetError, match=r"unknown dataset scheme 'imagenet'.*known: .*cifar10.*fashion-mnist.*leaf"):
        load_dataset("imagenet:/data")
