"""The sampler's moments match tau, alpha and the size distribution (specs/mdm.md §8 item 16)."""

import numpy as np
import pytest

from pfl_cli.mdm import MDMParams, sample_clients
from pfl_cli.mdm.model import binned_size_edges
from pfl_cli.mdm.sample import dirichlet_rows

ALPHA = np.array([[0.1, 0.2, 0.6, 1.0, 2.0], [2.5, 2.6, 2.7, 2.8, 3.0], [5.0, 0.05, 0.05, 1.0, 1.0]])
TAU = np.array([0.2, 0.5, 0.3])


@pytest.fixture(scope="module")
def drawn():
    rng = np.random.default_rng(0)
    probs = rng.dirichlet(np.ones(30), size=3)
    params = MDMParams(TAU, ALPHA, probs, np.arange(1, 32))
    return params, sample_clients(params, 100_000, rng=np.random.default_rng(1))


def test_component_frequencies_match_tau(drawn):
    _, s = drawn
    assert np.max(np.abs(np.bincount(s.component, minlength=3) / len(s.component) - TAU)) < 0.01


def test_mean_proportions_match_alpha(drawn):
    _, s = drawn
    for k in range(3):
        share = s.counts[s.component == k] / s.sizes[s.component == k, None]
        assert np.max(np.abs(share.mean(axis=0) - ALPHA[k] / ALPHA[k].sum())) < 0.01


def test_sizes_follow_pi(drawn):
    params, s = drawn
    assert s.counts.sum(axis=1).tolist() == s.sizes.tolist()
    for k in range(3):
        freq = np.bincount(s.sizes[s.component == k] - 1, minlength=30) / np.sum(s.component == k)
        assert 0.5 * np.abs(freq - params.size_probs[k]).sum() < 0.02


def test_binned_sizes_stay_in_their_bins():
    params = MDMParams(np.array([1.0]), np.ones((1, 2)), np.array([[0.0, 1.0, 0.0]]), binned_size_edges(30, 3))
    sizes = sample_clients(params, 2000, rng=np.random.default_rng(2)).sizes
    lo, hi = params.size_edges[1], params.size_edges[2]
    assert sizes.min() >= lo and sizes.max() < hi and len(np.unique(sizes)) == hi - lo


def test_dirichlet_rows_are_stable_for_tiny_alpha():
    p = dirichlet_rows(np.full((1000, 4), 1e-4), np.random.default_rng(3))
    assert np.all(np.isfinite(p)) and np.allclose(p.sum(axis=1), 1.0)


def test_same_rng_same_clients():
    params = MDMParams(TAU, ALPHA, np.ones((3, 1)), np.array([10, 11]))
    a = sample_clients(params, 50, rng=np.random.default_rng(4)).counts
    b = sample_clients(params, 50, rng=np.random.default_rng(4)).counts
    assert np.array_equal(a, b)
