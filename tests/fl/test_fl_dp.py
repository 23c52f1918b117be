"""Client-level DP-FedAvg (pfl_cli.fl.dp) observed on the real FedAvg and PeFLL rounds."""

import dataclasses
import math

import numpy as np
import pytest
import torch
from dp_accounting import dp_event, pld, rdp
from scipy import stats

from pfl_cli.algorithms import FedAvg, PeFLL
from pflx_testing import replace, small_config
from pfl_cli.fl.dp import ClientLevelDP, calibrate_client_dp, clip_per_client

N_CLIENTS = 12  # tests/fl/conftest.py: equal_store
COHORT = torch.tensor([1, 4, 7, 9])
BASE = dict(mlp_hidden=(8,), local_steps=3, batch_size=8, lr=0.05, momentum=0.5, normalize=False, val_fraction=0.0)
PEFLL = dict(BASE, algorithm="pefll", hyper_hidden=16, embed_dim=4, descriptor_batch=8, embedding="mlp",
             standardize_descriptor=False, lambda_h=0.0, lambda_v=0.0, server_optimizer="sgd", server_lr=1.0,
             server_clip=0.0)


def mechanism(z: float, clip: float, cohort: int = len(COHORT)) -> ClientLevelDP:
    """A mechanism whose fixed denominator q N equals ``cohort``."""
    return ClientLevelDP(1.0, 1e-6, clip, cohort / N_CLIENTS, N_CLIENTS, 10, z, denominator=float(cohort))


class Spy(ClientLevelDP):
    """The mechanism, recording the contributions it is handed (the real per-client updates)."""

    seen: list = []

    def private_mean(self, contributions, gen):
        self.seen.append({k: v.clone() for k, v in contributions.items()})
        return super().private_mean(contributions, gen)


def _flat(params: dict) -> torch.Tensor:
    return torch.cat([v.reshape(-1) for v in params.values()])


def _fedavg_round(equal_store, dp, rounds=1, **over):
    alg = FedAvg(small_config(**{**BASE, "algorithm": "fedavg", **over}), equal_store)
    alg.dp = dp
    before = _flat(alg.global_params).clone()
    for t in range(rounds):
        alg.run_round(t, COHORT, torch.Generator().manual_seed(5 + t))
    return alg, before


def test_noise_zero_clip_infinity_equals_fedavg(equal_store):
    """z = 0, C = inf, q N = c and equal client sizes: sum / (q N) is FedAvg's size-weighted mean, exactly."""
    plain, _ = _fedavg_round(equal_store, None, rounds=3)
    private, _ = _fedavg_round(equal_store, mechanism(0.0, math.inf), rounds=3)
    torch.testing.assert_close(_flat(private.global_params), _flat(plain.global_params), rtol=1e-6, atol=1e-7)


def test_pefll_noise_zero_clip_infinity_equals_pefll(equal_store):
    """The per-client vmapped VJPs, summed over q N = c, equal PeFLL's aggregated server gradient."""
    cfg = small_config(**PEFLL)
    etas = []
    for dp in (None, mechanism(0.0, math.inf)):
        alg = PeFLL(cfg, equal_store)
        alg.dp = dp
        alg.run_round(0, COHORT, torch.Generator().manual_seed(3))
        etas.append(torch.cat([p.detach().reshape(-1) for p in (*alg.hnet.parameters(), *alg.embed.parameters())]))
    torch.testing.assert_close(etas[1], etas[0], rtol=1e-4, atol=1e-6)
    assert float((etas[0] - etas[1]).abs().max()) < 1e-5


@pytest.mark.parametrize("algorithm, clip", [("fedavg", 0.02), ("pefll", 1e-4)])
def test_clipping_is_observed_on_the_real_client_updates(equal_store, algorithm, clip):
    spy = Spy(**dataclasses.asdict(mechanism(0.0, clip)))
    spy.seen.clear()
    if algorithm == "fedavg":
        alg, before = _fedavg_round(equal_store, spy)
        change = _flat(alg.global_params) - before
    else:
        alg = PeFLL(small_config(**PEFLL), equal_store)
        alg.dp = spy
        before = torch.cat([p.detach().reshape(-1).clone() for p in (*alg.hnet.parameters(), *alg.embed.parameters())])
        alg.run_round(0, COHORT, torch.Generator().manual_seed(3))
        after = torch.cat([p.detach().reshape(-1) for p in (*alg.hnet.parameters(), *alg.embed.parameters())])
        change = before - after  # server SGD with lr 1 steps against the gradient
    (contrib,) = spy.seen
    rows = torch.cat([v.reshape(len(COHORT), -1) for v in contrib.values()], dim=1).double().numpy()
    norms = np.linalg.norm(rows, axis=1)
    assert norms.min() > 2 * clip  # every real update is clipped: the bound is what limits it
    from pfl_cli.privacy import clip_l2

    expected = clip_l2(rows, clip, axis=1).sum(0) / len(COHORT)
    np.testing.assert_allclose(change.double().numpy(), expected, rtol=1e-4, atol=1e-7)
    assert np.linalg.norm(expected) <= clip * (1 + 1e-9)


