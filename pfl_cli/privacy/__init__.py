"""Differential privacy shared by every DP stage: mechanisms, the ledger, accounting.

- :mod:`~pfl_cli.privacy.mechanisms` -- Gaussian (analytic or classic) and Laplace
  calibration, L2/L1 clipping, noise draws from an explicit generator (thesis §2.4).
- :mod:`~pfl_cli.privacy.events` -- dp_accounting events to and from plain JSON.
- :mod:`~pfl_cli.privacy.ledger` -- :class:`PrivacyLedger`, the ``privacy.json`` document.
- :mod:`~pfl_cli.privacy.accounting` -- epsilon by RDP or PLD, noise and steps calibration.
- :mod:`~pfl_cli.privacy.query` -- the four questions ``pflx privacy-account`` answers.
"""

from pfl_cli.privacy.accounting import (
    ACCOUNTANTS,
    NEIGHBORING,
    NoiseCalibration,
    StepsCalibration,
    cache_clear,
    cache_info,
    calibrate_noise,
    compute_epsilon,
    max_steps,
)
from pfl_cli.privacy.events import (
    event_from_dict,
    event_key,
    event_to_dict,
    laplace_event,
    sampled_gaussian_event,
    sampled_without_replacement_gaussian_event,
)
from pfl_cli.privacy.ledger import UNITS, PrivacyLedger, compose_ledgers
from pfl_cli.privacy.mechanisms import (
    clip_l1,
    clipped_gaussian_sum,
    clip_l2,
    gaussian_noise,
    gaussian_sigma,
    laplace_noise,
    laplace_scale,
    symmetric_gaussian_noise,
)

__all__ = [
    "ACCOUNTANTS",
    "NEIGHBORING",
    "UNITS",
    "NoiseCalibration",
    "PrivacyLedger",
    "StepsCalibration",
    "cache_clear",
    "cache_info",
    "calibrate_noise",
    "clip_l1",
    "clip_l2",
    "clipped_gaussian_sum",
    "compose_ledgers",
    "compute_epsilon",
    "event_from_dict",
    "event_key",
    "event_to_dict",
    "gaussian_noise",
    "gaussian_sigma",
    "laplace_event",
    "laplace_noise",
    "laplace_scale",
    "max_steps",
    "sampled_gaussian_event",
    "sampled_without_replacement_gaussian_event",
    "symmetric_gaussian_noise",
]
