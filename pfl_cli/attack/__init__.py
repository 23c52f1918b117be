"""Gradient-inversion attacks on what clients upload (``pflx attack``; HyperFL §5, App. D)."""

from pfl_cli.attack.api import AttackRun, attack_model
from pfl_cli.attack.config import AttackConfig
from pfl_cli.attack.metrics import psnr, ssim

__all__ = ["AttackConfig", "AttackRun", "attack_model", "psnr", "ssim"]
