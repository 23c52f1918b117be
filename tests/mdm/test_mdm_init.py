"""Algorithm 5 and the moment-matching identity (specs/mdm.md §8 items 4-5)."""

import numpy as np
import pytest

from pfl_cli.mdm.init import InitStatistics, init_client_sums, init_from_sums, moment_match
from pfl_cli.mdm.model import integer_size_edges

MEDIUM_1 = np.array([0.1, 0.2, 0.6, 1.0, 2.0, 0.1, 1.0, 2.0, 0.5, 0.5])


@pytest.mark.parametrize("category", ["argmax", "first"])
def test_exact_dirichlet_moments_return_alpha_exactly(category):
    a0 = MEDIUM_1.sum()
    mean = MEDIUM_1 / a0
    second = MEDIUM_1 * (1 + MEDIUM_1) / (a0 * (1 + a0))          # Eq. (A.2)
    sums = InitStatistics(e=np.array([[10.0]]), p=10 * mean[None, :], q=10 * second[None, :])
    alpha = init_from_sums(sums, np.array([1, 2]), moment_category=category).alpha[0]
    assert np.max(np.abs(alpha - MEDIUM_1) / MEDIUM_1) < 1e-12


def test_direct_dirichlet_draws_recover_alpha_within_3_percent():
    p = np.random.default_rng(0).dirichlet(MEDIUM_1, size=200_000)
    for category in ("argmax", "first"):
        alpha = moment_match(p, moment_category=category)
        assert np.linalg.norm(alpha - MEDIUM_1) / np.linalg.norm(MEDIUM_1) < 0.03


def test_init_with_small_clients_is_biased_low_and_valid():
    rng = np.random.default_rng(1)
    alpha = np.array([4.0, 2.0, 2.0])
    counts = rng.multinomial(20, rng.dirichlet(alpha, size=5000))
    edges = integer_size_edges(20)
    sums = init_client_sums(counts, np.full(5000, 19), 1, 20, rng)
    init = init_from_sums(sums, edges)
    ratio = init.alpha.sum() / alpha.sum()
    assert 0.5 < ratio < 0.85                               # multinomial noise inflates the variance
    assert init.size_probs[0, 19] == 1.0 and init.tau.tolist() == [1.0]


def test_init_guards_degenerate_components():
    # Every client identical: zero variance; a category never seen: alpha would be 0.
    counts = np.tile([[5, 5, 0]], (10, 1))
    sums = init_client_sums(counts, np.full(10, 9), 3, 10, np.random.default_rng(0))
    init = init_from_sums(sums, integer_size_edges(10))
    assert np.all(np.isfinite(init.alpha)) and np.all(init.alpha > 0)
    assert np.all(sums.e.sum(axis=1) >= 1)                  # no empty component
