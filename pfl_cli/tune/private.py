"""Private hyperparameter selection under ``--dp`` (Papernot & Steinke, "Hyperparameter tuning with Rényi
differential privacy", ICLR 2022).

Each trial is one run of a DP mechanism M: a DP training run (its ledger's events) followed by the
release of its validation score through the Gaussian mechanism (a noisy sum of the clients' accuracies,
each in [0, 1], and a noisy count of the scored clients: sensitivity 1 each under add/remove of a client,
or of one example, which changes one client's accuracy by at most 1). The number of runs K is random,
drawn from a truncated negative binomial distribution (§3, Theorem 2; shape eta = 1 is the truncated
geometric of §3.1), and only the best run's (config, noisy score) is released. The ledger records this
as dp_accounting's ``RepeatAndSelectDpEvent(event=M, mean, shape)``, which the RDP accountant bounds
(Theorem 2), so ``pflx privacy-account`` of the tune artifact states the whole study's epsilon.

Soundness needs every run to be the same mechanism: the searched keys may not change the training
ledger (rounds, cohort, batch and step counts are fixed; :data:`MECHANISM_KEYS`), trials are drawn
independently of each other (random search, no pruning: neither reads earlier private scores), and K
and the score noise come from OS entropy (``noise=seeded`` excepted, simulation only).
"""

from __future__ import annotations

import math
from typing import Sequence

import numpy as np

from pfl_cli.errors import ConfigError

# Keys whose value changes a DP training run's ledger (its steps, sampling rate or noise calibration).
MECHANISM_KEYS = ("rounds", "clients_per_round", "batch_size", "local_steps", "local_epochs", "eval_every",
                  "checkpoint_every", "label_mask", "val_fraction")


# The released score of a trial is noisy_sum / noisy_count over n scored clients, each Gaussian with standard
# deviation sigma (the score noise multiplier, sensitivity 1): by the delta method its standard error is
# sigma * sqrt(1 + s^2) / n at score s, between sigma / n (s = 0) and sigma * sqrt(2) / n (s = 1). Selection
# compares released scores, so it resolves differences of a few standard errors only.
DEFAULT_SCORE_NOISE = 3.0      # without a public federation size, and the most the default goes to
SCORE_SE_TARGET = 0.05         # the default noise aims at 5 points of standard error (at s = 1)
SCORE_SE_LIMIT = 0.10          # a study that cannot resolve 10 points (at s = 0, the best case) selects at random
MIN_DEFAULT_SCORE_NOISE = 0.5  # below this the score events' epsilon swamps the study's: no default goes lower


def score_standard_error(noise: float, clients: float, score: float = 1.0) -> float:
    """Delta-method standard error of a released score (a fraction) over ``clients`` scored clients."""
    return float(noise) * math.sqrt(1.0 + float(score) ** 2) / max(float(clients), 1.0)


def scored_clients_bound(population: int | None, group: str, validation_clients: float) -> float | None:
    """The most clients a trial's score can average over, from the public population bound only (the number
    of clients is private: a default read from it would release it): every train client (objective group
    ``train``) or the validation clients' share of them (``holdout``)."""
    if population is None:
        return None
    return float(population) * (validation_clients if group == "holdout" else 1.0)


