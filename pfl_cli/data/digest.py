"""Content digests of dataset samples: which samples are the same sample, whatever their index.

A sample is identified by what it holds, not by where it sits: two partitions of one dataset, or
two copies of it in another order, name a sample by different indices, and a dataset may hold
the same sample twice. predict and attack compare these digests with a train artifact's
(``train_samples.npz``) so that no sample the model trained on is scored as unseen data
(DESIGN.md section 5).

The digest of sample ``i`` is BLAKE2b with a 16-byte output (RFC 7693) over a canonical encoding
of its values and label:

- features ``x[i]`` flattened in C order and rounded to float32 (``-0.0`` written as ``0.0``); if
  every rounded value is a whole number in [0, 255] (images stored as uint8, or as floats holding
  such values) they are encoded as one byte each, else as float32; a tag byte says which. The
  rounding comes first, so the tag too depends on the float32 values alone. The encoding depends on the
  sample's values only, so one image digests alike as uint8, int64, float32 or float64;
- the label ``y[i]`` as a little-endian int64 (-1 where unknown or the dataset has no labels).

Two samples that differ only below float32 precision share a digest: they count as one sample,
the cautious side for a check that refuses overlap. 16 bytes a sample: distinct samples collide
with probability about n^2 / 2^129 (birthday bound), nil for any dataset.
"""

from __future__ import annotations

import hashlib

import numpy as np

DIGEST_BYTES = 16
_BYTE_VALUES, _FLOAT32 = b"\x00", b"\x01"


def sample_digests(x: np.ndarray, y: np.ndarray | None = None, indices: np.ndarray | None = None, *,
                   chunk: int = 4096) -> np.ndarray:
    """The content digests of samples ``indices`` of ``(x, y)`` (all samples when None).

    Parameters
    ----------
    x : ndarray of shape (n_samples, ...)
        Features, any numeric dtype.
    y : ndarray of shape (n_samples,) or None
        Integer labels (-1: unknown); None counts as -1 for every sample.
    indices : 1-D integer array, optional
        Which samples, in the order wanted.

    Returns
    -------
    ndarray of shape (len(indices), 16), uint8
        One row per sample (see the module's docstring for the encoding).
    """
    idx = np.arange(len(x), dtype=np.int64) if indices is None else np.asarray(indices, dtype=np.int64).reshape(-1)
    labels = (np.full(len(idx), -1, dtype="<i8") if y is None else np.asarray(y)[idx].astype("<i8"))
    digests = []
    for start in range(0, len(idx), chunk):
        block = np.asarray(x[idx[start:start + chunk]])
        block = block.reshape(len(block), -1)
        lab = labels[start:start + chunk]
        if block.dtype == np.uint8:  # images as stored: every row takes the byte encoding
            as_bytes, small, as_float = block, np.ones(len(block), dtype=bool), None
        else:  # rounded to float32 first, so that the tag depends on the float32 values alone (a float64 copy
            # equal at float32 precision, such as (x * 0.1) * 10, is the same sample); -0.0 -> 0.0
            as_float = block.astype(np.float32) + np.float32(0.0)
            with np.errstate(invalid="ignore", over="ignore"):
                as_bytes = as_float.astype(np.uint8)
            small = np.all(as_bytes == as_float, axis=1)  # whole numbers in [0, 255] survive the cast unchanged
        for i in range(len(block)):
            h = hashlib.blake2b(_BYTE_VALUES if small[i] else _FLOAT32, digest_size=DIGEST_BYTES)
            h.update(as_bytes[i] if small[i] else as_float[i])
            h.update(lab[i:i + 1])
            digests.append(h.digest())
    return np.frombuffer(b"".join(digests), dtype=np.uint8).reshape(len(idx), DIGEST_BYTES)


def digest_keys(digests: np.ndarray) -> np.ndarray:
    """The rows of a (n, 16) uint8 digest array as one comparable value each (for ``np.isin``)."""
    d = np.ascontiguousarray(digests, dtype=np.uint8).reshape(-1, DIGEST_BYTES)
    return d.view(np.dtype((np.void, DIGEST_BYTES))).reshape(-1)
