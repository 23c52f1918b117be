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
# The sample index of a client whose data this process does not hold (a distributed run gives each
# rank only its own clients' data): reading it fails loudly instead of returning another sample.
NOT_HERE = 2**62


@dataclass
class Padded:
    """Per-client sample lists as a padded (n_clients, width) index matrix plus lengths."""

    index: "object"   # LongTensor (n_clients, width), padding points at sample 0
    length: "object"  # LongTensor (n_clients,)

    @classmethod
    def from_csr(cls, owner: np.ndarray, samples: np.ndarray, num_clients: int, device,
                 held: np.ndarray | None = None) -> "Padded":
        """From each sample's owning client (non-decreasing) and the sample indices.

        ``held`` (bool, per client): the clients whose samples this process holds; the rows
        of the others are all :data:`NOT_HERE` (their lengths stay: sizes are metadata).
        """
        import torch

        lengths = np.bincount(owner, minlength=num_clients).astype(np.int64)
        width = max(int(lengths.max(initial=0)), 1)
        mat = np.zeros((num_clients, width), dtype=np.int64)
        starts = np.cumsum(lengths) - lengths
        mat[owner, np.arange(len(owner)) - starts[owner]] = samples
        if held is not None:
            mat[~held] = NOT_HERE
        return cls(torch.as_tensor(mat, device=device), torch.as_tensor(lengths, device=device))

    def rows(self, clients):
        """Index matrix and lengths of ``clients``, trimmed to their longest list."""
        length = self.length[clients]
        width = max(int(length.max()) if len(length) else 1, 1)
        return self.index[clients, :width], length


_STATS_CHUNK_BYTES = 32 * 2**20  # float64 working set of one chunk: bounds the peak, not the result


