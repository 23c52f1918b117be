"""The distributed discrete Gaussian under secure aggregation (pfl_cli.privacy.distributed)."""

import dataclasses
import json
import math

import numpy as np
import pytest
import torch
from dp_accounting import dp_event

from pfl_cli import registry
from pfl_cli.errors import ConfigError
from pfl_cli.fl.api import validate_train_config
from pfl_cli.fl.secagg import secure_sum
from pfl_cli.privacy import compute_epsilon
from pfl_cli.privacy.distributed import (DistributedDiscreteGaussian, calibrate_distributed_dp, discrete_gaussian,
                                         integer_scale, tau)


@pytest.fixture(scope="module")
def equal_store():
    """Digits (scaled by the public bound 16) over 10 clients of 20 train samples each."""
    from pfl_cli.data import load_dataset
    from pfl_cli.fl.store import build_store
    from pfl_cli.partition.base import Partition

    ds = load_dataset("builtin:digits")
    order = np.random.default_rng(0).permutation(ds.num_samples)
    part = Partition(client_id=np.arange(10), role=np.zeros(10, np.uint8), train_offsets=np.arange(11) * 20,
                     train_indices=order[:200], test_offsets=np.arange(11) * 5, test_indices=order[200:250])
    return build_store(ds.x / 16.0, ds.y, ds.num_classes, part, val_fraction=0.0, rng=None, device="cpu",
                       normalize=False)


def mech(z=2.0, cohort=6, survivors=6, bits=24, dim=40, rounds=10, clip=1.0):
    return DistributedDiscreteGaussian(1.0, 1e-6, clip, cohort, survivors, bits, dim, rounds, z)


def ddg_config(**over):
    base = dict(rounds=10, clients_per_round=6, secagg=True, dp_epsilon=2.0, dp_clip=1.0, dp_mechanism="ddg",
                normalize=False)
    return registry.train_config("fedavg", **{**base, **over})


def test_discrete_gaussian_matches_its_pmf():
    """Canonne, Kamath & Steinke's sampler against the exact pmf exp(-x^2 / 2 sigma^2) / normalizer."""
    sigma = 1.7
    gen = torch.Generator().manual_seed(0)
    x = discrete_gaussian(sigma, (200_000,), gen).numpy()
    support = np.arange(-12, 13)
    pmf = np.exp(-support ** 2 / (2 * sigma ** 2))
    pmf /= pmf.sum()
    freq = np.array([(x == k).mean() for k in support])
    assert np.abs(freq - pmf).max() < 4e-3
    assert abs(x.mean()) < 0.02 and x.dtype == np.int64


def test_scaled_rounded_sum_decodes_to_the_mean_of_the_clipped_updates():
    """With almost no noise (z tiny, many bits), decode(sum mod 2^b) is sum(clip(x_i)) / cohort, across the wrap."""
    m = mech(z=1e-7, bits=48, dim=5, cohort=3, survivors=3)
    x = {"w": torch.tensor([[0.3, -0.4, 0.0, 0.1, -0.2], [-3.0, 0.0, 4.0, 0.0, 0.0], [0.0, -0.01, 0.02, 0.0, 0.0]])}
    rows = m.client_rows(x, torch.Generator().manual_seed(1))
    assert rows["w"].dtype == torch.int64 and int(rows["w"].min()) >= 0 and int(rows["w"].max()) < m.modulus
    out = m.release_sum(secure_sum(rows, modulus=m.modulus))["w"]
    clipped = x["w"].clone()
    clipped[1] /= 5.0  # norm 5 -> clip 1
    expected = clipped.sum(0) / m.cohort
    assert float((out - expected).abs().max()) < 1e-4


def test_the_sum_of_the_shares_carries_the_central_noise():
    """Zero updates from min_survivors clients: the decoded sum's std is z Delta_2 in integer units."""
    m = mech(z=3.0, cohort=5, survivors=5, dim=4000, bits=30)
    zeros = {"w": torch.zeros(5, 4000)}
    rows = m.client_rows(zeros, torch.Generator().manual_seed(2))
    total = m.release_sum(secure_sum(rows, modulus=m.modulus))["w"].double() * m.cohort * m.scale / m.clip
    expected = m.noise_multiplier * m.sensitivity
    assert abs(float(total.std()) / expected - 1) < 0.05
    assert abs(m.client_sigma * math.sqrt(5) / expected - 1) < 1e-12


def test_fewer_survivors_than_the_threshold_release_nothing():
    m = mech(survivors=4)
    rows = m.client_rows({"w": torch.ones(3, 40)}, torch.Generator().manual_seed(3))
    out = m.release_sum(secure_sum(rows, modulus=m.modulus))
    assert torch.equal(out["w"], torch.zeros(40))


def test_accounting_is_the_gaussian_zcdp_of_the_sum_for_large_shares():
    """tau vanishes for large sigma_c: each round is rho = 4 / (2 z^2)-zCDP, the RDP curve of the Gaussian mechanism
    at sensitivity 2 Delta_2 (a replaced cohort slot), i.e. noise multiplier z / 2."""
    m = mech(z=1.3, rounds=25)
    assert tau(m.client_sigma, m.cohort) == 0.0
    ours = compute_epsilon(m.event(), 1e-6, accountant="rdp")
    gaussian = compute_epsilon(dp_event.SelfComposedDpEvent(dp_event.GaussianDpEvent(1.3 / 2), 25), 1e-6,
                               accountant="rdp")
    assert ours == pytest.approx(gaussian, rel=1e-9)
    assert isinstance(m.event().event, dp_event.ZCDpEvent)
    assert tau(0.6, 10) > 0.05  # small shares: the discrete term counts