def test_noise_scale_is_observed_on_a_real_round(equal_store):
    """The same round with and without noise differs by N(0, (z C / (q N))^2) per coordinate."""
    z, clip = 1.3, 0.5
    noisy, _ = _fedavg_round(equal_store, mechanism(z, clip))
    clean, _ = _fedavg_round(equal_store, mechanism(0.0, clip))
    noise = (_flat(noisy.global_params) - _flat(clean.global_params)).double().numpy()
    scale = z * clip / len(COHORT)
    assert len(noise) > 500
    assert abs(noise.std() / scale - 1) < 4 * math.sqrt(1 / (2 * len(noise)))  # chi-square: 4 std
    assert stats.kstest(noise / scale, "norm").pvalue > 1e-3


def test_private_mean_noise_is_gaussian_with_the_calibrated_std():
    dp = ClientLevelDP(1.0, 1e-6, 2.0, 0.1, 100, 10, 0.8, denominator=10.0)
    zeros = {"w": torch.zeros(3, 40000)}
    out = dp.private_mean(zeros, torch.Generator().manual_seed(0))["w"].double().numpy() * dp.denominator
    assert abs(out.std() / (0.8 * 2.0) - 1) < 0.03 and abs(out.mean()) < 0.03
    assert stats.kstest(out / 1.6, "norm").pvalue > 1e-3


def test_clip_per_client_bounds_the_joint_norm_and_leaves_small_rows():
    rows = {"a": torch.tensor([[3.0, 0.0], [0.1, 0.0]]), "b": torch.tensor([[[4.0]], [[0.0]]])}
    out = clip_per_client(rows, 1.0)
    torch.testing.assert_close(out["a"], torch.tensor([[0.6, 0.0], [0.1, 0.0]]))
    torch.testing.assert_close(out["b"], torch.tensor([[[0.8]], [[0.0]]]))


def test_poisson_cohorts_have_rate_q():
    dp = ClientLevelDP(1.0, 1e-6, 1.0, 0.2, 50, 10, 1.0)
    clients = torch.arange(50)
    gen = torch.Generator().manual_seed(0)
    sizes = np.array([len(dp.sample_cohort(clients, 10, gen)) for _ in range(2000)])
    assert abs(sizes.mean() - 10) < 4 * math.sqrt(50 * 0.2 * 0.8 / 2000)
    assert abs(sizes.var() / (50 * 0.2 * 0.8) - 1) < 0.15
    assert sizes.min() < sizes.max()


@pytest.mark.parametrize("accountant, cls", [("rdp", rdp.RdpAccountant), ("pld", pld.PLDAccountant)])
def test_ledger_epsilon_equals_an_independent_dp_accounting_computation(accountant, cls):
    cfg = small_config(algorithm="fedavg", rounds=200, clients_per_round=10, dp_epsilon=2.0, dp_delta=1e-6,
                      dp_clip=1.0, dp_accountant=accountant, normalize=False, dp_population=400)
    dp = calibrate_client_dp(cfg)
    doc = dp.ledger().to_dict(accountant=accountant)
    acc = cls()
    acc.compose(dp_event.SelfComposedDpEvent(
        dp_event.PoissonSampledDpEvent(10 / 400, dp_event.GaussianDpEvent(dp.noise_multiplier)), 200))
    expected = acc.get_epsilon(1e-6)
    assert doc["epsilon"] == pytest.approx(expected, rel=1e-9)
    assert expected <= 2.0 and expected == pytest.approx(2.0, rel=1e-3)  # calibrated to the target, not below
    assert doc["unit"] == "client" and doc["delta"] == 1e-6 and dp.denominator == pytest.approx(10.0)
    assert "checked against the public population bound N = 400" in doc["notes"][0]


def test_without_a_population_bound_the_rate_must_be_given():
    cfg = small_config(algorithm="fedavg", rounds=10, dp_epsilon=2.0, dp_clip=1.0, normalize=False)
    with pytest.raises(ValueError, match="population=1000"):
        calibrate_client_dp(cfg)
    dp = calibrate_client_dp(replace(cfg, dp_sampling_rate=0.05, clients_per_round=7))
    assert dp.sampling_rate == 0.05 and dp.denominator == 7.0 and dp.population is None
    assert "delta < 1/n not checked" in dp.ledger().notes[0]


@pytest.mark.parametrize("algorithm", ["fedavg", "pefll"])
def test_an_empty_cohort_releases_noise_only(equal_store, algorithm):
    """A Poisson cohort may be empty: the round still adds N(0, (z C)^2) / denominator and nothing else."""
    cfg = small_config(**(PEFLL if algorithm == "pefll" else {**BASE, "algorithm": "fedavg"}))
    cls = PeFLL if algorithm == "pefll" else FedAvg
    alg = cls(cfg, equal_store)
    alg.dp = mechanism(1.0, 0.5)
    params = (lambda: _flat(alg.global_params)) if algorithm == "fedavg" else (
        lambda: torch.cat([p.detach().reshape(-1) for p in (*alg.hnet.parameters(), *alg.embed.parameters())]))
    before = params().clone()
    loss = alg.run_round(0, torch.zeros(0, dtype=torch.long), torch.Generator().manual_seed(0))
    assert len(loss) == 0
    step = (params() - before).double().numpy()
    assert abs(step.std() / (0.5 / len(COHORT)) - 1) < 0.2  # lr 1: the noise / denominator itself
