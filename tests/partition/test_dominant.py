"""The dominant-class split of HyperFL / FedPAC (spec B.7, D.1 item 8)."""

import numpy as np
import pytest

from pfl_cli.errors import ConfigError
from pfl_cli.partition import PartitionConfig, partition_labels, validate_config
from pfl_cli.partition.dominant import dominant_counts, dominant_groups
from pfl_cli.rng import make_rng


def test_groups_start_at_even_classes():
    groups = dominant_groups(10, 3)
    assert [np.flatnonzero(g).tolist() for g in groups] == [[0, 1, 2], [2, 3, 4], [4, 5, 6], [6, 7, 8], [0, 8, 9]]


def test_counts_match_the_papers_600_sample_clients():
    """600 samples: 120 spread over 10 classes (12 each), 480 over the 3 dominant classes (160 each)."""
    counts = dominant_counts(600, 20, 10, 3, 0.2)
    assert (counts.sum(1) == 600).all()
    for i, row in enumerate(counts):
        dom = dominant_groups(10, 3)[i % 5]
        assert (row[dom] == 12 + 160).all() and (row[~dom] == 12).all()


def test_partition_of_digits(cli, tmp_path):
    y = np.repeat(np.arange(10), 180)
    cfg = PartitionConfig(dominant_classes=3, uniform_share=0.2, num_clients=10, test_fraction=0.25)
    cfg = validate_config(cfg, num_samples=len(y), num_classes=10, has_labels=True, has_clients=False,
                          has_test_pool=False)
    part = partition_labels(y, cfg, num_classes=10, rng=make_rng(0, "p"))
    sizes = part.train_sizes + part.test_sizes
    m = part.info["samples_per_client"]
    assert (sizes == m).all() and m > 0
    hist = np.stack([np.bincount(y[part.train_indices[part.train_offsets[j]:part.train_offsets[j + 1]]],
                                 minlength=10) + np.bincount(y[part.test_indices[part.test_offsets[j]:
                                                                                   part.test_offsets[j + 1]]],
                                                             minlength=10) for j in range(10)])
    assert np.array_equal(hist, dominant_counts(m, 10, 10, 3, 0.2))
    assert len(np.unique(np.concatenate([part.train_indices, part.test_indices]))) == 10 * m  # no reuse
    assert cli("partition", "--dominant-classes", "3", "--uniform-share", "0.2", "--num-clients", "10",
               "--out", tmp_path / "p", "--format", "quiet").code == 0
    bad = cli("partition", "--dominant-classes", "3", "--uniform-share", "1.5", "--out", tmp_path / "q")
    assert bad.code == 2 and "uniform-share must be a number in [0, 1]" in bad.err


def test_bad_options():
    with pytest.raises(ConfigError, match="dominant-classes must be <= the number of classes"):
        validate_config(PartitionConfig(dominant_classes=11), num_samples=100, num_classes=10, has_labels=True,
                        has_clients=False, has_test_pool=False)
