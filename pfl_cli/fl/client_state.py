"""Per-client private state for every client, resident on the device and checkpointed.

Personalized baselines keep something on each client that never reaches the server: FedRep's
and FedPer's heads, LG-FedAvg's local bodies, Ditto's personal models, APFL's local models
and mixing weights, pFedMe's personalized models. :class:`ClientState` holds one stacked
tensor per named quantity with a leading axis over all clients of the store, plus which
clients have trained (``has``): a client that never took part in a round has no private state
and is served like a new client.

The rows are tied to the partition the state was trained on (``partition_sha``, a digest of
its client ids, roles and train indices, :func:`partition_digest`): a partition over other
clients (e.g. from ``simulate``) finds no state for any of them, whatever their ids.

Everything is plain tensors, so :meth:`state` goes into checkpoints and ``model.pt``
(``torch.load(weights_only=True)``) and :meth:`load_state` restores it byte for byte.
"""

from __future__ import annotations

import hashlib
from typing import Mapping

import numpy as np


def partition_digest(client_id, role, train_offsets, train_indices) -> bytes:
    """sha256 of the clients' ids, roles and train sample lists (32 bytes)."""
    h = hashlib.sha256()
    for a in (client_id, role, train_offsets, train_indices):
        h.update(np.ascontiguousarray(np.asarray(a, dtype=np.int64)).tobytes())
        h.update(b"|")
    return h.digest()


class ClientState:
    """Named per-client tensors of shape (n_clients, *shape) on one device.

    Parameters
    ----------
    template : dict name -> Tensor
        One client's initial value of each quantity (e.g. a freshly initialized head).
    num_clients : int
        Clients of the store (rows).
    partition_sha : bytes
        :func:`partition_digest` of the store's partition.
    """

    def __init__(self, template: Mapping[str, "object"], num_clients: int, partition_sha: bytes) -> None:
        import torch

        self.values = {k: v.detach().unsqueeze(0).repeat(num_clients, *([1] * v.dim())).clone()
                       for k, v in template.items()}
        device = next(iter(template.values())).device if template else "cpu"
        self.has = torch.zeros(num_clients, dtype=torch.bool, device=device)
        self.partition_sha = bytes(partition_sha)

    @property
    def num_clients(self) -> int:
        return int(self.has.shape[0])

    def gather(self, clients) -> dict:
        """Copies of ``clients``' rows: name -> Tensor (c, *shape)."""
        return {k: v[clients].clone() for k, v in self.values.items()}

    def scatter(self, clients, values: Mapping[str, "object"]) -> None:
        """Write ``values`` (name -> (c, *shape)) into ``clients``' rows and mark them trained."""
        for k, v in values.items():
            self.values[k][clients] = v.detach().to(self.values[k].dtype)
        self.has[clients] = True

    def known(self, clients: np.ndarray, partition_sha: bytes) -> np.ndarray:
        """Which of ``clients`` (store positions of a partition with digest ``partition_sha``) have state."""
        clients = np.asarray(clients, dtype=np.int64)
        if bytes(partition_sha) != self.partition_sha or len(clients) == 0:
            return np.zeros(len(clients), dtype=bool)
        inside = clients < self.num_clients
        out = np.zeros(len(clients), dtype=bool)
        out[inside] = self.has.cpu().numpy()[clients[inside]]
        return out

    # ------------------------------------------------------------------ persistence
    def state(self) -> dict:
        """Copies of everything (for checkpoints and ``model.pt``)."""
        import torch

        return {"values": {k: v.detach().clone() for k, v in self.values.items()}, "has": self.has.clone(),
                "partition_sha": torch.tensor(list(self.partition_sha), dtype=torch.uint8)}

    def load_state(self, state: Mapping, device=None) -> None:
        dev = device if device is not None else self.has.device
        self.values = {k: v.to(dev) for k, v in state["values"].items()}
        self.has = state["has"].to(dev)
        self.partition_sha = bytes(state["partition_sha"].tolist())

    @classmethod
    def from_state(cls, state: Mapping, device) -> "ClientState":
        obj = cls.__new__(cls)
        obj.load_state(state, device)
        return obj
