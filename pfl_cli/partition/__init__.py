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

from pfl_cli.lazy import lazy_names

# Names resolved on first use (PEP 562): a reader that needs only `pfl_cli.partition.base` (`pflx show`,
# every stage reading a partition) does not load the twelve scheme modules of `api`.
_HOME = {
    "SCHEMES": "api", "PartitionConfig": "api", "partition_labels": "api", "resolve_scheme": "api",
    "validate_config": "api", "ROLE_HOLDOUT": "base", "ROLE_TRAIN": "base", "Partition": "base",
    "label_histograms": "stats", "partition_stats": "stats",
}
__all__ = sorted(_HOME)


__getattr__, __dir__ = lazy_names(__name__, _HOME)
