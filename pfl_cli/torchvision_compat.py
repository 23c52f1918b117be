"""Importing torchvision (and what imports it: timm, transformers) beside a torch it was not built for.

The torchvision wheel a package index offers for a CPU-only torch may be a CUDA build (the only one this project's
offline index holds is): its compiled ops do not load, and torchvision's import then fails while registering fake
kernels for ``torchvision::nms`` / ``::qnms``, which takes transformers' model classes and peft down with it.
pflx needs none of those ops (only ``torchvision.models``' pure-Python nets and transformers' classifiers), so
:func:`declare_torchvision_ops` declares the two schemas, without kernels, when the extension cannot load:
calling them still fails, everything else imports. Where torchvision matches torch it does nothing.
"""

from __future__ import annotations


def declare_torchvision_ops() -> None:
    """Let ``import torchvision`` (and timm, transformers, peft) succeed where its compiled ops cannot load.

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
