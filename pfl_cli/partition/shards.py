"""FedAvg shards (McMahan et al. 2017): sort by label, cut into equal shards, deal them out."""

from __future__ import annotations

import numpy as np

from pfl_cli.partition.base import stable_argsort


def shard_owners(
    labels: np.ndarray, *, num_clients: int, shards_per_client: int, rng: np.random.Generator
) -> tuple[np.ndarray, dict]:
    """Owner of each sample when every client receives ``shards_per_client`` label-sorted shards.

    Shards hold ``n // (num_clients * shards_per_client)`` samples each; the remainder
    (fewer than one shard per client) is left unassigned and reported in ``info``.
    """
    n = len(labels)
    num_shards = num_clients * shards_per_client
    shard_size = n // num_shards
    perm = rng.permutation(n)
    order = perm[stable_argsort(labels[perm], int(labels.max()) + 1 if n else 1)]  # label-sorted, random within a label
    shard_owner = np.empty(num_shards, dtype=np.int64)
    shard_owner[rng.permutation(num_shards)] = np.repeat(np.arange(num_clients), shards_per_client)
    owner = np.full(n, -1, dtype=np.int64)
    owner[order[: num_shards * shard_size]] = np.repeat(shard_owner, shard_size)
    return owner, {"shard_size": int(shard_size), "unassigned_samples": int(n - num_shards * shard_size)}
