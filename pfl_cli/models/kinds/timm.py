"""Model kind ``timm:NAME``: a model of ``timm`` (PyTorch Image Models), random init.

Built as ``timm.create_model(NAME, pretrained=False, num_classes=C, in_chans=channels, **model_kwargs)``:
nothing is downloaded. Weights come from a local file (``model_weights``) in timm's key layout, recorded
with its sha256. timm's tiny ``test_*`` models (``test_resnet``, ``test_efficientnet_gn``, ``test_vit``)
make smoke runs; a ViT whose position embedding is fixed to its default image size takes ``img_size`` in
``model_kwargs`` (the check forward pass at the start of a run says so when the images do not fit).
"""

from __future__ import annotations

import difflib

from pfl_cli.errors import InputError
from pfl_cli.models.kinds._imports import import_timm

EXTRA = "models"


def source(name: str):
    return None


def make(name: str, input_shape, num_classes: int, kwargs: dict):
    timm = import_timm()
    if not timm.is_model(name):
        near = difflib.get_close_matches(name, timm.list_models(), n=1)
        tip = f" (did you mean {near[0]!r}?)" if near else ""
        raise InputError(f"model_arch timm:{name}: not a timm model{tip}; timm.list_models() lists them.")
    if "pretrained" in kwargs or "pretrained_cfg_overlay" in kwargs:
        raise InputError("model_kwargs: timm weights are never downloaded; give a local state dict with "
                         "--set model_weights=PATH instead of pretrained.")
    if len(input_shape) != 3:
        raise InputError(f"model_arch timm:{name} reads images (C, H, W); got input shape {tuple(input_shape)}.")
    options = {"in_chans": int(input_shape[0]), **kwargs, "num_classes": num_classes}
    try:
        return timm.create_model(name, pretrained=False, **options)
    except (TypeError, ValueError, AssertionError) as err:
        raise InputError(f"model_kwargs {kwargs!r} for timm:{name}: {err}.") from None