def resolve_score_noise(noise: float, explicit: bool, *, population: int | None, group: str,
                        validation_clients: float) -> float:
    """``--dp-score-noise``: the user's, checked, or the default from the public federation size.

    Default: the noise at which a score over the most clients the population bound allows has a
    standard error of :data:`SCORE_SE_TARGET`, at most :data:`DEFAULT_SCORE_NOISE`. Refused (one line) when
    the study cannot select: the given noise leaves a standard error above :data:`SCORE_SE_LIMIT` even over
    that many clients, or the default would fall below :data:`MIN_DEFAULT_SCORE_NOISE`.
    """
    n = scored_clients_bound(population, group, validation_clients)
    if n is None:
        return float(noise) if explicit else DEFAULT_SCORE_NOISE
    what = "validation clients" if group == "holdout" else "train clients"
    if explicit:
        se = score_standard_error(noise, n, 0.0)
        if se > SCORE_SE_LIMIT:
            top = SCORE_SE_LIMIT * n
            raise ConfigError(f"--dp-score-noise {noise:g}: a trial's released score over at most {n:g} {what} "
                              f"(--dp population={population}) has a standard error of at least {100 * se:.1f} "
                              f"points, above the {100 * SCORE_SE_LIMIT:g} a selection must resolve, so the study "
                              f"would select at random; give --dp-score-noise {top:.3g} or less (it spends more "
                              "epsilon) or tune on more clients.")
        return float(noise)
    default = min(DEFAULT_SCORE_NOISE, SCORE_SE_TARGET * n / math.sqrt(2.0))
    if default < MIN_DEFAULT_SCORE_NOISE:
        raise ConfigError(f"--dp-score-noise: at most {n:g} {what} (--dp population={population}) are too few for a "
                          f"private selection: a score noise of {MIN_DEFAULT_SCORE_NOISE:g} already leaves a standard "
                          f"error of {100 * score_standard_error(MIN_DEFAULT_SCORE_NOISE, n):.1f} points; tune on "
                          "more clients, or give --dp-score-noise explicitly (a smaller noise spends more epsilon).")
    return round(default, 4)


def check_private_space(params: Sequence) -> None:
    for p in params:
        if p.key in MECHANISM_KEYS:
            raise ConfigError(f"--space {p.key}: under --dp every trial must be the same DP mechanism, and {p.key} "
                              "changes its privacy ledger (steps, sampling or calibration); fix it with a flag "
                              "instead of searching it.")


def tnb_gamma(mean: float, shape: float) -> float:
    """The gamma of the truncated negative binomial with ``shape`` (eta > 0) whose mean is ``mean`` (> 1).

    Mean of TNB(eta, gamma) on {1, 2, ...}: eta (1 - gamma) / (gamma (1 - gamma^eta)) (Papernot & Steinke §3).
    """
    from scipy.optimize import brentq

    if not (math.isfinite(mean) and mean > 1):
        raise ConfigError(f"--trials under --dp is the mean number of trials and must be > 1; got {mean!r}.")
    if not (math.isfinite(shape) and shape > 0):
        raise ConfigError(f"--dp-shape must be a finite number > 0; got {shape!r}.")

    def excess(g: float) -> float:
        return shape * (1 - g) / (g * (1 - g ** shape)) - mean

    return float(brentq(excess, 1e-12, 1 - 1e-12, xtol=1e-14))


def draw_trial_count(mean: float, shape: float, rng: np.random.Generator, *, cap: int = 100_000) -> int:
    """K ~ TNB(shape, gamma(mean)): a negative binomial draw, redrawn while 0 (the truncation)."""
    gamma = tnb_gamma(mean, shape)
    while True:
        k = int(rng.negative_binomial(shape, gamma))
        if k >= 1:
            return min(k, cap)


def release_score(accuracies: np.ndarray, noise_multiplier: float, rng: np.random.Generator) -> dict:
    """The Gaussian release of a trial's score: noisy sum of per-client accuracies and noisy count.

    ``accuracies``: each scored client's accuracy in [0, 1] (NaN for a client without samples: not counted).
    """
    acc = np.asarray(accuracies, dtype=np.float64)
    acc = np.clip(acc[np.isfinite(acc)], 0.0, 1.0)  # the sensitivity bound holds whatever a client scores
    noisy_sum = float(acc.sum() + noise_multiplier * rng.standard_normal())
    noisy_count = float(len(acc) + noise_multiplier * rng.standard_normal())
    return {"noisy_sum": noisy_sum, "noisy_count": noisy_count,
            "score": noisy_sum / max(noisy_count, 1.0)}


def score_events(noise_multiplier: float) -> list:
    from dp_accounting import dp_event

    return [dp_event.GaussianDpEvent(noise_multiplier), dp_event.GaussianDpEvent(noise_multiplier)]


def repeat_and_select(trial_events: Sequence, mean: float, shape: float):
    """The study's event: the trial mechanism (its events composed) repeated K ~ TNB(shape, mean) times, best kept."""
    from dp_accounting import dp_event

    return dp_event.RepeatAndSelectDpEvent(dp_event.ComposedDpEvent(list(trial_events)), float(mean), float(shape))
