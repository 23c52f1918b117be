"""DM / MDM pmf and log-likelihood (specs/mdm.md §8 items 1-3)."""

import itertools

import numpy as np
import pytest

from pfl_cli.mdm import MDMParams, dm_log_pmf, log_likelihood
from pfl_cli.mdm.model import binned_size_edges, integer_size_edges, params_from_dict, params_to_dict


def compositions(total, parts):
    for cut in itertools.combinations(range(total + parts - 1), parts - 1):
        bars = (-1, *cut, total + parts - 1)
        yield [bars[i + 1] - bars[i] - 1 for i in range(parts)]


def test_dm_pmf_normalizes_over_all_histograms():
    alpha = np.random.default_rng(0).uniform(0.2, 3.0, size=3)
    counts = np.array(list(compositions(5, 3)))
    assert np.exp(dm_log_pmf(counts, alpha)).sum() == pytest.approx(1.0, abs=1e-12)


def test_dm_pmf_matches_monte_carlo():
    rng = np.random.default_rng(1)
    alpha = np.array([0.3, 1.7, 4.0])
    p = rng.dirichlet(alpha, size=200_000)
    draws = rng.multinomial(5, p)
    keys, freq = np.unique(draws, axis=0, return_counts=True)
    assert np.max(np.abs(freq / len(draws) - np.exp(dm_log_pmf(keys, alpha)))) < 1e-2


@pytest.mark.parametrize("edges", [integer_size_edges(4), binned_size_edges(4, 2)], ids=["integer", "binned"])
def test_mdm_pmf_normalizes_over_counts_and_sizes(edges):
    rng = np.random.default_rng(2)
    s = len(edges) - 1
    params = MDMParams(np.array([0.3, 0.7]), rng.uniform(0.3, 2.0, size=(2, 3)), rng.dirichlet(np.ones(s), size=2), edges)
    counts = np.array([c for m in range(1, 5) for c in compositions(m, 3)])
    total = np.exp(log_likelihood(counts, params, per_client=True)).sum()
    assert total == pytest.approx(1.0, abs=1e-12)


def test_log_pmf_is_finite_for_huge_counts_and_extreme_alpha():
    counts = np.array([[100_000, 0, 0], [1, 99_998, 1]])
    for alpha in ([1e-3, 1e-3, 1e-3], [1e3, 1e3, 1e3], [1e-3, 1e3, 1.0]):
        assert np.all(np.isfinite(dm_log_pmf(counts, np.array(alpha))))


def test_params_validate_and_round_trip_through_json():
    params = MDMParams(np.array([0.4, 0.6]), np.ones((2, 3)), np.full((2, 5), 0.2), integer_size_edges(5))
    again = params_from_dict(params_to_dict(params))
    assert np.array_equal(again.alpha, params.alpha) and np.array_equal(again.size_edges, params.size_edges)
    with pytest.raises(ValueError, match="alpha must be finite and > 0"):
        MDMParams(np.array([1.0]), np.array([[0.0, 1.0]]), np.ones((1, 1)), np.array([1, 2]))
    with pytest.raises(ValueError, match="tau must be a distribution"):
        MDMParams(np.array([0.5]), np.array([[1.0, 1.0]]), np.ones((1, 1)), np.array([1, 2]))
    with pytest.raises(ValueError, match="not an MDM document"):
        params_from_dict({"tau": [1.0]})
