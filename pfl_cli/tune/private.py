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
