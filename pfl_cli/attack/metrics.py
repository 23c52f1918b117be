"""Image similarity of reconstructions: PSNR and SSIM, batched over images.

Both take images scaled to [0, 1] (data range 1), shaped (n, C, H, W).

SSIM is Wang, Bovik, Sheikh & Simoncelli (2004), eq. (13) with their constants
K1 = 0.01, K2 = 0.03 and an 11x11 Gaussian window of sigma 1.5, evaluated at every
position where the window fits ("valid") and averaged over positions and channels. Images
smaller than 11 pixels (digits are 8x8) use the largest odd window that fits.
"""

from __future__ import annotations

K1, K2 = 0.01, 0.03
WINDOW, SIGMA = 11, 1.5


def psnr(x, ref, *, eps: float = 1e-12):
    """Peak signal-to-noise ratio in dB of each image in ``x`` against ``ref`` (data range 1).

    PSNR = 10 log10(1 / MSE); identical images get 10 log10(1 / eps) instead of infinity.
    """
    import torch

    mse = (x - ref).pow(2).flatten(1).mean(1)
    return 10.0 * torch.log10(1.0 / mse.clamp_min(eps))


def window_size(height: int, width: int) -> int:
    """The Gaussian window's side: 11, or the largest odd size that fits the image."""
    size = min(WINDOW, height, width)
    return size if size % 2 else size - 1


def gaussian_window(size: int, sigma: float = SIGMA):
    """The normalized 2-D Gaussian window (size, size), as float64."""
    import torch

    r = torch.arange(size, dtype=torch.float64) - (size - 1) / 2
    g = torch.exp(-r.pow(2) / (2 * sigma ** 2))
    g = g / g.sum()
    return g[:, None] * g[None, :]


def ssim(x, ref):
    """Mean SSIM of each image of ``x`` (n, C, H, W) against ``ref`` in [0, 1]; a tensor (n,).

    Computed in float64 with one depthwise convolution per local statistic.
    """
    import torch
    import torch.nn.functional as F

    x, ref = x.to(torch.float64), ref.to(torch.float64)
    n, c, h, w = x.shape
    win = gaussian_window(window_size(h, w)).to(x.device)
    kernel = win.expand(c, 1, *win.shape)

    def local_mean(t):
        return F.conv2d(t, kernel, groups=c)

    mu_x, mu_y = local_mean(x), local_mean(ref)
    var_x = local_mean(x * x) - mu_x ** 2
    var_y = local_mean(ref * ref) - mu_y ** 2
    cov = local_mean(x * ref) - mu_x * mu_y
    c1, c2 = K1 ** 2, K2 ** 2
    s = ((2 * mu_x * mu_y + c1) * (2 * cov + c2)) / ((mu_x ** 2 + mu_y ** 2 + c1) * (var_x + var_y + c2))
    return s.flatten(1).mean(1)