def normalization_stats(x: np.ndarray, idx: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Mean and std of samples ``idx``: per channel for images (N, C, H, W), per feature otherwise.

    Two passes over chunks of ``idx`` with float64 accumulators (the mean, then the squared
    deviations from it: the same numbers as ``np.std`` of the whole float64 pool, to rounding),
    so the extra memory is one chunk, not a float64 copy of the train pool (a 50,000-image
    CIFAR pool would be 1.2 GB, and its deviations another 1.2 GB).
    """
    idx = np.asarray(idx)
    if idx.shape[0] == 0:
        raise InputError("normalize: the train clients hold no samples to compute input statistics from.")
    image = x.ndim == 4
    rows = max(1, _STATS_CHUNK_BYTES // (int(np.prod(x.shape[1:])) * 8 or 1))

    def chunks():  # (n, C, H*W) for images, (n, features) otherwise, float64
        for i in range(0, len(idx), rows):
            part = np.asarray(x[idx[i:i + rows]], dtype=np.float64)
            yield part.reshape(part.shape[0], part.shape[1], -1) if image else part.reshape(part.shape[0], -1)

    def total(values):  # reduce the contiguous pixel axis first: several times faster than axis=(0, 2, 3)
        return (values.sum(axis=2) if image else values).sum(axis=0)

    count = len(idx) * (int(np.prod(x.shape[2:])) if image else 1)
    mean = sum(total(c) for c in chunks()) / count
    centre = mean[:, None] if image else mean
    std = np.sqrt(sum(total(np.square(c - centre)) for c in chunks()) / count)
    shape = (-1, 1, 1) if image else x.shape[1:]
    mean, std = mean.reshape(shape), std.reshape(shape)
    std = np.where(std < 1e-8, 1.0, std)  # constant features (digits' border pixels) pass through
    return mean.astype(np.float32), std.astype(np.float32)


_SAMPLE_TAG, _CLIENT_TAG = b"pflx-carve-sample", b"pflx-carve-client"
_HASH_CHUNK = 4096


def carve_salt(rng) -> bytes:
    """The 16-byte key of a carve's draws, read from ``rng`` (the seed's stream, or OS entropy under ``--dp``)."""
    return bytes(rng.bytes(16))


def _unit(digests: list[bytes]) -> np.ndarray:
    """Keyed-hash digests (8 bytes each) as float64 in [0, 1): the top 53 bits."""
    words = np.frombuffer(b"".join(digests), dtype="<u8")
    return (words >> np.uint64(11)).astype(np.float64) * 2.0 ** -53


def sample_uniforms(x: np.ndarray, y: np.ndarray | None, idx: np.ndarray, salt: bytes) -> np.ndarray:
    """One uniform draw in [0, 1) per sample ``idx``, keyed by the sample's content, not its position.

    The draw is BLAKE2b keyed with ``salt`` over the sample's content digest
    (:func:`pfl_cli.data.digest.sample_digests`: features and label, the identity predict's overlap check uses
    too): it depends on that sample and the salt only, so adding or removing any other sample (anywhere in
    the dataset or the partition) leaves it unchanged, and without the salt it is unpredictable. Identical
    samples draw the same value (they are the same record).
    """
    import hashlib

    from pfl_cli.data.digest import sample_digests

    key = hashlib.blake2b(_SAMPLE_TAG + salt, digest_size=32).digest()
    digests = sample_digests(x, y, np.asarray(idx, dtype=np.int64), chunk=_HASH_CHUNK)
    out = [hashlib.blake2b(row.tobytes(), key=key, digest_size=8).digest() for row in digests]
    return _unit(out) if out else np.zeros(0, np.float64)


def client_uniforms(client_id: np.ndarray, salt: bytes) -> np.ndarray:
    """One uniform draw in [0, 1) per client, keyed by its ``client_id`` (the partition's name of it)."""
    import hashlib

    key = hashlib.blake2b(_CLIENT_TAG + salt, digest_size=32).digest()
    out = [hashlib.blake2b(int(c).to_bytes(8, "little", signed=True), key=key, digest_size=8).digest()
           for c in np.asarray(client_id, dtype=np.int64)]
    return _unit(out) if out else np.zeros(0, np.float64)


def split_validation(owner: np.ndarray, is_train: np.ndarray, fraction: float, u: np.ndarray,
                     stable: bool = False) -> np.ndarray:
    """Which train samples each train client holds out for model selection (a bool mask).

    ``u``: each sample's own uniform draw (:func:`sample_uniforms`, keyed by its content).

    - ``stable`` (under ``--dp``): a sample validates iff its own draw ``u < fraction``, nothing
      else: a sample's side depends on that sample and the salt only, so the fit sets of two
      datasets that differ in one sample differ in at most that sample (the neighbour relation of
      ``docs/privacy/release-contract.md``). The per-client count is then binomial, and a small
      client may keep no sample to train on (it then trains on nothing).
    - otherwise: client i holds out the ``floor(fraction * n_i)`` samples of smallest draw and keeps
      at least one to train on. The count couples a client's samples (one more sample can move
      another), which only ``--dp`` must exclude.

    Holdout clients keep everything.
    """
    sizes = np.bincount(owner, minlength=len(is_train))
    if fraction == 0 or len(owner) == 0:
        return np.zeros(len(owner), dtype=bool)
    if stable:
        return (np.asarray(u) < fraction) & np.asarray(is_train, bool)[owner]
    n_val = np.minimum(np.floor(fraction * sizes).astype(np.int64), np.maximum(sizes - 1, 0)) * is_train
    order = np.lexsort((u, owner))  # each client's samples by their own draw
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
        The labels training may read: -1 where a sample is unlabeled (an unknown label, a csv
        row marked unlabeled, or a client of ``--label-prevalence`` without labels).
    y_eval : LongTensor (n_samples,)
        The labels evaluation scores against: ``y``, or every known label when the evaluator
        was given the hidden ones (an oracle: ``--evaluate-hidden-labels``).
    mean, std : Tensor broadcastable to one input
    fit, val, test : Padded
    classes : BoolTensor (n_clients, num_classes)
        Classes present in each client's train data (fit + val): the label mask.
    role, client_id : ndarray (n_clients,)
    labeled : ndarray of bool (n_clients,)
        The client has at least one label training may read among its fit samples.
    """

    x: object
    y: object
    y_eval: object
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
    labeled: np.ndarray = None
    partition_sha: bytes = b""  # fl.client_state.partition_digest: ties private per-client state to its clients
    held: np.ndarray = None  # bool (n_clients,): clients whose samples are in ``x``; None: all of them
    vocab_size: int | None = None  # text data: ``x`` holds token codes in [0, vocab_size), read as codes
    backdoor: Padded | None = None  # the backdoor attack's triggered test samples (pfl_cli.fl.byzantine.poison)

    @property
    def num_clients(self) -> int:
        return len(self.role)

    def holds(self, index):
        """Which rows of a cohort's sample ``index`` (c, ...) this process holds the data of: BoolTensor (c,).

        Every client's samples live on exactly one rank, so these rows are this rank's share of
        the cohort (:mod:`pfl_cli.fl.distributed`); ``None`` when the rows hold no index to tell
        (zero steps: nothing is read).
        """
        flat = index.reshape(index.shape[0], -1)
        return None if flat.shape[1] == 0 else flat[:, 0] != NOT_HERE

    def clients(self, role: int) -> np.ndarray:
        return np.flatnonzero(self.role == role)

    def inputs(self, index):
        """Standardized float32 inputs of sample ``index`` (any shape of indices); text data's token codes
        (int64) as they are: a code is a name, not a magnitude, so nothing standardizes it."""
        import torch

        if self.vocab_size is not None:
            return self.x[index]
        if isinstance(index, torch.Tensor) and index.dtype in (torch.int64, torch.int32) and self.x.dim() > 1 \
                and self.x.is_contiguous():
            # One row gather on the flattened samples: the same values as ``x[index]``, which runs
            # advanced indexing over every input dimension (3x the CPU time for a CIFAR batch; issue 26).
            x = self.x.flatten(1).index_select(0, index.reshape(-1)).view(*index.shape, *self.x.shape[1:])
        else:
            x = self.x[index]
        if not x.dtype.is_floating_point:  # uint8 images: the float conversion and the centring in one pass
            return torch.sub(x, self.mean.to(torch.float32)).div_(self.std)
        x = x.to(torch.float32)
        if x._is_view():  # a plain int or slice index: never standardize the store itself in place
            x = x.clone()
        return x.sub_(self.mean).div_(self.std)  # in place: one cohort-sized buffer per batch, not three

    def onehot(self, index):
        """One-hot labels of sample ``index``; an unlabeled sample's row is all zeros."""
        import torch

        y = self.y[index]
        hot = torch.nn.functional.one_hot(y.clamp_min(0), self.num_classes).to(torch.float32)
        return hot * (y >= 0).unsqueeze(-1)


def visible_labels(y: np.ndarray | None, n: int, partition, labeled: np.ndarray | None = None) -> np.ndarray:
    """Labels training may read (int64, -1 for unlabeled): known, marked labeled, of a labeled client.

    A client the partition marks unlabeled hides the labels of all its train and test samples.
    """
    out = np.full(n, -1, dtype=np.int64) if y is None else np.asarray(y, dtype=np.int64).copy()
    if labeled is not None:
        out[~np.asarray(labeled, dtype=bool)] = -1
    if partition.labeled is not None:
        hidden = np.flatnonzero(np.asarray(partition.labeled) == 0)
        for owner, samples in ((partition.train_owner(), partition.train_indices),
                               (partition.test_owner(), partition.test_indices)):
            out[np.asarray(samples)[np.isin(owner, hidden)]] = -1
    return out


def build_store(x: np.ndarray, y: np.ndarray, num_classes: int, partition, *, val_fraction: float, rng, device,
                normalize: bool = True, stats: tuple[np.ndarray, np.ndarray] | None = None,
                labeled: np.ndarray | None = None, hidden_labels: bool = False,
                held: np.ndarray | None = None, vocab_size: int | None = None,
                stable_carve: bool = False) -> ClientStore:
    """Load a partition's clients onto ``device``.

    Parameters
    ----------
    x, y : ndarray
        The dataset's inputs and labels in sample order.
    partition : pfl_cli.partition.Partition
    val_fraction : float in [0, 1)
        Share of every train client's train samples held out for model selection.
    rng : numpy.random.Generator
        Draws the validation split's salt (:func:`carve_salt`): each sample's side then comes from a
        keyed hash of its own content (:func:`sample_uniforms`), never from its position. Under
        ``--dp`` pass the mechanism's randomness (OS entropy unless ``noise=seeded``).
    stable_carve : bool
        The neighbour-stable carve (:func:`split_validation`), for ``--dp``.
    normalize : bool
        Standardize inputs; the statistics are ``stats`` when given (a trained model's),
        else computed on the train clients' fit samples.
    labeled : ndarray of bool (n_samples,), optional
        The dataset's own mark of samples whose label training may read (a csv
        ``labeled`` column); unknown labels (-1) are unlabeled in any case.
    hidden_labels : bool
        Score evaluation against every known label, hidden ones included (an oracle).
    held : ndarray of bool (n_clients,), optional
        Load only these clients' samples onto ``device`` (a distributed rank's own clients,
        :func:`pfl_cli.fl.distributed.held_clients`); the others' index rows are
        :data:`NOT_HERE`. Statistics, validation split, label masks and sizes are computed
        from the whole partition first, so they are the same on every rank. Default: all.
    vocab_size : int, optional
        Text data (a dataset that declares a vocabulary, e.g. LEAF Shakespeare's 80 letters):
        ``x`` (n_samples, length) holds token codes in ``[0, vocab_size)``, kept as int64 and
        never standardized (``normalize`` does not apply; the statistics are 0 and 1).
    """
    import torch

    if not 0.0 <= val_fraction < 1.0:
        raise InputError(f"val_fraction must be in [0, 1); got {val_fraction}.")
    n = partition.num_clients
    role = np.asarray(partition.role)
    owner, samples = partition.train_owner(), np.asarray(partition.train_indices)
    if val_fraction > 0:
        u = sample_uniforms(x, y, samples, carve_salt(rng))
        val = split_validation(owner, role == ROLE_TRAIN, val_fraction, u, stable=stable_carve)
    else:
        val = np.zeros(len(samples), dtype=bool)
    if vocab_size is not None:
        x = _token_codes(x, vocab_size)
        normalize = False
    if normalize:
        if stats is None:
            stats = normalization_stats(x, samples[~val & (role[owner] == ROLE_TRAIN)])
        mean, std = stats
    else:
        shape = (1,) * (x.ndim - 1)
        mean, std = np.zeros(shape, np.float32), np.ones(shape, np.float32)
    y_train = visible_labels(y, len(x), partition, labeled)
    y_all = np.full(len(x), -1, dtype=np.int64) if y is None else np.asarray(y, dtype=np.int64)
    classes = np.zeros((n, num_classes), dtype=bool)
    seen = y_train[samples] >= 0
    classes[owner[seen], y_train[samples][seen]] = True
    fit_labels = np.bincount(owner[~val & seen], minlength=n)
    test_owner, test_samples = partition.test_owner(), np.asarray(partition.test_indices)
    y_eval = y_all if hidden_labels else y_train
    if held is not None:  # keep only the held clients' samples, renumbered in dataset order
        held = np.asarray(held, dtype=bool)
        keep = np.zeros(len(x), dtype=bool)
        keep[samples[held[owner]]] = True
        keep[test_samples[held[test_owner]]] = True
        position = np.cumsum(keep) - 1
        samples, test_samples = position[samples], position[test_samples]
        x, y_train, y_eval = x[keep], y_train[keep], y_eval[keep]
    x_t = torch.as_tensor(np.ascontiguousarray(x)).to(device)
    return ClientStore(
        x=x_t, y=torch.as_tensor(y_train, device=device),
        y_eval=torch.as_tensor(y_eval, device=device),
        mean=torch.as_tensor(mean, device=device), std=torch.as_tensor(std, device=device),
        fit=Padded.from_csr(owner[~val], samples[~val], n, device, held),
        val=Padded.from_csr(owner[val], samples[val], n, device, held),
        test=Padded.from_csr(test_owner, test_samples, n, device, held),
        classes=torch.as_tensor(classes, device=device), role=role, client_id=np.asarray(partition.client_id),
        num_classes=int(num_classes), input_shape=tuple(int(s) for s in x.shape[1:]), device=device,
        labeled=fit_labels > 0,
        partition_sha=partition_digest(partition.client_id, role, partition.train_offsets, partition.train_indices),
        held=held, vocab_size=None if vocab_size is None else int(vocab_size),
    )


def _token_codes(x: np.ndarray, vocab_size: int) -> np.ndarray:
    """Text data's ``x`` as int64 codes; :class:`InputError` unless they are sequences of codes in the vocabulary."""
    if isinstance(vocab_size, bool) or not isinstance(vocab_size, (int, np.integer)) or vocab_size < 2:
        raise InputError(f"vocab_size must be an integer >= 2; got {vocab_size!r}.")
    x = np.asarray(x)
    if x.ndim != 2 or not np.issubdtype(x.dtype, np.integer):
        raise InputError(f"vocab_size: text data are integer token codes of shape (samples, length); got "
                         f"{x.dtype} of shape {x.shape}.")
    if x.size and (int(x.min()) < 0 or int(x.max()) >= vocab_size):
        raise InputError(f"vocab_size: token codes must lie in [0, {vocab_size}); got codes from {int(x.min())} "
                         f"to {int(x.max())}.")
    return x.astype(np.int64, copy=False)
