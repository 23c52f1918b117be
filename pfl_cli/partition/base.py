"""The partition result shared by every scheme (and by ``simulate``).

A partition is stored in CSR form (DESIGN.md section 3): client ``j``'s train samples are
``train_indices[train_offsets[j]:train_offsets[j + 1]]``, indices into the dataset's
sample order; likewise for test samples. ``role`` is 0 for train clients and 1 for
holdout clients that training never sees.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

import numpy as np

ROLE_TRAIN = 0
ROLE_HOLDOUT = 1


def offsets_from_sizes(sizes: np.ndarray) -> np.ndarray:
    """CSR offsets ``[0, s0, s0 + s1, ...]`` of length ``len(sizes) + 1``."""
    offsets = np.zeros(len(sizes) + 1, dtype=np.int64)
    np.cumsum(sizes, out=offsets[1:])
    return offsets


def stable_argsort(keys: np.ndarray, num_keys: int) -> np.ndarray:
    """Stable argsort of integer ``keys`` in ``[0, num_keys)``.

    Keys that fit 16 bits are sorted as uint16, which numpy sorts with a radix sort:
    about 25x faster than the merge sort it uses for int64 on a million keys.
    """
    if num_keys <= 1 << 16:
        keys = keys.astype(np.uint16)
    return np.argsort(keys, kind="stable")


def csr_from_assignment(owner: np.ndarray, num_clients: int, indices: np.ndarray | None = None):
    """CSR ``(offsets, indices)`` from ``owner[i]`` = client of sample ``indices[i]``.

    Within a client the sample order of ``indices`` is kept (a stable sort), so the
    result is deterministic. Samples with ``owner < 0`` are dropped.
    """
    owner = np.asarray(owner)
    if owner.dtype.kind not in "iu":
        owner = owner.astype(np.int64)
    if indices is None:
        indices = np.arange(len(owner), dtype=np.int64)
    indices = np.asarray(indices, dtype=np.int64)
    if len(owner) and owner.min() < 0:
        keep = owner >= 0
        owner, indices = owner[keep], indices[keep]
    sizes = np.bincount(owner, minlength=num_clients)
    if np.all(owner[1:] >= owner[:-1]):  # already grouped by client (a CSR re-split): the stable sort is the identity
        return offsets_from_sizes(sizes), indices.copy()
    return offsets_from_sizes(sizes), indices[stable_argsort(owner, num_clients)]


def csr_from_lists(lists: Sequence[np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """CSR ``(offsets, indices)`` from one index array per client (tests, small inputs)."""
    sizes = np.array([len(a) for a in lists], dtype=np.int64)
    flat = np.concatenate([np.asarray(a, dtype=np.int64) for a in lists]) if lists else np.zeros(0, np.int64)
    return offsets_from_sizes(sizes), flat


@dataclass(frozen=True)
class Partition:
    """Clients' train and test sample indices, in CSR form.

    Attributes
    ----------
    client_id : ndarray of shape (n_clients,), int64
    role : ndarray of shape (n_clients,), uint8
        0 = train client, 1 = holdout client.
    train_offsets, test_offsets : ndarray of shape (n_clients + 1,), int64
    train_indices, test_indices : ndarray, int64
    client_name : ndarray of shape (n_clients,) of str, optional
        Natural client ids (LEAF users), when the partition has them.
    labeled : ndarray of shape (n_clients,), uint8, optional
        1 = the client's labels are visible, 0 = an unlabeled client (``--label-prevalence``);
        absent: every client keeps the labels its dataset has.
    rotation : ndarray of shape (n_clients,), int16, optional
        Degrees each client's images are rotated by when the data are loaded (``--rotations``).
    info : mapping
        What the scheme did (repairs, shortages); goes into ``stats.json``.
    """

    client_id: np.ndarray
    role: np.ndarray
    train_offsets: np.ndarray
    train_indices: np.ndarray
    test_offsets: np.ndarray
    test_indices: np.ndarray
    client_name: np.ndarray | None = None
    info: Mapping[str, Any] = field(default_factory=dict)
    labeled: np.ndarray | None = None
    rotation: np.ndarray | None = None

    @property
    def num_clients(self) -> int:
        return len(self.client_id)

    @property
    def train_sizes(self) -> np.ndarray:
        return np.diff(self.train_offsets)

    @property
    def test_sizes(self) -> np.ndarray:
        return np.diff(self.test_offsets)

    def train_of(self, j: int) -> np.ndarray:
        return self.train_indices[self.train_offsets[j] : self.train_offsets[j + 1]]

    def test_of(self, j: int) -> np.ndarray:
        return self.test_indices[self.test_offsets[j] : self.test_offsets[j + 1]]

    def train_owner(self) -> np.ndarray:
        """Client position of each entry of ``train_indices``."""
        return np.repeat(np.arange(self.num_clients), self.train_sizes)

    def test_owner(self) -> np.ndarray:
        return np.repeat(np.arange(self.num_clients), self.test_sizes)

    def clients_with_role(self, role: int) -> np.ndarray:
        return np.flatnonzero(self.role == role)

    def to_arrays(self) -> dict[str, np.ndarray]:
        arrays = {
            "client_id": np.asarray(self.client_id, dtype=np.int64),
            "role": np.asarray(self.role, dtype=np.uint8),
            "train_offsets": np.asarray(self.train_offsets, dtype=np.int64),
            "train_indices": np.asarray(self.train_indices, dtype=np.int64),
            "test_offsets": np.asarray(self.test_offsets, dtype=np.int64),
            "test_indices": np.asarray(self.test_indices, dtype=np.int64),
        }
        if self.client_name is not None:
            arrays["client_name"] = np.asarray(self.client_name, dtype=str)
        if self.labeled is not None:
            arrays["labeled"] = np.asarray(self.labeled, dtype=np.uint8)
        if self.rotation is not None:
            arrays["rotation"] = np.asarray(self.rotation, dtype=np.int16)
        return arrays

    @classmethod
    def from_arrays(cls, arrays: Mapping[str, np.ndarray], info: Mapping[str, Any] | None = None) -> "Partition":
        return cls(
            client_id=np.asarray(arrays["client_id"], dtype=np.int64),
            role=np.asarray(arrays["role"], dtype=np.uint8),
            train_offsets=np.asarray(arrays["train_offsets"], dtype=np.int64),
            train_indices=np.asarray(arrays["train_indices"], dtype=np.int64),
            test_offsets=np.asarray(arrays["test_offsets"], dtype=np.int64),
            test_indices=np.asarray(arrays["test_indices"], dtype=np.int64),
            client_name=arrays.get("client_name"),
            info=dict(info or {}),
            labeled=None if arrays.get("labeled") is None else np.asarray(arrays["labeled"], dtype=np.uint8),
            rotation=None if arrays.get("rotation") is None else np.asarray(arrays["rotation"], dtype=np.int16),
        )

    def check(self, num_samples: int) -> None:
        """Raise ``ValueError`` unless the CSR arrays are consistent and in range."""
        n = self.num_clients
        for name in ("train", "test"):
            off = getattr(self, f"{name}_offsets")
            idx = getattr(self, f"{name}_indices")
            if off.shape != (n + 1,) or off[0] != 0 or off[-1] != len(idx) or np.any(np.diff(off) < 0):
                raise ValueError(f"{name}_offsets is not a valid CSR offset array for {n} clients.")
            if len(idx) and (idx.min() < 0 or idx.max() >= num_samples):
                raise ValueError(f"{name}_indices has entries outside [0, {num_samples}).")
        if self.role.shape != (n,) or not np.isin(self.role, (ROLE_TRAIN, ROLE_HOLDOUT)).all():
            raise ValueError("role must hold 0 (train) or 1 (holdout) for every client.")
        if self.client_name is not None and len(self.client_name) != n:
            raise ValueError("client_name must have one entry per client.")
        if self.labeled is not None and (self.labeled.shape != (n,) or not np.isin(self.labeled, (0, 1)).all()):
            raise ValueError("labeled must hold 0 or 1 for every client.")
        if self.rotation is not None and (self.rotation.shape != (n,) or not np.isin(self.rotation, (0, 90, 180, 270)).all()):
            raise ValueError("rotation must hold 0, 90, 180 or 270 for every client.")
