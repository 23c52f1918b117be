"""LPIPS (Zhang et al. 2018, "lin" variant on AlexNet) from a local weights file; nothing is downloaded.

The file is one state dict holding torchvision's AlexNet ``features.{0,3,6,8,10}.{weight,bias}``
and the LPIPS linear layers ``lin{0..4}.model.1.weight`` (the ``lpips`` package's ``alex.pth``);
merge the two published files into one ``torch.save``'d dict. Images are (n, C, H, W) in [0, 1]
(one channel is repeated to three), at least 32x32 (AlexNet's first layer strides by 4).

LPIPS(x, y) = sum over the five ReLU outputs l of the spatial mean of
w_l . (f_l(x)/|f_l(x)| - f_l(y)/|f_l(y)|)^2, with features unit-normalized over channels.
"""

from __future__ import annotations

from pathlib import Path

from pfl_cli.errors import InputError

CONVS = {0: (64, 3, 11), 3: (192, 64, 5), 6: (384, 192, 3), 8: (256, 384, 3), 10: (256, 256, 3)}
STRIDE_PAD = {0: (4, 2), 3: (1, 2), 6: (1, 1), 8: (1, 1), 10: (1, 1)}
POOL_AFTER = (0, 3)               # max-pool 3/2 before the next conv
SHIFT = (-0.030, -0.088, -0.188)  # the lpips package's ScalingLayer, on inputs in [-1, 1]
SCALE = (0.458, 0.448, 0.450)
MIN_SIZE = 32


def expected_shapes() -> dict[str, tuple[int, ...]]:
    shapes = {}
    for i, (out, inp, k) in CONVS.items():
        shapes[f"features.{i}.weight"] = (out, inp, k, k)
        shapes[f"features.{i}.bias"] = (out,)
    for j, i in enumerate(CONVS):
        shapes[f"lin{j}.model.1.weight"] = (1, CONVS[i][0], 1, 1)
    return shapes


def load_lpips_weights(path: str | Path) -> dict:
    """The LPIPS state dict at ``path``, or :class:`InputError` saying what is wrong with it."""
    import torch

    try:
        state = torch.load(path, weights_only=True, map_location="cpu")
    except Exception as err:  # noqa: BLE001
        raise InputError(f"--lpips-weights {path}: not a readable torch state dict ({type(err).__name__}).") from None
    if not isinstance(state, dict) or not all(isinstance(v, torch.Tensor) for v in state.values()):
        raise InputError(f"--lpips-weights {path}: expected a state dict (name -> tensor); got {type(state).__name__}.")
    want = expected_shapes()
    missing = [k for k in want if k not in state]
    wrong = [k for k in want if k in state and tuple(state[k].shape) != want[k]]
    if missing or wrong:
        what = f"missing {missing[:3]}" if missing else f"{wrong[0]} has shape {tuple(state[wrong[0]].shape)}"
        raise InputError(f"--lpips-weights {path}: not an AlexNet LPIPS state dict ({what}; expected AlexNet "
                         "features.N.* and lpips lin0..lin4.model.1.weight).")
    return {k: state[k].to(torch.float32) for k in want}


def lpips(x, y, weights: dict):
    """LPIPS distance of each pair of images (n, C, H, W) in [0, 1]; a tensor (n,)."""
    import torch
    import torch.nn.functional as F

    if x.shape[-1] < MIN_SIZE or x.shape[-2] < MIN_SIZE:
        raise InputError(f"lpips: needs images of at least {MIN_SIZE}x{MIN_SIZE}; got {tuple(x.shape[-2:])}.")
    w = {k: v.to(x.device) for k, v in weights.items()}
    shift = torch.tensor(SHIFT, device=x.device).view(1, 3, 1, 1)
    scale = torch.tensor(SCALE, device=x.device).view(1, 3, 1, 1)

    def taps(img):
        h = img.to(torch.float32)
        h = h.expand(-1, 3, -1, -1) if h.shape[1] == 1 else h
        h = ((2 * h - 1) - shift) / scale
        out = []
        for i in CONVS:
            stride, pad = STRIDE_PAD[i]
            h = F.relu(F.conv2d(h, w[f"features.{i}.weight"], w[f"features.{i}.bias"], stride=stride, padding=pad))
            out.append(h)
            if i in POOL_AFTER:
                h = F.max_pool2d(h, 3, 2)
        return out

    total = 0
    for j, (a, b) in enumerate(zip(taps(x), taps(y))):
        a = a / (a.pow(2).sum(1, keepdim=True).sqrt() + 1e-10)
        b = b / (b.pow(2).sum(1, keepdim=True).sqrt() + 1e-10)
        total = total + F.conv2d((a - b) ** 2, w[f"lin{j}.model.1.weight"]).mean((1, 2, 3))
    return total
