import numpy as np
from scipy.spatial.distance import jensenshannon
from scipy.stats import entropy

from pfl_cli.partition.base import Partition, csr_from_lists
from pfl_cli.partition.stats import js_divergence, label_histograms, partition_stats


def test_histograms_and_metrics_match_per_client_references():
    rng = np.random.default_rng(0)
    labels = rng.integers(0, 5, size=300)
    lists = [rng.choice(300, size=s, replace=False) for s in (40, 1, 77, 0, 12)]
    off, idx = csr_from_lists(lists)
    part = Partition(client_id=np.arange(5), role=np.array([0, 0, 1, 0, 0], np.uint8), train_offsets=off,
                     train_indices=idx, test_offsets=np.zeros(6, np.int64), test_indices=np.zeros(0, np.int64))
    hist, stats = partition_stats(part, labels, 5)
    for j, members in enumerate(lists):
        np.testing.assert_array_equal(hist[j], np.bincount(labels[members], minlength=5))
    glob = hist.sum(0) / hist.sum()
    nonempty = [h / h.sum() for h in hist if h.sum()]
    ref_js = [jensenshannon(p, glob, base=2) ** 2 for p in nonempty]
    ref_h = [entropy(p, base=2) for p in nonempty]
    het = stats["heterogeneity"]
    np.testing.assert_allclose(het["js_divergence_to_global"]["mean"], np.mean(ref_js), rtol=1e-9)
    np.testing.assert_allclose(het["label_entropy_bits"]["max"], np.max(ref_h), rtol=1e-9)
    assert stats["empty_clients"] == 1 and stats["num_holdout_clients"] == 1
    assert het["classes_per_client"]["min"] == 1


def test_js_bounds():
    p = np.eye(3)
    np.testing.assert_allclose(js_divergence(p, p), 0.0, atol=1e-12)
    np.testing.assert_allclose(js_divergence(p[[0]], p[[1]]), 1.0)


def test_label_histograms_of_empty_partition():
    assert label_histograms(np.zeros(3, np.int64), np.zeros(0, np.int64), np.zeros(0, np.int64), 4).shape == (2, 4)
