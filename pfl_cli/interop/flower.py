"""Serve a pflx partition artifact to a Flower app: ``pip install "pflx[flower]"``.

>>> from pfl_cli.interop.flower import ArtifactPartitioner          # doctest: +SKIP
>>> partitioner = ArtifactPartitioner("runs/part")                  # doctest: +SKIP
>>> partitioner.dataset = datasets.load_from_disk("data/cifar10")["train"]   # doctest: +SKIP
>>> client_data = partitioner.load_partition(0)                     # doctest: +SKIP

:class:`ArtifactPartitioner` is a ``flwr_datasets`` ``Partitioner``: Flower's
``FederatedDataset(..., partitioners={"train": ArtifactPartitioner(...)})`` or a ``client_fn`` calling
``load_partition(partition_id)`` gets pflx's feasibility-checked clients (from ``partition`` or
MDM-simulated by ``simulate``) unchanged. Partition ``k`` is the k-th selected client of the artifact
in ``clients.npz`` order. The dataset assigned must be the one pflx read, in pflx's sample order: the
whole dataset, or, for a dataset with an official test pool (pflx's train pool first, then the test
pool), its train split for ``part="train"`` and its test split for ``part="test"``.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

try:
    from flwr_datasets.partitioner import Partitioner
except ImportError as err:  # pragma: no cover - exercised without the extra by tests/interop
    raise ImportError("pfl_cli.interop.flower needs the flower extra: pip install 'pflx[flower]'") from err

from pfl_cli.partition.base import ROLE_HOLDOUT, ROLE_TRAIN
from pfl_cli.readers import load_partition

PARTS = ("train", "test")
CLIENTS = {"all": None, "train": ROLE_TRAIN, "holdout": ROLE_HOLDOUT}


class ArtifactPartitioner(Partitioner):
    """A Flower ``Partitioner`` whose partitions are the clients of a pflx partition artifact.

    Parameters
    ----------
    artifact : path-like
        A partition artifact (``pflx partition`` or ``pflx simulate`` ``--out``); hashes are verified.
    part : {"train", "test"}, default="train"
        Serve each client's train samples or its test samples.
    clients : {"all", "train", "holdout"}, default="all"
        Which clients become partitions: all, the train clients (role 0) or the holdout clients.
    """

    def __init__(self, artifact: str | Path, *, part: str = "train", clients: str = "all") -> None:
        super().__init__()
        if part not in PARTS:
            raise ValueError(f"part must be one of {', '.join(PARTS)}; got {part!r}.")
        if clients not in CLIENTS:
            raise ValueError(f"clients must be one of {', '.join(CLIENTS)}; got {clients!r}.")
        self._partition, self.dataset_info, self.artifact = load_partition(artifact, flag="ArtifactPartitioner")
        role = CLIENTS[clients]
        self._clients = (np.arange(self._partition.num_clients) if role is None
                         else self._partition.clients_with_role(role))
        self.part = part

    @property
    def num_partitions(self) -> int:
        return len(self._clients)

    def client_id(self, partition_id: int) -> int:
        """The pflx client id behind Flower partition ``partition_id``."""
        return int(self._partition.client_id[self._position(partition_id)])

    def indices(self, partition_id: int) -> np.ndarray:
        """Row indices of partition ``partition_id`` in the assigned dataset."""
        j = self._position(partition_id)
        rows = self._partition.train_of(j) if self.part == "train" else self._partition.test_of(j)
        return rows - self._base()

    def load_partition(self, partition_id: int):
        return self.dataset.select(self.indices(partition_id).tolist())

    def _position(self, partition_id: int) -> int:
        if not 0 <= int(partition_id) < self.num_partitions:
            raise ValueError(f"partition_id must be in [0, {self.num_partitions}); got {partition_id}.")
        return int(self._clients[int(partition_id)])

    def _base(self) -> int:
        """Offset of the assigned dataset in pflx's sample order: 0, or the train pool's size for a test split."""
        n = int(self.dataset_info["num_samples"])
        pools = self.dataset_info.get("pool_sizes") or {}
        got = len(self.dataset)
        if got == n:
            return 0
        if pools and self.part == "train" and got == pools["train"]:
            return 0
        if pools and self.part == "test" and got == pools["test"]:
            return int(pools["train"])
        sizes = f"{n} (whole dataset)" + (f", {pools['train']} (train split) or {pools['test']} (test split)" if pools else "")
        raise ValueError(f"the assigned dataset has {got} rows; the artifact's dataset {self.dataset_info['spec']} "
                         f"has {sizes}. Assign the dataset pflx partitioned, in the same order.")


def hf_dataset(spec: str):
    """A ``datasets.Dataset`` of a pflx dataset spec in pflx's sample order (x flattened, label, client)."""
    import datasets

    from pfl_cli.data import load_dataset

    ds = load_dataset(spec)
    columns = {"x": ds.x.reshape(ds.num_samples, -1)}
    if ds.y is not None:
        columns["label"] = ds.y
    if ds.client is not None:
        columns["client"] = ds.client.tolist()
    return datasets.Dataset.from_dict(columns)
