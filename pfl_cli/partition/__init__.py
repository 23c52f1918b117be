"""Split a centralized dataset into federated clients.

>>> import numpy as np
>>> from pfl_cli.partition import PartitionConfig, partition_labels, validate_config
>>> labels = np.repeat(np.arange(10), 100)
>>> cfg = validate_config(PartitionConfig(alpha=0.5, num_clients=20), num_samples=1000, num_classes=10,
...                       has_labels=True, has_clients=False, has_test_pool=False)
>>> part = partition_labels(labels, cfg, num_classes=10, rng=np.random.default_rng(0))
>>> part.num_clients, int(part.train_sizes.sum() + part.test_sizes.sum())
(20, 1000)
"""

from pfl_cli.partition.api import SCHEMES, PartitionConfig, partition_labels, resolve_scheme, validate_config
from pfl_cli.partition.base import ROLE_HOLDOUT, ROLE_TRAIN, Partition
from pfl_cli.partition.stats import label_histograms, partition_stats

__all__ = [
    "Partition", "PartitionConfig", "ROLE_HOLDOUT", "ROLE_TRAIN", "SCHEMES",
    "label_histograms", "partition_labels", "partition_stats", "resolve_scheme", "validate_config",
]
