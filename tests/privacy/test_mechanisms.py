"""Mechanisms: closed forms, the Balle & Wang condition, clipping and noise draws (thesis §2.4)."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy.stats import norm

from pfl_cli.errors import InputError
from pfl_cli.privacy import (
    clip_l1,
    clip_l2,
    gaussian_noise,
    gaussian_sigma,
    laplace_noise,
    laplace_scale,
    symmetric_gaussian_noise,
)


def _balle_wang_delta(sigma: float, eps: float, sens: float) -> float:
    # Balle & Wang (2018) Thm 8: the Gaussian mechanism is (eps, delta)-DP iff delta >= this.
    a, b = sens / (2 * sigma), eps * sigma / sens
    return norm.cdf(a - b) - math.exp(eps) * norm.cdf(-a - b)


@pytest.mark.parametrize("eps, delta, sens", [(0.2, 1e-6, 1.0), (1.0, 1e-5, 2.5), (4.0, 1e-8, 0.3)])
def test_analytic_sigma_is_tight(eps, delta, sens):
    sigma = gaussian_sigma(eps, delta, sens)
    assert _balle_wang_delta(sigma, eps, sens) <= delta * (1 + 1e-9)
    assert _balle_wang_delta(sigma * (1 - 1e-6), eps, sens) > delta  # any less noise breaks it


@pytest.mark.parametrize("eps, expected", [(0.2, 18.989), (0.45, 8.891), (1.0, 4.225)])
def test_analytic_sigma_reference_values(eps, expected):
    # specs/clustering.md §7.1: analytic sigma at delta = 1e-6, S = 1.
    assert gaussian_sigma(eps, 1e-6) == pytest.approx(expected, abs=1e-3)


def test_classic_sigma_closed_form():
    assert gaussian_sigma(0.5, 1e-5, 3.0, method="classic") == math.sqrt(2 * math.log(1.25 / 1e-5)) * 3.0 / 0.5


def test_classic_sigma_refuses_large_epsilon():
    with pytest.raises(InputError, match=r"epsilon must be < 1 for method='classic'"):
        gaussian_sigma(1.0, 1e-5, method="classic")


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"epsilon": 0.0, "delta": 1e-5}, "epsilon must be a finite number > 0; got 0.0."),
        ({"epsilon": 1.0, "delta": 1.0}, "delta must be in the open interval (0, 1); got 1.0."),
        ({"epsilon": 1.0, "delta": 1e-5, "sensitivity": -1.0}, "sensitivity must be a finite number > 0; got -1.0."),
        ({"epsilon": 1.0, "delta": 1e-5, "method": "lemma17"}, "method must be one of analytic, classic; got 'lemma17'."),
    ],
    ids=["eps", "delta", "sensitivity", "method"],
)
def test_gaussian_sigma_rejects(kwargs, message):
    with pytest.raises(InputError) as err:
        gaussian_sigma(**kwargs)
    assert str(err.value) == message


def test_laplace_scale():
    assert laplace_scale(0.25, 2.0) == 8.0
    with pytest.raises(InputError, match="epsilon must be a finite number > 0"):
        laplace_scale(-1.0)


def test_clip_l2_rows_and_frobenius():
    x = np.array([[3.0, 4.0], [0.3, 0.4], [0.0, 0.0]])
    rows = clip_l2(x, 1.0)
    assert np.allclose(np.linalg.norm(rows, axis=1), [1.0, 0.5, 0.0])
    assert np.array_equal(rows[1:], x[1:])  # inside the ball: bit-for-bit unchanged
    whole = clip_l2(x, 2.0, axis=None)
    assert np.linalg.norm(whole) == pytest.approx(2.0)
    assert np.allclose(whole / np.linalg.norm(whole), x / np.linalg.norm(x))


def test_clip_l1():
    x = np.array([[2.0, -2.0], [0.1, 0.2]])
    out = clip_l1(x, 1.0)
    assert np.allclose(np.abs(out).sum(axis=1), [1.0, 0.3])
    assert np.array_equal(out[1], x[1])
    assert np.abs(clip_l1(x, 1.0, axis=None)).sum() == pytest.approx(1.0)


def test_noise_draws_follow_the_generator():
    a = gaussian_noise((1000,), 2.0, np.random.default_rng(1))
    b = gaussian_noise((1000,), 2.0, np.random.default_rng(1))
    assert np.array_equal(a, b)
    assert a.std() == pytest.approx(2.0, rel=0.1)
    lap = laplace_noise(20000, 3.0, np.random.default_rng(2))
    assert np.abs(lap).mean() == pytest.approx(3.0, rel=0.05)  # E|Lap(b)| = b
    with pytest.raises(TypeError, match="rng must be a numpy.random.Generator"):
        gaussian_noise(3, 1.0, rng=0)


def test_symmetric_noise_is_symmetric_with_the_right_spread():
    # specs/clustering.md §7.1 item 4: E = E^T and the upper triangle has std sigma.
    sigma, d = 1.5, 40
    draws = np.stack([symmetric_gaussian_noise(d, sigma, np.random.default_rng(s)) for s in range(20)])
    assert all(np.array_equal(e, e.T) for e in draws)
    upper = draws[:, *np.triu_indices(d)]
    assert upper.std() == pytest.approx(sigma, rel=0.02)
    with pytest.raises(InputError, match="d must be an integer >= 1; got 0."):
        symmetric_gaussian_noise(0, 1.0, np.random.default_rng(0))
