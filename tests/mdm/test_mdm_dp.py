"""Client-level DP fitting: parsing, accounting, invariants, graceful degradation (specs/mdm.md §8 item 21)."""

import math

import numpy as np
import pytest

from pfl_cli.errors import ConfigError, InputError
from pfl_cli.mdm import MDMParams, fit_mdm, sample_clients
from pfl_cli.mdm import _kernels as K
from pfl_cli.mdm.dp import make_dp, parse_dp
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
    assert parse_dp("eps=1,delta=1e-6,clip=5") == {"epsilon": 1.0, "delta": 1e-6, "clip": 5.0}
    for bad in ("delta=1e-6", "eps=x", "sigma=1"):
        with pytest.raises(ConfigError, match="--dp"):
            parse_dp(bad)


def test_ledger_meets_the_budget_and_records_every_release(counts):
    fit = fit_mdm(counts, num_components=1, rounds=20, rng=np.random.default_rng(1), dp=make_dp(2.0, 1e-6))
    doc = fit.privacy.to_dict(accountant="rdp")
    assert doc["unit"] == "client" and doc["epsilon"] <= 2.0 + 1e-9
    again = PrivacyLedger.from_dict(doc)
    assert compute_epsilon(again.event(), 1e-6, accountant="rdp") == pytest.approx(doc["epsilon"])
    assert fit.dp_info["noise_multiplier"] > 0 and fit.dp_info["clip"] == 20.0
    assert math.isnan(fit.log_likelihood)                   # the likelihood is not released


def test_dp_invariants_hold_under_heavy_noise(counts):
    fit = fit_mdm(counts[:300], num_components=3, rounds=10, cohort_size=100, rng=np.random.default_rng(2),
                  dp=make_dp(0.1, 1e-6))
    p = fit.params
    assert np.all(np.isfinite(p.alpha)) and np.all(p.alpha > 0)
    assert p.tau.sum() == pytest.approx(1.0) and np.allclose(p.size_probs.sum(axis=1), 1.0)


def test_moderate_noise_degrades_recovery_gracefully(counts):
    plain = fit_mdm(counts, num_components=1, rounds=100, rng=np.random.default_rng(3))
    private = fit_mdm(counts, num_components=1, rounds=100, rng=np.random.default_rng(3), dp=make_dp(50.0, 1e-6))
    base = nmse(plain.params.alpha, MED1)
    assert nmse(private.params.alpha, MED1) < max(2 * base, base + 0.05)


def test_clipping_bounds_each_client_upload(counts):
    mech = make_dp(1.0, 1e-6, clip=3.0).bind(num_clients=100, cohort_size=100, init_cohort_size=100, rounds=1,
                                             restarts=1, max_samples=20)
    params = MDMParams(np.array([1.0]), MED1, np.full((1, 20), 0.05), integer_size_edges(20))
    data = K.encode(counts[:100])
    w, _, u, v = K.client_statistics(data, params, slice(0, 100))
    raw = np.concatenate([(u * params.alpha[None]).reshape(100, -1), v * params.alpha.sum()], axis=1)
    assert np.all(np.linalg.norm(raw, axis=1) <= 20 * math.sqrt(2) + 1e-9)   # alpha*u <= c, alpha0*v <= m
    from pfl_cli.privacy import clip_l2

    assert np.all(np.linalg.norm(clip_l2(raw, mech.clip, axis=1), axis=1) <= 3.0 + 1e-9)


def test_dp_refuses_restarts(counts):
    with pytest.raises(InputError, match="restarts must be 1 with --dp"):
        fit_mdm(counts[:100], num_components=1, restarts=2, rng=np.random.default_rng(0), dp=make_dp(1.0))
