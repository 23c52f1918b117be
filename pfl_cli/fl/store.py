"""Clients' data as device tensors, loaded once: the engine's client store.

Every client's sample indices are kept as one padded matrix per split (``fit``: the
samples a client trains on and builds descriptors from; ``val``: train clients' model
selection samples; ``test``), so a cohort's batches are gathered with one indexing op.
Inputs stay in their native dtype on the device (CIFAR stays uint8) and are converted
and standardized per batch.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from pfl_cli.errors import InputError
from pfl_cli.fl.client_state import partition_digest

ROLE_TRAIN, ROLE_HOLDOUT = 0, 1


@dataclass
class Padded:
    """Per-client sample lists as a padded (n_clients, width) index matrix plus lengths."""

    index: "object"   # LongTensor (n_clients, width), padding points at sample 0
    length: "object"  # LongTensor (n_clients,)

    @classmethod
    def from_csr(cls, owner: np.ndarray, samples: np.ndarray, num_clients: int, device) -> "Padded":
        """From each sample's owning client (non-decreasing) and the sample indices."""
        import torch

        lengths = np.bincount(owner, minlength=num_clients).astype(np.int64)
        width = max(int(lengths.max(initial=0)), 1)
        mat = np.zeros((num_clients, width), dtype=np.int64)
        starts = np.cumsum(lengths) - lengths
        mat[owner, np.arange(len(owner)) - starts[owner]] = samples
        return cls(torch.as_tensor(mat, device=device), torch.as_tensor(lengths, device=device))

    def rows(self, clients):
        """Index matrix and lengths of ``clients``, trimmed to their longest list."""
        length = self.length[clients]
        width = max(int(length.max()) if len(length) else 1, 1)
        return self.index[clients, :width], length


def normalization_stats(x: np.ndarray, idx: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Mean and std of samples ``idx``: per channel for images (N, C, H, W), per feature otherwise."""
    sample = np.asarray(x[idx], dtype=np.float64)
    if sample.shape[0] == 0:
        raise InputError("normalize: the train clients hold no samples to compute input statistics from.")
    axes = (0, 2, 3) if sample.ndim == 4 else (0,)
    mean = sample.mean(axis=axes, keepdims=True)[0]
    std = sample.std(axis=axes, keepdims=True)[0]
    std = np.where(std < 1e-8, 1.0, std)  # constant features (digits' border pixels) pass through
    return mean.astype(np.float32), std.astype(np.float32)


def split_validation(owner: np.ndarray, is_train: np.ndarray, fraction: float, rng) -> np.ndarray:
    """Which train samples each train client holds out for model selection (a bool mask).

    Client i holds out ``floor(fraction * n_i)`` of its samples, chosen uniformly at random,
    and keeps at least one to train on; holdout clients keep everything.
    """
    sizes = np.bincount(owner, minlength=len(is_train))
    if fraction == 0 or len(owner) == 0:
        return np.zeros(len(owner), dtype=bool)
    n_val = np.minimum(np.floor(fraction * sizes).astype(np.int64), np.maximum(sizes - 1, 0)) * is_train
    order = np.lexsort((rng.random(len(owner)), owner))  # a random order inside each client
    rank = np.empty(len(owner), dtype=np.int64)
    rank[order] = np.arange(len(owner)) - (np.cumsum(sizes) - sizes)[owner[order]]
    return rank < n_val[owner]


@dataclass
class ClientStore:
    """The tensors a training or prediction run reads, resident on one device.

    Attributes
    ----------
    x : Tensor (n_samples, *input_shape), native dtype
    y : LongTensor (n_samples,)
    mean, std : Tensor broadcastable to one input
    fit, val, test : Padded
    classes : BoolTensor (n_clients, num_classes)
        Classes present in each client's train data (fit + val): the label mask.
    role, client_id : ndarray (n_clients,)
    """

    x: object
    y: object
    mean: object
    std: object
    fit: Padded
    val: Padded
    test: Padded
    classes: object
    role: np.ndarray
    client_id: np.ndarray
    num_classes: int
    input_shape: tuple[int, ...]
    device: object
    partition_sha: bytes = b""  # fl.client_state.partition_digest: ties private per-client state to its clients

    @property
    def num_clients(self) -> int:
        return len(self.role)

    def clients(self, role: int) -> np.ndarray:
        return np.flatnonzero(self.role == role)

    def inputs(self, index):
        """Standardized float32 inputs of sample ``index`` (any shape of indices)."""
        import torch

        x = self.x[index].to(torch.float32)
        return (x - self.mean) / self.std

    def onehot(self, index):
        import torch

        return torch.nn.functional.one_hot(self.y[index], self.num_classes).to(torch.float32)


def build_store(x: np.ndarray, y: np.ndarray, num_classes: int, partition, *, val_fraction: float, rng, device,
                normalize: bool = True, stats: tuple[np.ndarray, np.ndarray] | None = None) -> ClientStore:
    """Load a partition's clients onto ``device``.

    Parameters
    ----------
    x, y : ndarray
        The dataset's inputs and labels in sample order.
    partition : pfl_cli.partition.Partition
    val_fraction : float in [0, 1)
        Share of every train client's train samples held out for model selection.
    rng : numpy.random.Generator
        Draws the validation split.
    normalize : bool
        Standardize inputs; the statistics are ``stats`` when given (a trained model's),
        else computed on the train clients' fit samples.
    """
    import torch

    if y is None:
        raise InputError("dataset: training needs labels; the partition's dataset has none.")
    if not 0.0 <= val_fraction < 1.0:
        raise InputError(f"val_fraction must be in [0, 1); got {val_fraction}.")
    n = partition.num_clients
    role = np.asarray(partition.role)
    owner, samples = partition.train_owner(), np.asarray(partition.train_indices)
    held = split_validation(owner, role == ROLE_TRAIN, val_fraction, rng)
    if normalize:
        if stats is None:
            stats = normalization_stats(x, samples[~held & (role[owner] == ROLE_TRAIN)])
        mean, std = stats
    else:
        shape = (1,) * (x.ndim - 1)
        mean, std = np.zeros(shape, np.float32), np.ones(shape, np.float32)
    classes = np.zeros((n, num_classes), dtype=bool)
    classes[owner, np.asarray(y)[samples]] = True
    x_t = torch.as_tensor(np.ascontiguousarray(x)).to(device)
    return ClientStore(
        x=x_t, y=torch.as_tensor(np.asarray(y, dtype=np.int64), device=device),
        mean=torch.as_tensor(mean, device=device), std=torch.as_tensor(std, device=device),
        fit=Padded.from_csr(owner[~held], samples[~held], n, device),
        val=Padded.from_csr(owner[held], samples[held], n, device),
        test=Padded.from_csr(partition.test_owner(), np.asarray(partition.test_indices), n, device),
        classes=torch.as_tensor(classes, device=device), role=role, client_id=np.asarray(partition.client_id),
        num_classes=int(num_classes), input_shape=tuple(int(s) for s in x.shape[1:]), device=device,
        partition_sha=partition_digest(partition.client_id, role, partition.train_offsets, partition.train_indices),
    )
