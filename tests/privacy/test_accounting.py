"""Accounting against dp_accounting called directly; calibration never above its target."""

from __future__ import annotations

import dp_accounting as dpa
import pytest
from dp_accounting import pld, rdp

from pfl_cli.errors import InputError, PrivacyBudgetError
from pfl_cli.privacy import (
    cache_clear,
    cache_info,
    calibrate_noise,
    compute_epsilon,
    laplace_event,
    max_steps,
    sampled_gaussian_event,
)


def _direct(event, delta, accountant="rdp", relation=dpa.NeighboringRelation.ADD_OR_REMOVE_ONE):
    acc = rdp.RdpAccountant(neighboring_relation=relation) if accountant == "rdp" else pld.PLDAccountant(relation)
    return acc.compose(event).get_epsilon(delta)


# (q, z, T, delta): a grid over the regimes DP training and the DP stages use.
GRID = [
    (0.01, 1.1, 1000, 1e-5),
    (0.001, 0.8, 10000, 1e-6),
    (0.05, 2.0, 200, 1e-7),
    (0.2, 0.7, 50, 1e-5),
    (1.0, 3.0, 10, 1e-6),
    (0.003, 1.5, 3000, 1e-8),
]


@pytest.mark.parametrize("q, z, steps, delta", GRID)
def test_rdp_equals_dp_accounting(q, z, steps, delta):
    event = dpa.SelfComposedDpEvent(dpa.PoissonSampledDpEvent(q, dpa.GaussianDpEvent(z)), steps)
    assert compute_epsilon(event, delta, accountant="rdp") == pytest.approx(_direct(event, delta), rel=1e-12)


@pytest.mark.parametrize("q, z, steps, delta", [GRID[0]])
def test_pld_equals_dp_accounting(q, z, steps, delta):
    event = sampled_gaussian_event(z, q, steps)
    assert compute_epsilon(event, delta, accountant="pld") == pytest.approx(_direct(event, delta, "pld"), rel=1e-12)


@pytest.mark.parametrize(
    "q, z, steps, delta, eps_rdp",
    [(0.01, 1.1, 1000, 1e-5, 1.7118), (256 / 60000, 1.1, 14062, 1e-5, 2.5966), (0.001, 0.8, 10000, 1e-6, 1.7036)],
)
def test_golden_values_anchors_8_5(q, z, steps, delta, eps_rdp):
    assert compute_epsilon(sampled_gaussian_event(z, q, steps), delta) == pytest.approx(eps_rdp, abs=1e-3)


def test_golden_pld_value():
    assert compute_epsilon(sampled_gaussian_event(1.1, 0.01, 1000), 1e-5, accountant="pld") == pytest.approx(
        1.5154, abs=1e-3
    )


@pytest.mark.parametrize("sigma, delta", [(1.0, 1e-5), (4.0, 1e-6)])
def test_one_gaussian_release_is_the_analytic_gaussian(sigma, delta):
    # Closed form (Balle & Wang): PLD is exact for one Gaussian release; RDP is an upper bound.
    exact = dpa.get_epsilon_gaussian(sigma, delta)
    event = dpa.GaussianDpEvent(sigma)
    assert compute_epsilon(event, delta, accountant="pld") == pytest.approx(exact, abs=2e-3)
    assert compute_epsilon(event, delta, accountant="rdp") >= exact


@pytest.mark.parametrize("scale", [0.5, 2.0])
def test_one_laplace_release_is_sensitivity_over_scale(scale):
    # Laplace with scale b and L1 sensitivity 1 is (1/b, 0)-DP; at tiny delta PLD recovers 1/b.
    eps = compute_epsilon(laplace_event(scale), 1e-12, accountant="pld")
    assert eps == pytest.approx(1 / scale, abs=2e-3)
    assert compute_epsilon(laplace_event(scale), 1e-12, accountant="rdp") >= eps - 1e-3


def test_composition_identity():
    a = sampled_gaussian_event(1.1, 0.01, 300)
    b = dpa.SelfComposedDpEvent(dpa.LaplaceDpEvent(20.0), 4)
    together = compute_epsilon(dpa.ComposedDpEvent([a, b]), 1e-5)
    assert together == pytest.approx(_direct(dpa.ComposedDpEvent([a, b]), 1e-5), rel=1e-12)
    assert together > max(compute_epsilon(a, 1e-5), compute_epsilon(b, 1e-5))


@pytest.mark.parametrize("q, steps, target, delta", [(0.01, 1000, 1.0, 1e-5), (0.1, 100, 8.0, 1e-6), (1.0, 1, 0.5, 1e-6)])
def test_noise_calibration_round_trip_rdp(q, steps, target, delta):
    cal = calibrate_noise(lambda z: sampled_gaussian_event(z, q, steps), target, delta)
    again = compute_epsilon(sampled_gaussian_event(cal.noise_multiplier, q, steps), delta)
    assert again == cal.epsilon
    assert target * (1 - 1e-3) <= again <= target  # within tolerance, never above
    # ... and it is the smallest: a little less noise breaks the target.
    assert compute_epsilon(sampled_gaussian_event(cal.noise_multiplier * (1 - 1e-3), q, steps), delta) > target


