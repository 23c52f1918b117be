"""The empirical privacy audit: the tester against references, every release mechanism, a broken one.

Fast tier: the tester's statistics, every pflx release smoke-audited with few trials, and
the broken mechanism caught. Slow tier (-m slow): every release with the full trial count.
"""

import numpy as np
import pytest
from scipy import stats

from pfl_cli.privacy import audit_cases as cases
from pfl_cli.privacy.audit import clopper_pearson, epsilon_lower_bound


@pytest.mark.parametrize("k, n", [(0, 50), (1, 50), (17, 50), (50, 50), (3, 100_000)])
def test_clopper_pearson_matches_scipy_exact_interval(k, n):
    lo, hi = clopper_pearson(np.array([k]), n, 0.02)
    ref = stats.binomtest(k, n).proportion_ci(confidence_level=0.98, method="exact")
    assert lo[0] == pytest.approx(ref.low, abs=1e-12) and hi[0] == pytest.approx(ref.high, abs=1e-12)


def test_lower_bound_is_near_zero_for_identical_inputs_and_tight_for_laplace():
    rng = np.random.default_rng(0)
    same, _ = epsilon_lower_bound(rng.normal(size=100_000), rng.normal(size=100_000), delta=1e-5)
    assert same < 0.1
    # Laplace(0, 1) vs Laplace(1, 1) is exactly (1, 0)-DP and the event {s > 1} attains it.
    lb, t = epsilon_lower_bound(rng.laplace(0, 1, 400_000), rng.laplace(1, 1, 400_000), delta=0.0)
    assert 0.85 < lb <= 1.0


def test_lower_bound_never_exceeds_the_truth_over_many_seeds():
    """At confidence 0.95 the bound exceeds the true epsilon in about <= 5% of runs (here: Laplace, eps 1)."""
    over = sum(epsilon_lower_bound(r.laplace(0, 1, 20_000), r.laplace(1, 1, 20_000), delta=0.0)[0] > 1.0
               for r in (np.random.default_rng(s) for s in range(40)))
    assert over <= 4


@pytest.mark.parametrize("name", sorted(cases.CASES))
def test_every_release_mechanism_passes_a_small_audit(name):
    result = cases.CASES[name](cases.trials_for(name, cases.FAST_TRIALS), np.random.default_rng(7))
    assert result.passed, result.row()
    assert result.epsilon_lower_bound >= 0 and result.claimed_epsilon > 0


def test_the_audit_catches_noise_calibrated_for_half_the_sensitivity():
    broken = cases.broken_gaussian_sum(cases.FAST_TRIALS["batched"], np.random.default_rng(7))
    honest = cases.gaussian_sum(cases.FAST_TRIALS["batched"], np.random.default_rng(7))
    assert not broken.passed and broken.epsilon_lower_bound > 1.2 * broken.claimed_epsilon, broken.row()
    assert honest.passed and honest.claimed_epsilon == broken.claimed_epsilon


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(cases.CASES))
def test_every_release_mechanism_passes_the_full_audit(name):
    result = cases.CASES[name](cases.trials_for(name, cases.SLOW_TRIALS), np.random.default_rng(11))
    assert result.passed, result.row()


@pytest.mark.slow
@pytest.mark.parametrize("epsilon", [0.5, 1.0, 2.0])
def test_the_full_audit_catches_the_broken_mechanism_at_every_epsilon(epsilon):
    broken = cases.broken_gaussian_sum(cases.SLOW_TRIALS["batched"], np.random.default_rng(11), epsilon=epsilon)
    assert not broken.passed, broken.row()
