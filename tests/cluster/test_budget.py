import math

import numpy as np
import pytest

from pfl_cli.cluster import budget
from pfl_cli.errors import InputError
from pfl_cli.privacy import PrivacyLedger, gaussian_sigma

DELTA = 1e-6


def _plan(eps, unit="example", T=0, calibration="basic_text", composition="pld", radius=10.0, init=True):
    fr = budget.resolve_fractions(None, unit, feddp_init=init, lloyds_steps=T)
    return budget.plan_noise(eps, DELTA, fr, budget.sensitivities(unit, radius), lloyds_steps=T,
                             lloyds_calibration=calibration, composition=composition)


def test_default_splits_are_the_thesis_rules_of_thumb():
    assert budget.resolve_fractions(None, "example", feddp_init=True, lloyds_steps=0) == (0.2, 0.2, 0.45, 0.15, 0, 0)
    assert budget.resolve_fractions(None, "client", feddp_init=True, lloyds_steps=0) == (0.35, 0.1, 0.45, 0.1, 0, 0)
    assert budget.resolve_fractions(None, "example", feddp_init=False, lloyds_steps=2) == (0, 0, 0, 0, 0.5, 0.5)
    fr = budget.resolve_fractions([1, 1, 1, 1], "example", feddp_init=True, lloyds_steps=1)
    assert math.isclose(sum(fr), 1) and fr[4] == fr[5] == 0.25


def test_each_step_noise_matches_its_sensitivity_and_budget():
    radius, T = 7.0, 3
    p = _plan(1.0, T=T, composition="basic", radius=radius)
    e = p.epsilons
    assert math.isclose(sum(e.values()), 1.0)
    assert math.isclose(p.scales["outer"], gaussian_sigma(e["outer"], DELTA) * radius**2)  # Delta^2
    assert math.isclose(p.scales["weights"], 1 / e["weights"])  # L1 sensitivity 1
    assert math.isclose(p.scales["sums"], gaussian_sigma(e["sums"], DELTA) * radius)  # Delta
    assert math.isclose(p.scales["counts"], 1 / e["counts"])
    # FedDP-Lloyds, text version: (eps_G / T, delta / T) per round, Lap(T / eps_L).
    assert math.isclose(p.scales["lloyds_sums"], gaussian_sigma(e["lloyds_sums"] / T, DELTA / T) * radius)
    assert math.isclose(p.scales["lloyds_counts"], T / e["lloyds_counts"])


def test_client_level_sensitivities_are_the_clip_bounds():
    sens = budget.sensitivities("client", 11.0, {"sums": 5.0})
    assert sens["outer"] == 1500 and sens["lloyds_sums"] == 120 and sens["sums"] == 5.0
    p = budget.plan_noise(1.0, DELTA, (0.35, 0.1, 0.45, 0.1, 0, 0), sens, lloyds_steps=0, composition="basic")
    assert math.isclose(p.scales["sums"], gaussian_sigma(p.epsilons["sums"], DELTA) * 5.0)
    assert math.isclose(p.scales["weights"], 1.0 / p.epsilons["weights"])


def test_pld_of_nominal_split_matches_the_spec_reference():
    # specs/clustering.md §7.2 item 9: split [0.2,0.2,0.45,0.15], eps_init = 1 -> 0.811 +- 0.01.
    p = _plan(1.0, composition="basic")
    assert abs(p.epsilon - 0.811) < 0.01


@pytest.mark.parametrize("eps,unit,T,cal", [(0.3, "example", 0, "basic_text"), (1.0, "example", 2, "basic_text"),
                                            (2.0, "client", 0, "basic_text"), (1.0, "example", 1, "pld_joint"),
                                            (40.0, "example", 0, "basic_text")])
def test_accounted_epsilon_never_exceeds_the_budget_and_uses_most_of_it(eps, unit, T, cal):
    p = _plan(eps, unit=unit, T=T, calibration=cal)
    ledger = PrivacyLedger(unit, DELTA, p.events)
    assert ledger.epsilon(p.accountant) <= eps
    assert p.epsilon >= 0.99 * eps and p.nominal_scale >= 1


def test_bad_split_is_refused():
    with pytest.raises(InputError, match="split"):
        budget.resolve_fractions([1, 2, 3], "example", feddp_init=True, lloyds_steps=0)
    with pytest.raises(InputError, match="split"):
        budget.resolve_fractions([1, 0, 1, 1], "example", feddp_init=True, lloyds_steps=0)
