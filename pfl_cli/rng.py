"""Named random streams from one seed.

``make_rng(seed, "partition")`` returns a generator whose stream depends only on the
seed and the name, so adding a new stream never shifts an existing one. Core code
receives a generator explicitly and never touches numpy's, python's or torch's global
random state.
"""

from __future__ import annotations

import hashlib

import numpy as np


def _stable_id(name: str) -> int:
    # Python's hash() is salted per process; sha256 keeps streams identical across runs.
    return int.from_bytes(hashlib.sha256(name.encode()).digest()[:4], "little")


def seed_sequence(seed: int, name: str) -> np.random.SeedSequence:
    """The :class:`numpy.random.SeedSequence` of stream ``name`` under ``seed``."""
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or seed < 0:
        raise ValueError(f"seed must be a non-negative integer; got {seed!r}.")
    return np.random.SeedSequence(int(seed), spawn_key=(_stable_id(name),))


def make_rng(seed: int, name: str) -> np.random.Generator:
    """A numpy generator for stream ``name`` under ``seed``."""
    return np.random.Generator(np.random.PCG64(seed_sequence(seed, name)))


def torch_generator(seed: int, name: str, device: str = "cpu"):
    """A ``torch.Generator`` on ``device`` for stream ``name`` under ``seed``."""
    import torch

    state = seed_sequence(seed, name).generate_state(2, dtype=np.uint32)
    gen = torch.Generator(device=device)
    gen.manual_seed((int(state[0]) | (int(state[1]) << 32)) & 0x7FFF_FFFF_FFFF_FFFF)
    return gen
