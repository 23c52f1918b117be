"""Rotated-image clients (thesis §5.5: Rotated MNIST / Fashion-MNIST, one rotation per client).

Each client draws one rotation from the given multiples of 90 degrees; ``clients.npz`` keeps
it (``rotation``, degrees) and every stage that loads the partition's data rotates each
client's samples (train and test) when the data are loaded, so the dataset on disk stays
as it is. Square images (C, H, H) rotate in their last two axes; flat vectors whose length
is a square (digits' 64 = 8 x 8) rotate as one-channel images.
"""

from __future__ import annotations

import math

import numpy as np

from pfl_cli.errors import ConfigError, InputError

ANGLES = (0, 90, 180, 270)


def check_rotations(rotations, input_shape) -> list[int]:
    """The rotation list as ints, checked against the rules and the data's sample shape."""
    values = rotations if isinstance(rotations, (list, tuple)) else [rotations]
    if not values or any(isinstance(r, bool) or not isinstance(r, (int, np.integer)) or r not in ANGLES
                         for r in values) or len(set(values)) != len(values):
        raise ConfigError(f"rotations must be distinct angles from {', '.join(map(str, ANGLES))} (degrees, "
                          f"comma-separated); got {rotations!r}.")
    if input_shape is not None:
        _square_side(tuple(input_shape))
    return [int(r) for r in values]


def _square_side(shape: tuple[int, ...]) -> int:
    if len(shape) >= 2 and shape[-1] == shape[-2]:
        return shape[-1]
    if len(shape) == 1 and math.isqrt(shape[0]) ** 2 == shape[0]:
        return math.isqrt(shape[0])
    raise InputError(f"rotations need square images (..., H, H) or flat vectors of a square length; the "
                     f"samples have shape {shape}.")


def draw_rotations(num_clients: int, rotations: list[int], rng: np.random.Generator) -> np.ndarray:
    """One rotation per client, uniform over ``rotations`` (int16 degrees)."""
    return np.asarray(rotations, dtype=np.int16)[rng.integers(len(rotations), size=num_clients)]


def rotate_clients(x: np.ndarray, partition) -> np.ndarray:
    """A copy of ``x`` with every client's train and test samples rotated by the client's angle.

    Parameters
    ----------
    x : ndarray (n_samples, *input_shape)
    partition : Partition with a ``rotation`` array (degrees, counter-clockwise)
    """
    side = _square_side(tuple(x.shape[1:]))
    flat = x.ndim == 2
    img = x.reshape(len(x), 1, side, side) if flat else x.copy()
    owner = np.concatenate([partition.train_owner(), partition.test_owner()])
    samples = np.concatenate([np.asarray(partition.train_indices), np.asarray(partition.test_indices)])
    angle = np.asarray(partition.rotation)[owner]
    if flat:
        img = img.copy()
    for degrees in np.unique(angle):  # four vectorized rotations, not one per client
        if degrees:
            idx = samples[angle == degrees]
            img[idx] = np.rot90(img[idx], k=int(degrees) // 90, axes=(-2, -1))
    return img.reshape(x.shape)
