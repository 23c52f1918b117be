"""Gradient-inversion attacks on what clients upload (``pflx attack``; HyperFL §5, App. D)."""

from pfl_cli.lazy import lazy_names

# The names load on first use (PEP 562): the algorithms import pfl_cli.attack.protocol, and a train run
# found up to date loads no attack.
_WHERE = {"AttackConfig": "config", "AttackRun": "api", "attack_model": "api", "psnr": "metrics", "ssim": "metrics"}
__all__ = ["AttackConfig", "AttackRun", "attack_model", "psnr", "ssim"]

__getattr__, __dir__ = lazy_names(__name__, _WHERE)