def test_calibration_meets_the_target_and_survivors_raise_each_share():
    full = calibrate_distributed_dp(ddg_config(), dim=650)
    assert compute_epsilon(full.event(), full.delta, accountant="rdp") <= 2.0 + 1e-9
    assert compute_epsilon(full.event(), full.delta, accountant="rdp") > 1.99
    fewer = calibrate_distributed_dp(ddg_config(dp_min_survivors=3), dim=650)
    assert fewer.noise_multiplier == pytest.approx(full.noise_multiplier, rel=1e-6)
    # three shares must carry the sum's noise: each is sqrt(6/3) larger (and the scale leaves room for six)
    assert fewer.client_sigma / fewer.sensitivity == pytest.approx(full.client_sigma / full.sensitivity * math.sqrt(2),
                                                                   rel=1e-6)
    assert "surviving cohort of at least 3 clients" in fewer.note()


def test_scale_keeps_the_worst_case_sum_inside_the_modulus():
    s = integer_scale(2.0, cohort=6, min_survivors=3, dim=100, bits=20)
    spread = 10 * 2.0 * math.sqrt(2)
    assert 6 * (s + 1) + spread * (s + 10) <= 2 ** 19 + 1e-6
    assert integer_scale(1e6, cohort=6, min_survivors=6, dim=100, bits=20) == 0.0


@pytest.mark.parametrize("over, message", [
    (dict(secagg=False), "add --secagg"),
    (dict(clients_per_round=None), "needs a public cohort size"),
    (dict(dp_population=100), "dp_population sets Poisson sampling"),
    (dict(dp_accountant="pld"), "PLD accountant does not take"),
    (dict(dp_min_survivors=7), "dp_min_survivors must be at most the cohort"),
    (dict(dp_bits=70), "dp_bits must be an integer in [8, 62]"),
], ids=["no-secagg", "no-cohort", "population", "pld", "survivors", "bits"])
def test_bad_ddg_options_are_refused_before_any_data(over, message):
    with pytest.raises(ConfigError, match=message.replace("[", r"\[").replace("]", r"\]")):
        validate_train_config(ddg_config(**over))


def test_too_few_bits_for_the_model_are_refused():
    with pytest.raises(ConfigError, match="raise dp_bits"):
        calibrate_distributed_dp(ddg_config(dp_bits=12, dp_epsilon=0.5, rounds=200), dim=100_000)


def test_ddg_keys_without_ddg_are_refused():
    with pytest.raises(ConfigError, match="dp_bits has no effect"):
        registry.train_config("fedavg", dp_bits=16)


def _round_models(store, noise, seed=0):
    from pfl_cli.fl.api import plan_dp

    cfg = dataclasses.replace(ddg_config(rounds=2, mlp_hidden=(8,), local_steps=2, batch_size=8, lr=0.05,
                                         val_fraction=0.0), dp_noise=noise, seed=seed)
    alg = cfg.algorithm_class(cfg, store)
    alg.dp = plan_dp(cfg, store)
    for t in range(2):
        alg.run_round(t, torch.tensor([0, 2, 3, 5, 7, 9]), torch.Generator().manual_seed(t))
    return torch.cat([v.reshape(-1) for v in alg.global_params.values()])


def test_client_noise_comes_from_os_entropy_unless_seeded(equal_store, monkeypatch):
    """noise=secure: every share and rounding draw is a CSPRNG draw (two runs differ); seeded: repeatable."""
    import pfl_cli.privacy.randomness as rnd

    calls = []
    real = rnd.secure_uniform
    monkeypatch.setattr(rnd, "secure_uniform", lambda size=None: calls.append(size) or real(size))
    a, b = _round_models(equal_store, "secure"), _round_models(equal_store, "secure")
    assert calls and not torch.equal(a, b)
    assert torch.equal(_round_models(equal_store, "seeded"), _round_models(equal_store, "seeded"))


def test_ddg_train_run_and_privacy_account_report_the_mechanism(cli, tmp_path):
    part = tmp_path / "part"
    assert cli("partition", "--dataset", "builtin:digits", "--num-clients", "12", "--out", part).code == 0
    out = tmp_path / "ddg"
    r = cli("train", "--partition", part, "--algorithm", "fedavg", "--rounds", "3", "--eval-every", "3",
            "--clients-per-round", "5", "--local-steps", "2", "--secagg", "--dp", "eps=4,clip=1",
            "--set", "dp_mechanism=ddg", "--set", "dp_min_survivors=4", "--set", "normalize=false",
            "--set", "mlp_hidden=[8]", "--out", out)
    assert r.code == 0, r.err
    doc = json.loads((out / "privacy.json").read_text())
    assert doc["events"][0]["event"]["type"] == "ZCDpEvent" and doc["epsilon"] <= 4.0
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["dp"]["min_survivors"] == 4 and "distributed discrete Gaussian" in metrics["dp"]["mechanism"]
    r = cli("privacy-account", out, "--format", "json")
    assert r.code == 0, r.err
    report = json.loads(r.out)
    assert any("surviving cohort of at least 4" in n and "discrete Gaussian" in n for n in report["notes"])
    assert report["epsilon"] == pytest.approx(doc["epsilon"], rel=1e-6)