def test_noise_calibration_golden_value():
    cal = calibrate_noise(lambda z: sampled_gaussian_event(z, 0.01, 1000), 1.0, 1e-5)
    assert cal.noise_multiplier == pytest.approx(1.5131, abs=1e-3)  # anchors §8.5


def test_noise_calibration_round_trip_pld():
    cal = calibrate_noise(lambda z: sampled_gaussian_event(z, 1.0, 3), 2.0, 1e-5, accountant="pld")
    assert 2.0 * (1 - 1e-2) <= compute_epsilon(cal.event, 1e-5, accountant="pld") <= 2.0


def test_noise_calibration_out_of_bracket():
    make = lambda z: sampled_gaussian_event(z, 1.0, 100000)  # noqa: E731
    with pytest.raises(PrivacyBudgetError, match=r"no noise multiplier up to 100 meets epsilon 0.001 at delta 1e-10"):
        calibrate_noise(make, 1e-3, 1e-10, max_noise=100.0)


def test_noise_calibration_at_lower_bound():
    cal = calibrate_noise(lambda z: sampled_gaussian_event(z, 1e-4, 1), 50.0, 1e-5, min_noise=0.5)
    assert cal.at_lower_bound and cal.noise_multiplier == 0.5 and cal.epsilon <= 50.0


@pytest.mark.parametrize("z, q, target", [(1.1, 0.01, 1.7118), (1.5, 0.01, 1.0), (4.0, 1.0, 2.0)])
def test_max_steps_is_the_largest_that_fits(z, q, target):
    res = max_steps(lambda t: sampled_gaussian_event(z, q, t), target, 1e-5)
    assert res.epsilon <= target
    assert compute_epsilon(sampled_gaussian_event(z, q, res.steps), 1e-5) <= target
    assert compute_epsilon(sampled_gaussian_event(z, q, res.steps + 1), 1e-5) > target


def test_max_steps_errors_and_limit():
    with pytest.raises(PrivacyBudgetError, match="not even one step meets epsilon 0.01 at delta 1e-05"):
        max_steps(lambda t: sampled_gaussian_event(0.5, 1.0, t), 0.01, 1e-5)
    res = max_steps(lambda t: sampled_gaussian_event(50.0, 0.001, t), 5.0, 1e-5, limit=64)
    assert res.at_upper_bound and res.steps == 64


def test_repeated_queries_hit_the_cache():
    cache_clear()
    event = sampled_gaussian_event(1.3, 0.02, 500)
    first = compute_epsilon(event, 1e-5)
    second = compute_epsilon(sampled_gaussian_event(1.3, 0.02, 500), 1e-5)  # equal event, new object
    assert first == second and cache_info().hits == 1 and cache_info().misses == 1


@pytest.mark.parametrize(
    "call, message",
    [
        (lambda: compute_epsilon(dpa.GaussianDpEvent(1.0), 0.0), "delta must be in the open interval (0, 1); got 0.0."),
        (lambda: compute_epsilon(dpa.GaussianDpEvent(1.0), 1e-5, accountant="prv"),
         "accountant must be one of rdp, pld; got 'prv'."),
        (lambda: compute_epsilon(dpa.GaussianDpEvent(1.0), 1e-5, neighboring="swap"),
         "neighboring must be one of add-remove, replace; got 'swap'."),
        (lambda: calibrate_noise(lambda z: dpa.GaussianDpEvent(z), 0.0, 1e-5), "epsilon must be > 0; got 0.0."),
    ],
    ids=["delta", "accountant", "neighboring", "epsilon"],
)
def test_bad_parameters(call, message):
    with pytest.raises(InputError) as err:
        call()
    assert str(err.value) == message


def test_unsupported_event_is_explained():
    event = dpa.SampledWithoutReplacementDpEvent(1000, 10, dpa.GaussianDpEvent(1.0))
    with pytest.raises(InputError, match=r"^the pld accountant cannot account a SampledWithoutReplacementDpEvent"):
        compute_epsilon(event, 1e-5, accountant="pld", neighboring="replace")
    with pytest.raises(InputError, match="neighboring_relation must be `REPLACE_ONE`"):
        compute_epsilon(event, 1e-5, accountant="rdp")
    assert compute_epsilon(event, 1e-5, neighboring="replace") == pytest.approx(
        _direct(event, 1e-5, relation=dpa.NeighboringRelation.REPLACE_ONE)
    )
