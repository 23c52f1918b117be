"""Model kind ``torchvision:NAME``: a classification model of ``torchvision.models``, random init.

Built as ``torchvision.models.get_model(NAME, weights=None, num_classes=C, **model_kwargs)``: nothing is
downloaded. Pre-trained weights come from a local file (``model_weights``) in torchvision's key layout,
recorded with its sha256; an ImageNet classifier of another width is skipped (:func:`.net.load_weights`).
"""

from __future__ import annotations

import difflib

from pfl_cli.errors import InputError
from pfl_cli.models.kinds._imports import import_torchvision

EXTRA = "models"


def source(name: str):
    return None


def make(name: str, input_shape, num_classes: int, kwargs: dict):
    tv = import_torchvision()
    names = tv.models.list_models(module=tv.models)  # the classification models
    if name not in names:
        near = difflib.get_close_matches(name, names, n=1)
        tip = f" (did you mean {near[0]!r}?)" if near else ""
        raise InputError(f"model_arch torchvision:{name}: not a torchvision classification model{tip}; "
                         "torchvision.models.list_models() lists them.")
    if "weights" in kwargs or "pretrained" in kwargs:
        raise InputError("model_kwargs: torchvision weights are never downloaded; give a local state dict with "
                         "--set model_weights=PATH instead of weights / pretrained.")
    if len(input_shape) != 3 or input_shape[0] != 3:
        raise InputError(f"model_arch torchvision:{name} reads RGB images (3, H, W); got input shape "
                         f"{tuple(input_shape)}. Use a factory: or timm: net (timm takes in_chans), or a built-in.")
    try:
        return tv.models.get_model(name, weights=None, num_classes=num_classes, **kwargs)
    except (TypeError, ValueError) as err:
        raise InputError(f"model_kwargs {kwargs!r} for torchvision:{name}: {err}.") from None
