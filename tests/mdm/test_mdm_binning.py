"""Binning a continuous feature into MDM categories (specs/mdm.md §8 item 19)."""

import numpy as np
import pytest

from pfl_cli.errors import InputError
from pfl_cli.mdm.binning import bin_values, counts_from_values, parse_bins


def test_income_bins_of_the_thesis():
    edges = parse_bins("5000:41")
    assert len(edges) == 41
    got = bin_values(np.array([0, 4999, 5000, 199999, 200000, 1423000]), edges)
    assert got.tolist() == [0, 0, 1, 39, 40, 40]


def test_counts_from_values_per_client():
    counts, ids = counts_from_values(np.array([7, 3, 7, 7]), np.array([1.0, 12.0, 10.0, 30.0]), parse_bins("0,10,20"))
    assert ids.tolist() == [3, 7]
    assert counts.tolist() == [[0, 1, 0], [1, 1, 1]]


@pytest.mark.parametrize("spec", ["5000:x", "0:3", "-1:3", "a,b", "3,2,1", ""])
def test_bad_bin_specs(spec):
    with pytest.raises(InputError, match="bins must be"):
        parse_bins(spec)


def test_values_below_the_first_edge_are_refused():
    with pytest.raises(InputError, match="must be >= the first bin edge"):
        bin_values(np.array([-1.0]), parse_bins("5000:41"))
