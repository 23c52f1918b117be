"""Reading folders of PNG files (CINIC-10, Omniglot) with Pillow, the ``hf`` extra's image decoder."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from pfl_cli.errors import DatasetError

PILLOW_EXTRA = "pip install 'pflx[hf]'"


def pillow_image(spec: str) -> Any:
    """``PIL.Image``, or a one-line refusal naming the extra that provides it."""
    try:
        from PIL import Image
    except ImportError:
        raise DatasetError(f"{spec}: reading PNG images needs Pillow, which is not installed: {PILLOW_EXTRA}.") from None
    return Image


def png_files(directory: Path, spec: str) -> list[Path]:
    """The ``*.png`` files of ``directory`` sorted by name; a directory without any is refused."""
    files = sorted(p for p in directory.glob("*.png") if p.is_file())
    if not files:
        raise DatasetError(f"{spec}: no *.png files in {directory}; the published layout has its images there.")
    return files


def read_pngs(paths: list[Path], mode: str, size: int | None, spec: str, *, side: int | None = None) -> np.ndarray:
    """Decode PNG files to one uint8 array (N, C, H, W), all images the same size.

    Parameters
    ----------
    paths : list of Path
    mode : str
        Pillow mode to convert to: ``"RGB"`` (C = 3) or ``"L"`` (C = 1). CINIC-10 mixes RGB with a few
        grayscale ImageNet images; converting gives every image the same channels.
    size : int or None
        Resize to ``size`` x ``size`` (Lanczos) when given.
    side : int, optional
        The published image side; every image must be ``side`` x ``side`` (else: the first image's size).
    spec : str
        The dataset spec, for messages.

    Raises
    ------
    DatasetError
        The extra is missing, a file that Pillow cannot decode, an image whose size differs from the first.
    """
    image_cls = pillow_image(spec)
    channels = 3 if mode == "RGB" else 1
    out = None if side is None else np.empty((len(paths), channels, side, side), dtype=np.uint8)
    like = f"the published {side}x{side}" if side is not None else paths[0].name
    for i, path in enumerate(paths):
        try:
            with image_cls.open(path) as img:
                img = img.convert(mode)
                if size is not None and img.size != (size, size):
                    img = img.resize((size, size), image_cls.LANCZOS)
                pixels = np.asarray(img, dtype=np.uint8)
        except (OSError, ValueError, SyntaxError) as err:  # Pillow's errors for a truncated or non-image file
            raise DatasetError(f"{spec}: {path}: not a readable PNG ({type(err).__name__}: {err}). Re-download it.") from None
        pixels = pixels.reshape(*pixels.shape[:2], channels).transpose(2, 0, 1)
        if out is None:
            out = np.empty((len(paths), *pixels.shape), dtype=np.uint8)
        elif pixels.shape != out.shape[1:]:
            raise DatasetError(
                f"{spec}: {path}: every image must be {out.shape[3]}x{out.shape[2]} like {like}; got "
                f"{pixels.shape[2]}x{pixels.shape[1]}."
            )
        out[i] = pixels
    assert out is not None, "read_pngs needs at least one file"
    return out
