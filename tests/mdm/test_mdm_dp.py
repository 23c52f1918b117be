"""Client-level DP fitting: parsing, accounting, invariants, graceful degradation (specs/mdm.md §8 item 21)."""

import math

import numpy as np
import pytest

from pfl_cli.errors import ConfigError, InputError
from pfl_cli.mdm import MDMParams, fit_mdm, sample_clients
from pfl_cli.mdm import _kernels as K
from pfl_cli.mdm.dp import cap_client_sizes, make_dp, parse_dp
from pfl_cli.mdm.model import integer_size_edges
from pfl_cli.privacy import PrivacyLedger, compute_epsilon

MED1 = np.array([[0.1, 0.2, 0.6, 1.0, 2.0, 0.1, 1.0, 2.0, 0.5, 0.5]])


@pytest.fixture(scope="module")
def counts():
    probs = np.zeros((1, 20))
    probs[0, 19] = 1.0
    true = MDMParams(np.array([1.0]), MED1, probs, integer_size_edges(20))
    return sample_clients(true, 20_000, rng=np.random.default_rng(0)).counts


def nmse(x, y):
    return float(np.sqrt(np.sum(((x - y) / y) ** 2)))


def test_parse_dp():
    spec = parse_dp("eps=1,delta=1e-6,clip=5,population=1000")
    assert (spec.epsilon, spec.delta, spec.clip, spec.population) == (1.0, 1e-6, 5.0, 1000)
    for bad in ("delta=1e-6", "eps=x", "sigma=1", "eps=0", "eps=-1", "eps=1,clip=0", "eps=1,delta=1",
                "eps=1,delta=0.01,population=100", "eps=1,population=2.5"):
        with pytest.raises(ConfigError, match="--dp"):
            parse_dp(bad)


def test_ledger_meets_the_budget_and_records_every_release(counts):
    fit = fit_mdm(counts, num_components=1, rounds=20, max_samples=20, rng=np.random.default_rng(1),
                  dp=make_dp(2.0, 1e-6))
    doc = fit.privacy.to_dict(accountant="rdp")
    assert doc["unit"] == "client" and doc["epsilon"] <= 2.0 + 1e-9
    again = PrivacyLedger.from_dict(doc)
    assert compute_epsilon(again.event(), 1e-6, accountant="rdp") == pytest.approx(doc["epsilon"])
    assert fit.dp_info["noise_multiplier"] > 0 and fit.dp_info["clip"] == 20.0
    assert math.isnan(fit.log_likelihood)                   # the likelihood is not released


def test_dp_invariants_hold_under_heavy_noise(counts):
    fit = fit_mdm(counts[:300], num_components=3, rounds=10, cohort_size=100, max_samples=20,
                  rng=np.random.default_rng(2), dp=make_dp(0.1, 1e-6, population=1000))
    assert fit.dp_info["round_sampling_rate"] == 0.1          # cohort / public population, not / 300 clients
    p = fit.params
    assert np.all(np.isfinite(p.alpha)) and np.all(p.alpha > 0)
    assert p.tau.sum() == pytest.approx(1.0) and np.allclose(p.size_probs.sum(axis=1), 1.0)


def test_moderate_noise_at_a_realistic_epsilon_degrades_recovery_gracefully(counts):
    plain = fit_mdm(counts, num_components=1, rounds=30, rng=np.random.default_rng(3))
    private = fit_mdm(counts, num_components=1, rounds=30, max_samples=20, rng=np.random.default_rng(3),
                      dp=make_dp(4.0, 1e-6))
    assert private.privacy.to_dict(accountant="rdp")["epsilon"] <= 4.0 + 1e-9
    base = nmse(plain.params.alpha, MED1)
    assert nmse(private.params.alpha, MED1) < base + 0.5
    assert np.abs(private.params.alpha / private.params.alpha.sum() - MED1 / MED1.sum()).max() < 0.02


