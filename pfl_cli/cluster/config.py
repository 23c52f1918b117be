"""The options of ``pflx cluster`` and the names they are checked against, without the numeric core.

A refused ``cluster`` (a missing flag, a bad value) reads only this module: the core
(:mod:`pfl_cli.cluster.api`) loads scipy and dp_accounting (~1.5 CPU s), which the refusal never
needs (issue 49, finding 20). :mod:`pfl_cli.cluster.api`, :mod:`~pfl_cli.cluster.baselines` and
:mod:`~pfl_cli.cluster.budget` re-export these names.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from pfl_cli.privacy.choices import UNITS
from pfl_cli.privacy.mechanisms import GAUSSIAN_METHODS
from pfl_cli.privacy.randomness import NOISE_MODES
from pfl_cli.schema import register_choices

SERVER_INITS = ("server-kmeans++", "server-lloyds", "sphere-packing", "random")
LLOYDS_CALIBRATIONS = ("basic_text", "pld_joint")
COMPOSITIONS = ("pld", "basic")
INITS = ("feddp", *SERVER_INITS, "kfed")
DEFAULT_DELTA = 1e-6


@dataclass(frozen=True)
class ClusterConfig:
    """Options of ``pflx cluster``; each field is the flag of the same name."""

    server_data: Optional[str] = None
    k: Optional[int] = None
    epsilon: Optional[float] = None
    delta: float = DEFAULT_DELTA
    no_dp: bool = False
    privacy_unit: str = "example"
    radius: Optional[float] = None
    split: Optional[list] = None
    min_server_weight: float = 5.0
    lloyds_steps: Optional[int] = None
    lloyds_calibration: str = "basic_text"
    composition: str = "pld"
    init: str = "feddp"
    client_clip: Optional[dict] = None
    k_candidates: Optional[list] = None
    server_n_init: int = 10
    reference_n_init: int = 2
    gaussian_method: str = "analytic"
    population: Optional[int] = None
    noise: str = "secure"            # --dp noise=: where the mechanisms draw (pfl_cli.privacy.randomness)
    write_nonprivate: bool = False
    seed: int = 0


register_choices(ClusterConfig, privacy_unit=UNITS, init=lambda: INITS, lloyds_calibration=LLOYDS_CALIBRATIONS,
                 composition=COMPOSITIONS, gaussian_method=GAUSSIAN_METHODS, noise=NOISE_MODES)
