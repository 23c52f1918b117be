"""PSNR and SSIM against hand-computed values and a slow, loop-by-window SSIM reference."""

import math

import numpy as np
import pytest
import torch

from pfl_cli.attack.metrics import gaussian_window, psnr, ssim, window_size


def ssim_reference(x: np.ndarray, y: np.ndarray) -> float:
    """Wang et al. (2004) eq. (13), one window position and one channel at a time."""
    c, h, w = x.shape
    size = window_size(h, w)
    win = gaussian_window(size).numpy()
    c1, c2 = 0.01 ** 2, 0.03 ** 2
    values = []
    for ch in range(c):
        for i in range(h - size + 1):
            for j in range(w - size + 1):
                a, b = x[ch, i:i + size, j:j + size], y[ch, i:i + size, j:j + size]
                mu_a, mu_b = (win * a).sum(), (win * b).sum()
                var_a = (win * (a - mu_a) ** 2).sum()
                var_b = (win * (b - mu_b) ** 2).sum()
                cov = (win * (a - mu_a) * (b - mu_b)).sum()
                values.append((2 * mu_a * mu_b + c1) * (2 * cov + c2)
                              / ((mu_a ** 2 + mu_b ** 2 + c1) * (var_a + var_b + c2)))
    return float(np.mean(values))


def test_psnr_hand_computed():
    ref = torch.zeros(2, 1, 4, 4)
    x = ref.clone()
    x[0] += 0.1                      # MSE 0.01 -> 20 dB
    x[1, 0, 0, 0] = 1.0              # MSE 1/16 -> 10 log10(16) dB
    assert psnr(x, ref).tolist() == pytest.approx([20.0, 10 * math.log10(16)], abs=1e-4)
    assert float(psnr(ref[:1], ref[:1])) == pytest.approx(120.0)  # identical: capped, not infinite


def test_ssim_hand_computed():
    # Constant images: zero variances, so SSIM = (2ab + C1) / (a^2 + b^2 + C1) at every window.
    a, b = 0.2, 0.7
    x = torch.full((1, 1, 12, 12), a, dtype=torch.float64)
    y = torch.full((1, 1, 12, 12), b, dtype=torch.float64)
    expect = (2 * a * b + 1e-4) / (a * a + b * b + 1e-4)
    assert float(ssim(x, y)) == pytest.approx(expect, rel=1e-9)
    # Identical textured images: exactly 1; an image against its negative (x vs 1 - x) with mean 1/2
    # everywhere: luminance term 1, structure term (-2 var + C2) / (2 var + C2).
    rng = np.random.default_rng(0)
    img = torch.as_tensor(rng.random((1, 3, 16, 16)))
    assert float(ssim(img, img)) == pytest.approx(1.0, abs=1e-12)
    checker = torch.as_tensor(np.indices((11, 11)).sum(0) % 2, dtype=torch.float64)[None, None]
    s = float(ssim(checker, 1 - checker))  # 11x11: one window position
    win = gaussian_window(11).numpy()
    mu = float((win * checker[0, 0].numpy()).sum())
    var = float((win * (checker[0, 0].numpy() - mu) ** 2).sum())
    lum = (2 * mu * (1 - mu) + 1e-4) / (mu ** 2 + (1 - mu) ** 2 + 1e-4)
    assert s == pytest.approx(lum * (-2 * var + 9e-4) / (2 * var + 9e-4), rel=1e-9)


@pytest.mark.parametrize("shape", [(1, 8, 8), (3, 16, 13), (1, 11, 11)])
def test_ssim_matches_the_loop_reference(shape):
    rng = np.random.default_rng(1)
    x = rng.random((3, *shape))
    y = np.clip(x + 0.2 * rng.standard_normal(x.shape), 0, 1)
    got = ssim(torch.as_tensor(x), torch.as_tensor(y)).numpy()
    want = [ssim_reference(x[i], y[i]) for i in range(3)]
    np.testing.assert_allclose(got, want, rtol=1e-10, atol=1e-12)
    assert np.all(got < 1) and np.all(got > 0)
