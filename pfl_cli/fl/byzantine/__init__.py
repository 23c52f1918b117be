"""Byzantine clients (issue 48): attacks as a federation condition (``--set attack=NAME attack_fraction=F``).

:mod:`.attacks` is the registry (one small class per attack), :mod:`.poison` alters the malicious clients' training
samples, :mod:`.threat` draws the malicious clients from the run's seed and corrupts their uploads at the server.
The robust aggregators that defend against them are :mod:`pfl_cli.fl.robust` (a protection). Not to be confused with
:mod:`pfl_cli.attack`, the gradient-inversion *privacy* attack on what an algorithm uploads.
"""

from __future__ import annotations

import math

from pfl_cli.fl.byzantine.attacks import ATTACKS

ATTACK_NAMES = tuple(ATTACKS)


def check_attack(cfg) -> None:
    """Refuse, in one line and before any work, an attack the algorithm cannot take."""
    from pfl_cli.errors import ConfigError
    from pfl_cli.fl.robust import averages_updates

    if cfg.attack == "none":
        return
    attack = ATTACKS[cfg.attack]
    if cfg.dp_epsilon is not None:
        raise ConfigError(f"attack {attack.name} with --dp: pflx's DP runs release no per-client accuracy, which "
                          "the attack's metrics are; drop one of them.")
    if attack.corrupts_updates and not averages_updates(cfg.algorithm_class):
        raise ConfigError(f"attack {attack.name} replaces the updates a server averages, and {cfg.algorithm!r} "
                          "declares no such server step (averages_updates); use attack=label-flip (data "
                          "poisoning, any algorithm) or an algorithm that declares it (fedavg, fedprox, scaffold, "
                          "fedrep, ...: the table of docs/robustness.md).")
    v = cfg.attack_scale
    if v is not None and (isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v)
                          or (attack.name != "alie" and v <= 0)):
        raise ConfigError(f"attack_scale must be a finite number > 0 for attack {attack.name} "
                          f"({attack.scale_meaning}); got {cfg.attack_scale!r}.")
