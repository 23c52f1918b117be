"""Imports of the model zoos, with the one-line refusal when the ``models`` extra is absent."""

from __future__ import annotations

from pfl_cli.errors import InputError

EXTRA = "pip install 'pflx[models]'"


def _declare_torchvision_ops() -> None:
    """Let ``import torchvision`` succeed where its compiled ops cannot load.

    torchvision registers fake kernels for ``torchvision::nms`` and ``::qnms`` at import without checking that
    its C++ extension loaded, so a torchvision wheel built for another torch (a CUDA build beside a CPU torch)
    fails to import at all. pflx uses only ``torchvision.models``, pure Python: when the extension does not
    load, the two operator schemas are declared (without kernels; calling them still fails) so that the
    import, and the classification models, work.
    """
    import glob
    import importlib.util
    import os

    import torch

    spec = importlib.util.find_spec("torchvision")
    if spec is None or spec.origin is None:
        return
    try:
        torch.ops.torchvision.nms
        return
    except (AttributeError, RuntimeError):
        pass
    libraries = glob.glob(os.path.join(os.path.dirname(spec.origin), "_C*.so"))
    try:
        torch.ops.load_library(libraries[0])
        return
    except (OSError, IndexError, RuntimeError):
        for op in ("nms", "qnms"):
            torch.library.define(f"torchvision::{op}", "(Tensor dets, Tensor scores, float iou_threshold) -> Tensor")


def import_torchvision():
    try:
        _declare_torchvision_ops()
        import torchvision
    except ImportError:
        raise InputError(f"model_arch torchvision:NAME needs torchvision: {EXTRA}.") from None
    return torchvision


def import_timm():
    try:
        _declare_torchvision_ops()  # timm imports torchvision's transforms
        import timm
    except ImportError:
        raise InputError(f"model_arch timm:NAME needs timm: {EXTRA}.") from None
    return timm
