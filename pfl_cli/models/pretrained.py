"""HyperFL-LPM's client net: a frozen pre-trained backbone, adapters, a linear classifier (HyperFL §3.3, App. D.1).

Backbones (HyperFL §3.3, App. D.1): ``vit-s16`` (timm's ViT-S/16 at 384 px) and ``resnet18``
(torchvision's, 224 px), each with a tiny configuration of the same family (``vit-micro``,
``resnet-micro``: random initialization, a few blocks) for CPU tests and smoke runs. Weights come
from a local file in the published key layout (:func:`load_backbone_state`); nothing is downloaded.

What trains is chosen by ``tune`` (HyperFL Table 2's columns):

- ``adapters``: backbone frozen, one adapter per block (down-projection, ReLU, up-projection; for the
  ViT with a LayerNorm on its output and a residual around it, after each block's MLP: 19,608 parameters
  per ViT-S block, 235,296 in all; for the ResNet one 1x1-conv adapter behind each residual block)
  and the classifier train. HyperFL-LPM's hypernetwork generates the adapters; the baselines marked
  ++ fine-tune them.
- ``probe``: backbone frozen, no adapters, only the classifier trains (the linear probe, +).
- ``full``: every backbone weight trains, no adapters (FedAvg FPT).

A frozen backbone's tensors are *buffers*, not parameters: ``torch.func.functional_call`` over a
cohort then passes per-client adapters and classifiers while every client reads the one shared
copy of the backbone, no optimizer sees it and no gradient is formed for it. Input resizing (and
1-channel to 3-channel, flat square vectors to images) is part of the forward pass.
"""

from __future__ import annotations

import hashlib
import math
from pathlib import Path
from typing import Sequence

import torch
import torch.nn.functional as F
from torch import nn

from pfl_cli.errors import ConfigError, InputError
from pfl_cli.models.resnet import ResNet, ResNetShape
from pfl_cli.models.vit import ViTShape, VisionTransformer

BACKBONES = {
    "vit-s16": ViTShape(image=384, patch=16, dim=384, depth=12, heads=6),
    "resnet18": ResNetShape(image=224, widths=(64, 128, 256, 512), blocks=(2, 2, 2, 2), stem=64),
    # Tiny members of the same families (random weights): tests and the CPU smoke recipe.
    "vit-micro": ViTShape(image=32, patch=8, dim=64, depth=2, heads=2),
    "resnet-micro": ResNetShape(image=32, widths=(16, 32), blocks=(1, 1), stem=16),
}
TUNES = ("adapters", "probe", "full")
REDUCTION = 16            # App. D.1: adapter bottleneck = width / 16 (384 -> 24 for ViT-S)
PUBLISHED_HEADS = {"vit": ("head.weight", "head.bias"), "resnet": ("fc.weight", "fc.bias")}  # ImageNet classifiers
SAFETENSORS_EXTRA = "pip install 'pflx[lpm]'"


def family(name: str) -> str:
    return "vit" if isinstance(BACKBONES[name], ViTShape) else "resnet"


class TokenAdapter(nn.Module):
    """x + LayerNorm(up(relu(down(x)))) on ViT tokens (HyperFL §3.3, App. D.1: down-projection, ReLU,
    up-projection; the authors' ViT adapter then normalizes the bottleneck's output before the residual)."""

    def __init__(self, width: int, bottleneck: int) -> None:
        super().__init__()
        self.down, self.up = nn.Linear(width, bottleneck), nn.Linear(bottleneck, width)
        self.norm = nn.LayerNorm(width, eps=1e-6)
        # Starts as the identity through the LayerNorm's gain (a zero up-projection would put the
        # LayerNorm at a zero input, where its gradient is scaled by 1 / sqrt(eps)).
        nn.init.zeros_(self.norm.weight)

    def forward(self, x):
        return x + self.norm(self.up(F.relu(self.down(x))))


