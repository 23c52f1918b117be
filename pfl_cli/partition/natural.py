"""Natural clients: one client per distinct id of the dataset's client column (LEAF users)."""

from __future__ import annotations

import numpy as np


def natural_owners(client: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Owner of each sample and the client names, in order of first appearance.

    Returns
    -------
    owner : ndarray of shape (n,), int64
    names : ndarray of shape (n_clients,) of str
    """
    names, first, inverse = np.unique(client, return_index=True, return_inverse=True)
    # np.unique sorts; re-rank by first appearance so LEAF's user order is kept.
    rank = np.empty(len(names), dtype=np.int64)
    rank[np.argsort(first, kind="stable")] = np.arange(len(names))
    return rank[inverse.ravel()], names[np.argsort(first, kind="stable")]
