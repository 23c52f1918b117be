"""Noise calibration, clipping and noise draws for the DP stages (thesis §2.4, ch. 6).

The stages that add noise (``mdm-fit --dp``, ``cluster --dp``, DP training) share these
few primitives so that every one of them calibrates and clips the same way:

- :func:`gaussian_sigma` -- the Gaussian mechanism's standard deviation for one release.
  The default is the analytic Gaussian mechanism of Balle & Wang (2018), which the
  thesis's experiments use (the FedDP-KMeans code, through pfl-research's Gaussian mechanism);
  ``method="classic"`` is the textbook ``sqrt(2 ln(1.25/delta)) * S / epsilon`` of thesis §2.4.1.
- :func:`laplace_scale` -- ``S / epsilon`` for the Laplace mechanism (thesis §2.4.1, Lemma 16).
- :func:`clip_l2`, :func:`clip_l1` -- scale vectors (or a whole matrix) into a norm ball so
  that a sum of them has a known sensitivity (thesis D.7.4).
- :func:`gaussian_noise`, :func:`laplace_noise`, :func:`symmetric_gaussian_noise` -- draws
  from an explicit generator; nothing here touches a global random state.
"""

from __future__ import annotations

import math

import numpy as np

from pfl_cli.errors import check_param

GAUSSIAN_METHODS = ("analytic", "classic")


def _check_positive(name: str, value: float) -> float:
    ok = isinstance(value, (int, float, np.integer, np.floating)) and not isinstance(value, bool)
    check_param(name, ok and math.isfinite(value) and value > 0, "must be a finite number > 0", value)
    return float(value)


def _check_delta(delta: float) -> float:
    ok = isinstance(delta, (int, float, np.integer, np.floating)) and not isinstance(delta, bool)
    check_param("delta", ok and 0 < delta < 1, "must be in the open interval (0, 1)", delta)
    return float(delta)


def _check_rng(rng: object) -> np.random.Generator:
    if not isinstance(rng, np.random.Generator):
        raise TypeError(f"rng must be a numpy.random.Generator; got {type(rng).__name__}.")
    return rng


def gaussian_sigma(epsilon: float, delta: float, sensitivity: float = 1.0, *, method: str = "analytic") -> float:
    """Standard deviation of Gaussian noise that makes one release (epsilon, delta)-DP.

    Parameters
    ----------
    epsilon : float
        Target epsilon, > 0.
    delta : float
        Target delta, in (0, 1).
    sensitivity : float, default=1.0
        L2 sensitivity of the released quantity (a clipping bound, or Delta^2 for the
        sum of outer products of FedDP-Init step 1).
    method : {"analytic", "classic"}, default="analytic"
        ``"analytic"``: the smallest sigma for which the Gaussian mechanism is
        (epsilon, delta)-DP (Balle & Wang 2018, Theorem 8; exact, valid for every
        epsilon > 0). ``"classic"``: ``sqrt(2 ln(1.25/delta)) * sensitivity / epsilon``
        (Dwork & Roth 2014, thesis §2.4.1). The classic bound is proved only for
        epsilon < 1; for epsilon >= 1 it does not guarantee (epsilon, delta)-DP, so it
        is refused there.

    Returns
    -------
    float
        The noise standard deviation (already multiplied by ``sensitivity``).

    Raises
    ------
    InputError
        If a parameter is out of range, or ``method="classic"`` with epsilon >= 1.

    Examples
    --------
    >>> round(gaussian_sigma(1.0, 1e-6), 3)
    4.225
    >>> round(gaussian_sigma(0.5, 1e-5, 2.0, method="classic"), 4)
    19.3792
    """
    epsilon = _check_positive("epsilon", epsilon)
    delta = _check_delta(delta)
    sensitivity = _check_positive("sensitivity", sensitivity)
    check_param("method", method in GAUSSIAN_METHODS, f"must be one of {', '.join(GAUSSIAN_METHODS)}", method)
    if method == "classic":
        check_param(
            "epsilon",
            epsilon < 1,
            "must be < 1 for method='classic' (the 2 ln(1.25/delta) bound is proved only there)",
            epsilon,
            fix="Use method='analytic', which is exact for every epsilon.",
        )
        return math.sqrt(2.0 * math.log(1.25 / delta)) * sensitivity / epsilon
    # The analytic Gaussian mechanism of a sensitivity-1 query is scale invariant:
    # sigma(S) = S * sigma(1). dp_accounting solves Balle & Wang's Eq. (6) with brentq.
    from dp_accounting import get_sigma_gaussian

    return float(get_sigma_gaussian(epsilon, delta)) * sensitivity


def laplace_scale(epsilon: float, sensitivity: float = 1.0) -> float:
    """Scale ``b = sensitivity / epsilon`` of the Laplace mechanism: (epsilon, 0)-DP.

    ``sensitivity`` is the L1 sensitivity (thesis §2.4.1; Lemma 16 calls 1/epsilon a
    variance, but it is the scale).

    Examples
    --------
    >>> laplace_scale(0.5, 2.0)
    4.0
    """
    epsilon = _check_positive("epsilon", epsilon)
    sensitivity = _check_positive("sensitivity", sensitivity)
    return sensitivity / epsilon


