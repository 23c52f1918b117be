"""Imports of the model zoos, with the one-line refusal when the ``models`` extra is absent."""

from __future__ import annotations

from pfl_cli.errors import InputError
from pfl_cli.torchvision_compat import declare_torchvision_ops

EXTRA = "pip install 'pflx[models]'"


def import_torchvision():
    try:
        declare_torchvision_ops()
        import torchvision
    except ImportError:
        raise InputError(f"model_arch torchvision:NAME needs torchvision: {EXTRA}.") from None
    return torchvision


def import_timm():
    try:
        declare_torchvision_ops()  # timm imports torchvision's transforms
        import timm
    except ImportError:
        raise InputError(f"model_arch timm:NAME needs timm: {EXTRA}.") from None
    return timm
