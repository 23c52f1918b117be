"""IID: every client gets a uniformly random, equal-sized share of the samples."""

from __future__ import annotations

import numpy as np


def iid_owners(num_samples: int, *, num_clients: int, rng: np.random.Generator) -> tuple[np.ndarray, dict]:
    """Owner of each sample; client sizes differ by at most one.

    Parameters
    ----------
    num_samples : int
    num_clients : int
    rng : numpy.random.Generator

    Returns
    -------
    owner : ndarray of shape (num_samples,), int64
    info : dict
    """
    owner = np.empty(num_samples, dtype=np.int64)
    owner[rng.permutation(num_samples)] = np.arange(num_samples) % num_clients
    return owner, {}