class ConvAdapter(nn.Module):
    """x + up(relu(down(x))) with 1x1 convolutions, behind a ResNet residual block (App. D.1)."""

    def __init__(self, width: int, bottleneck: int) -> None:
        super().__init__()
        self.down, self.up = nn.Conv2d(width, bottleneck, 1), nn.Conv2d(bottleneck, width, 1)
        nn.init.zeros_(self.up.weight), nn.init.zeros_(self.up.bias)

    def forward(self, x):
        return x + self.up(F.relu(self.down(x)))


def adapter_parameters(width: int, kind: str = "vit") -> int:
    """Parameters of one adapter of ``width`` (ViT: 2w LayerNorm + w*b + b + b*w + w; 19,608 at w = 384)."""
    b = max(1, width // REDUCTION)
    return (2 * width if kind == "vit" else 0) + width * b + b + b * width + width


class PretrainedNet(nn.Module):
    """Backbone (+ adapters) + linear classifier ``head``; maps (B, *input_shape) to (B, classes) logits."""

    classifier = "head"  # the classifier's parameter prefix (pfl_cli.fl.split)

    def __init__(self, backbone: str, input_shape: Sequence[int], num_classes: int, tune: str = "adapters") -> None:
        super().__init__()
        shape = BACKBONES[backbone]
        self.input_shape, self.tune = tuple(input_shape), tune
        self.backbone = VisionTransformer(shape) if isinstance(shape, ViTShape) else ResNet(shape)
        self.image = shape.image
        if tune == "adapters":
            cls = TokenAdapter if isinstance(shape, ViTShape) else ConvAdapter
            self.adapters = nn.ModuleList(cls(w, max(1, w // REDUCTION)) for w in self.backbone.adapter_widths())
        self.head = nn.Linear(self.backbone.out_dim, num_classes)
        if tune != "full":
            freeze(self.backbone)

    def forward(self, x):
        return self.head(self.backbone(self.to_image(x), getattr(self, "adapters", None)))

    def to_image(self, x):
        """(B, *input_shape) -> (B, 3, image, image): square vectors as 1-channel images, gray to RGB, resize."""
        if x.dim() == 2:
            side = math.isqrt(x.shape[1])
            x = x.reshape(x.shape[0], 1, side, side)
        if x.shape[1] == 1:
            x = x.expand(-1, 3, -1, -1)
        if x.shape[-1] != self.image or x.shape[-2] != self.image:
            x = F.interpolate(x, size=(self.image, self.image), mode="bilinear", align_corners=False)
        return x


def freeze(module: nn.Module) -> None:
    """Turn every parameter of ``module`` into a buffer of the same name (same state-dict keys)."""
    for sub in module.modules():
        for name, p in list(sub._parameters.items()):
            if p is not None:
                del sub._parameters[name]
                sub.register_buffer(name, p.detach())


def check_backbone_input(input_shape: Sequence[int]) -> tuple[int, ...]:
    """Images (1 or 3, H, W) or flat vectors of a square length (8 x 8 digits)."""
    shape = tuple(int(s) for s in input_shape)
    ok = (len(shape) == 3 and shape[0] in (1, 3)) or (len(shape) == 1 and math.isqrt(shape[0]) ** 2 == shape[0])
    if not ok:
        raise InputError(f"backbone: input must be images (1 or 3, H, W) or square-length vectors; got {shape}.")
    return shape


def backbone_spec(name: str, input_shape: Sequence[int], num_classes: int, *, tune: str = "adapters",
                  weights: str | None = None) -> dict:
    """The JSON-able client spec of a :class:`PretrainedNet` (:func:`pfl_cli.models.build` rebuilds it).

    ``weights``: a local ``.pth`` / ``.safetensors`` file in the published layout, recorded with its
    sha256 so a later stage refuses a changed file; None: seeded random weights.
    """
    if name not in BACKBONES:
        raise ConfigError(f"backbone must be one of {', '.join(BACKBONES)}; got {name!r}.")
    if tune not in TUNES:
        raise ConfigError(f"backbone_tune must be one of {', '.join(TUNES)}; got {tune!r}.")
    spec = {"kind": "client", "arch": "backbone", "backbone": name, "tune": tune,
            "input_shape": list(check_backbone_input(input_shape)), "num_classes": int(num_classes)}
    if weights:
        path = Path(weights)
        if not path.is_file():
            raise ConfigError(f"backbone_weights: no such file {path}; give a local {name} state dict (.pth or .safetensors).")
        spec["weights"] = str(path)
        spec["weights_sha256"] = file_sha256(path)
    return spec


def build_pretrained(spec: dict) -> PretrainedNet:
    """The net of a :func:`backbone_spec`, its backbone loaded from the spec's weights file when it names one."""
    net = PretrainedNet(spec["backbone"], spec["input_shape"], spec["num_classes"], spec.get("tune", "adapters"))
    if spec.get("weights"):
        path = Path(spec["weights"])
        if not path.is_file():
            raise InputError(f"backbone_weights {path}: missing (no such file); the model was built with it: put "
                             "it back where it was, beside the artifacts.")
        if file_sha256(path) != spec.get("weights_sha256"):
            raise InputError(f"backbone_weights {path}: changed since the model was built (sha256 differs); give "
                             "the same file.")
        load_backbone_weights(net.backbone, path, spec["backbone"])
    return net


def file_sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def load_backbone_state(path: Path, what: str = "backbone_weights") -> dict[str, torch.Tensor]:
    """The tensors of a ``.safetensors`` file or a torch-saved state dict (``.pth``/``.pt``/``.bin``).

    A torch file is read with ``weights_only=True`` (no code runs); a dict nesting the weights
    under ``state_dict`` or ``model`` (training checkpoints) is unwrapped, and a pflx train artifact's
    ``model.pt`` gives the one client net it holds (:mod:`pfl_cli.models.trained`). ``what``: the config key that
    named the file, for messages.
    """
    where = f"{what} {path}"
    if path.suffix == ".safetensors":
        try:
            from safetensors.torch import load_file
        except ImportError:
            raise ConfigError(f"{where}: reading .safetensors needs the safetensors package: {SAFETENSORS_EXTRA}.") from None
        try:
            return load_file(str(path))
        except Exception as err:  # safetensors raises its own SafetensorError for a corrupt header
            raise InputError(f"{where}: not a readable safetensors file ({type(err).__name__}: {err}).") from None
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as err:  # pickle / zip errors of a file that is not a torch state dict
        raise InputError(f"{where}: not a readable torch state dict ({type(err).__name__}: {err}).") from None
    from pfl_cli.models.trained import is_model_payload, payload_state

    if is_model_payload(state):  # a pflx train artifact's model.pt: the one client net it holds, in its own layout
        return payload_state(state, where)[0]
    for key in ("state_dict", "model"):
        if isinstance(state, dict) and isinstance(state.get(key), dict):
            state = state[key]
    if not isinstance(state, dict) or not all(isinstance(v, torch.Tensor) for v in state.values()):
        raise InputError(f"{where}: must hold a state dict (name -> tensor); got {type(state).__name__}.")
    return state


def load_backbone_weights(backbone: nn.Module, path: Path, name: str) -> None:
    """Copy a published state dict into ``backbone`` by key, refusing the first missing, extra or misshapen key.

    The published ImageNet classifier (timm ``head.*``, torchvision ``fc.*``) is dropped: pflx's
    classifier replaces it.
    """
    state = load_backbone_state(path)
    expected = backbone.state_dict()
    layout = "timm ViT" if family(name) == "vit" else "torchvision ResNet"
    for key, tensor in expected.items():
        if key not in state:
            raise InputError(f"backbone_weights {path}: key {key!r} is missing; {name} needs {layout} keys "
                             f"({len(expected)} tensors).")
        if tuple(state[key].shape) != tuple(tensor.shape):
            raise InputError(f"backbone_weights {path}: key {key!r} has shape {tuple(state[key].shape)}; "
                             f"{name} expects {tuple(tensor.shape)}.")
    extra = [k for k in state if k not in expected and k not in PUBLISHED_HEADS[family(name)]]
    if extra:
        raise InputError(f"backbone_weights {path}: unexpected key {extra[0]!r}; not a {name} state dict in the "
                         f"{layout} layout.")
    with torch.no_grad():
        for key, tensor in expected.items():
            tensor.copy_(state[key].to(tensor.dtype))