def _clip(x: np.ndarray, bound: float, axis: int | None, order: int) -> np.ndarray:
    bound = _check_positive("bound", bound)
    x = np.asarray(x, dtype=np.float64)
    if axis is None:
        norm = np.linalg.norm(x.ravel(), ord=order)
    else:
        norm = np.linalg.norm(x, ord=order, axis=axis, keepdims=True)
    # Vectors inside the ball stay bit-for-bit unchanged (factor exactly 1), so
    # clipping is a no-op on data that already meets the bound (pflx tests/privacy).
    factor = np.where(norm > bound, bound / np.where(norm > 0, norm, 1.0), 1.0)
    return x * factor


def clip_l2(x: np.ndarray, bound: float, axis: int | None = -1) -> np.ndarray:
    """Scale each vector along ``axis`` to L2 norm at most ``bound`` (thesis D.7.4).

    Parameters
    ----------
    x : array_like
        Vectors (``axis=-1``: the rows of a matrix) or any array.
    bound : float
        The norm bound, > 0.
    axis : int or None, default=-1
        The axis holding each vector; ``None`` treats the whole array as one vector,
        which clips a matrix in Frobenius norm.

    Returns
    -------
    ndarray of float64, same shape as ``x``

    Examples
    --------
    >>> clip_l2([[3.0, 4.0], [0.3, 0.4]], 1.0).round(2).tolist()
    [[0.6, 0.8], [0.3, 0.4]]
    """
    return _clip(x, bound, axis, 2)


def clip_l1(x: np.ndarray, bound: float, axis: int | None = -1) -> np.ndarray:
    """Scale each vector along ``axis`` to L1 norm at most ``bound`` (thesis D.7.4).

    Same parameters as :func:`clip_l2`; used for histograms and counts, whose noise is
    Laplace calibrated to an L1 sensitivity.

    Examples
    --------
    >>> clip_l1([2.0, -2.0], 1.0).tolist()
    [0.5, -0.5]
    """
    return _clip(x, bound, axis, 1)


def gaussian_noise(shape: int | tuple[int, ...], sigma: float, rng: np.random.Generator) -> np.ndarray:
    """I.i.d. ``N(0, sigma^2)`` noise of ``shape`` drawn from ``rng``."""
    sigma = _check_positive("sigma", sigma)
    return _check_rng(rng).normal(0.0, sigma, size=shape)


def laplace_noise(shape: int | tuple[int, ...], scale: float, rng: np.random.Generator) -> np.ndarray:
    """I.i.d. ``Laplace(0, scale)`` noise of ``shape`` drawn from ``rng``."""
    scale = _check_positive("scale", scale)
    return _check_rng(rng).laplace(0.0, scale, size=shape)


def symmetric_gaussian_noise(d: int, sigma: float, rng: np.random.Generator) -> np.ndarray:
    """A symmetric ``d x d`` noise matrix for a symmetric statistic (FedDP-Init step 1).

    The upper triangle, diagonal included, holds i.i.d. ``N(0, sigma^2)`` draws and is
    mirrored below the diagonal, so the result is exactly symmetric. Noising only the
    d(d+1)/2 free entries is what the sensitivity of ``sum_i P_i P_i^T`` refers to
    (thesis §6.3.1, Algorithm 11).

    Examples
    --------
    >>> e = symmetric_gaussian_noise(3, 1.0, np.random.default_rng(0))
    >>> bool((e == e.T).all())
    True
    """
    ok = isinstance(d, (int, np.integer)) and not isinstance(d, bool) and d >= 1
    check_param("d", ok, "must be an integer >= 1", d)
    sigma = _check_positive("sigma", sigma)
    rows, cols = np.triu_indices(int(d))
    noise = np.zeros((int(d), int(d)))
    noise[rows, cols] = _check_rng(rng).normal(0.0, sigma, size=rows.size)
    noise[cols, rows] = noise[rows, cols]
    return noise


def clipped_gaussian_sum(rows: np.ndarray, *, clip: float, noise_multiplier: float,
                         rng: np.random.Generator, draws: int | None = None) -> np.ndarray:
    """The Gaussian sum mechanism: clip each row to L2 norm ``clip``, sum, add ``N(0, (z * clip)^2)``.

    Adding or removing one row moves the sum by at most ``clip``, so one release is the
    Gaussian mechanism with noise multiplier ``z`` (a ``GaussianDpEvent(z)``). This is the
    step of DP-FedAvg (McMahan et al. 2018): rows are client updates; dividing by a public
    (expected) cohort size afterwards is post-processing.

    ``draws`` returns that many independent releases of the same sum, shape (draws, d):
    what an empirical audit needs (:mod:`pfl_cli.privacy.audit`); each one costs epsilon.

    Examples
    --------
    >>> out = clipped_gaussian_sum(np.array([[3.0, 4.0], [0.3, 0.4]]), clip=1.0, noise_multiplier=1e-12,
    ...                            rng=np.random.default_rng(0))
    >>> out.round(6).tolist()
    [0.9, 1.2]
    """
    z = _check_positive("noise_multiplier", noise_multiplier)
    total = clip_l2(rows, clip, axis=1).sum(axis=0)
    shape = total.shape if draws is None else (int(draws), *total.shape)
    return total + gaussian_noise(shape, z * float(clip), rng)
