"""Heterogeneity statistics of a partition (all clients at once, no per-client loop)."""

from __future__ import annotations

from typing import Any

import numpy as np

from pfl_cli.partition.base import Partition


def label_histograms(offsets: np.ndarray, indices: np.ndarray, labels: np.ndarray, num_classes: int) -> np.ndarray:
    """Counts (n_clients, num_classes) of ``labels`` over each client's CSR slice (unknown labels, -1, skipped)."""
    num_clients = len(offsets) - 1
    owner = np.repeat(np.arange(num_clients), np.diff(offsets))
    lab = labels[indices]
    known = lab >= 0
    flat = owner[known] * num_classes + lab[known]
    return np.bincount(flat, minlength=num_clients * num_classes).reshape(num_clients, num_classes)


def _entropy_bits(p: np.ndarray) -> np.ndarray:
    with np.errstate(divide="ignore", invalid="ignore"):
        terms = np.where(p > 0, -p * np.log2(np.where(p > 0, p, 1.0)), 0.0)
    return terms.sum(axis=-1)


def js_divergence(p: np.ndarray, q: np.ndarray) -> np.ndarray:
    """Jensen-Shannon divergence (base 2, in [0, 1]) between rows of ``p`` and ``q``."""
    m = 0.5 * (p + q)
    return _entropy_bits(m) - 0.5 * (_entropy_bits(p) + _entropy_bits(q))


def _summary(values: np.ndarray) -> dict[str, float]:
    if len(values) == 0:
        return {"min": None, "max": None, "mean": None, "median": None, "std": None}
    return {
        "min": float(np.min(values)),
        "max": float(np.max(values)),
        "mean": float(np.mean(values)),
        "median": float(np.median(values)),
        "std": float(np.std(values)),
    }


def partition_stats(part: Partition, labels: np.ndarray | None, num_classes: int) -> tuple[np.ndarray, dict[str, Any]]:
    """Per-client train label counts and the ``stats.json`` document.

    Returns
    -------
    hist : ndarray of shape (n_clients, num_classes)
        Train label counts (zero columns when the dataset has no labels).
    stats : dict
        Sizes, label entropy (bits) per client, Jensen-Shannon divergence of each
        client's label distribution to the global one, classes per client.
    """
    n = part.num_clients
    if labels is None or num_classes == 0:
        hist = np.zeros((n, 0), dtype=np.int64)
    else:
        hist = label_histograms(part.train_offsets, part.train_indices, labels, num_classes)
    train_sizes, test_sizes = part.train_sizes, part.test_sizes
    stats: dict[str, Any] = {
        "num_clients": int(n),
        "num_train_clients": int(np.sum(part.role == 0)),
        "num_holdout_clients": int(np.sum(part.role == 1)),
        "num_classes": int(num_classes),
        "num_train_samples": int(train_sizes.sum()),
        "num_test_samples": int(test_sizes.sum()),
        "train_size": _summary(train_sizes),
        "test_size": _summary(test_sizes),
        "empty_clients": int(np.sum(train_sizes == 0)),
    }
    if hist.shape[1]:
        sizes = hist.sum(axis=1, keepdims=True)
        nonempty = sizes[:, 0] > 0
        p = hist[nonempty] / sizes[nonempty]
        glob = hist.sum(axis=0) / max(int(hist.sum()), 1)
        entropy = _entropy_bits(p)
        js = js_divergence(p, glob[None, :])
        stats["global_label_distribution"] = [float(v) for v in glob]
        stats["heterogeneity"] = {
            "label_entropy_bits": _summary(entropy),
            "max_label_entropy_bits": float(np.log2(num_classes)) if num_classes else 0.0,
            "js_divergence_to_global": _summary(js),
            "classes_per_client": _summary(np.count_nonzero(hist, axis=1)[nonempty]),
            "size_coefficient_of_variation": float(np.std(train_sizes) / np.mean(train_sizes)) if train_sizes.mean() else None,
        }
    stats["scheme_info"] = dict(part.info)
    if part.labeled is not None:
        stats["num_labeled_clients"] = int(np.sum(part.labeled))
        stats["label_prevalence"] = part.info.get("labels", {}).get("label_prevalence")
    return hist, stats