@pytest.mark.parametrize("cohort_size", [None, 5000])
def test_dp_with_noise_off_equals_the_plain_fit(counts, cohort_size):
    """sigma = 0 and a clip no client reaches: the DP code path computes exactly the plain fit's sums."""
    kw = dict(num_components=2, rounds=8, max_samples=20, cohort_size=cohort_size)
    plain = fit_mdm(counts, rng=np.random.default_rng(4), **kw)
    off = make_dp(1.0, 1e-6, clip=1e6, population=len(counts))
    import dataclasses

    private = fit_mdm(counts, rng=np.random.default_rng(4), dp=dataclasses.replace(off, _noise_factor=0.0), **kw)
    if cohort_size is None:  # the same rows every round: the same fit up to float summation order
        for name in ("tau", "alpha", "size_probs"):
            np.testing.assert_allclose(getattr(private.params, name), getattr(plain.params, name), rtol=1e-6)
    else:  # Poisson cohorts of the same expected size: the same model, not the same draws
        np.testing.assert_allclose(private.params.alpha, plain.params.alpha, rtol=0.1)


def test_max_samples_is_a_public_bound_that_caps_large_clients():
    x = np.array([[6, 3, 1], [1, 1, 0], [0, 0, 9]])
    capped = cap_client_sizes(x, 5)
    assert capped.sum(axis=1).tolist() == [5, 2, 5] and capped[2].tolist() == [0, 0, 5]
    assert np.all(capped <= x)
    with pytest.raises(InputError, match="max_samples is required with dp"):
        fit_mdm(x, num_components=1, rng=np.random.default_rng(0), dp=make_dp(1.0))
    fit = fit_mdm(x, num_components=1, rounds=2, max_samples=5, rng=np.random.default_rng(0), dp=make_dp(1.0))
    assert fit.params.max_samples == 5 and fit.dp_info["clip"] == 5.0   # support and clip from M, not from 10


def test_a_cohort_size_needs_the_public_population(counts):
    with pytest.raises(ConfigError, match="population"):
        fit_mdm(counts[:100], num_components=1, cohort_size=10, max_samples=20, rng=np.random.default_rng(0),
                dp=make_dp(1.0))


def test_clipping_bounds_each_client_upload(counts):
    mech = make_dp(1.0, 1e-6, clip=3.0).bind(cohort_size=None, init_cohort_size=None, rounds=1, restarts=1,
                                             max_samples=20)
    params = MDMParams(np.array([1.0]), MED1, np.full((1, 20), 0.05), integer_size_edges(20))
    data = K.encode(counts[:100])
    w, _, u, v = K.client_statistics(data, params, slice(0, 100))
    raw = np.concatenate([(u * params.alpha[None]).reshape(100, -1), v * params.alpha.sum()], axis=1)
    assert np.all(np.linalg.norm(raw, axis=1) <= 20 * math.sqrt(2) + 1e-9)   # alpha*u <= c, alpha0*v <= m
    from pfl_cli.privacy import clip_l2

    assert np.all(np.linalg.norm(clip_l2(raw, mech.clip, axis=1), axis=1) <= 3.0 + 1e-9)


def test_dp_refuses_restarts(counts):
    with pytest.raises(InputError, match="restarts must be 1 with --dp"):
        fit_mdm(counts[:100], num_components=1, restarts=2, max_samples=20, rng=np.random.default_rng(0),
                dp=make_dp(1.0))


def test_dp_progress_status_carries_no_log_likelihood():
    true = MDMParams(np.array([1.0]), np.array([[2.0, 1.0, 1.0]]), np.full((1, 20), 0.05), integer_size_edges(20))
    counts = sample_clients(true, 400, rng=np.random.default_rng(0)).counts
    calls = []
    fit = fit_mdm(counts, num_components=1, rounds=5, max_samples=20, rng=np.random.default_rng(1),
                  dp=make_dp(2.0, 1e-6), on_progress=lambda *call: calls.append(call))
    plain = fit_mdm(counts, num_components=1, rounds=5, max_samples=20, rng=np.random.default_rng(1),
                    dp=make_dp(2.0, 1e-6))
    assert np.array_equal(fit.params.alpha, plain.params.alpha)
    assert [(d, t) for d, t, _ in calls] == [(d, 5) for d in range(1, 6)]
    assert all(s == {"components": 1, "restart": 1, "restarts": 1} for _, _, s in calls)
