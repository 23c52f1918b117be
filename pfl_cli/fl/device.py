"""``--device auto|cpu|cuda[:N]`` -> a ``torch.device``, refusing what this machine lacks."""

from __future__ import annotations

import re

from pfl_cli.errors import InputError


def check_device(spec: str = "auto") -> None:
    """Refuse what :func:`resolve_device` would refuse, importing torch only for a CUDA device: a run found up to
    date, or refused for another reason, answers without the ~3 CPU s of ``import torch``."""
    if str(spec).strip().lower() not in ("auto", "cpu"):
        resolve_device(spec)


def resolve_device(spec: str = "auto"):
    """The torch device named by ``spec``.

    ``auto`` is the first CUDA device when one is present, else the CPU. Asking for
    ``cuda`` on a machine without one is an input error, not a silent fall-back.
    """
    import torch

    text = str(spec).strip().lower()
    if text == "auto":
        return torch.device("cuda:0" if torch.cuda.is_available() else "cpu")
    if text == "cpu":
        return torch.device("cpu")
    match = re.fullmatch(r"cuda(?::(\d+))?", text)
    if not match:
        raise InputError(f"device must be auto, cpu or cuda[:N]; got {spec!r}.")
    if not torch.cuda.is_available():
        raise InputError(f"device {spec!r}: no CUDA device is available on this machine "
                         "(torch.cuda.is_available() is False); use --device cpu or --device auto.")
    index = int(match.group(1) or 0)
    if index >= torch.cuda.device_count():
        raise InputError(f"device {spec!r}: this machine has {torch.cuda.device_count()} CUDA device(s); "
                         f"index must be < {torch.cuda.device_count()}.")
    return torch.device(f"cuda:{index}")
