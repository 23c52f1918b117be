"""Tensors in and out of Flower messages, and the bytes they take on the wire.

A model travels as an ``ArrayRecord`` of float32 arrays by parameter name (Flower serializes
each as a ``.npy`` buffer); :class:`WireMeter` adds up the serialized bytes of every array the
ServerApp sends and receives, the figure written beside the traffic ledger's float count.
"""

from __future__ import annotations

from dataclasses import dataclass, field


def to_record(params: dict):
    """``{name: Tensor}`` -> ``ArrayRecord`` (CPU float32 copies, names kept)."""
    from flwr.app import ArrayRecord

    return ArrayRecord({k: v.detach().cpu().float().contiguous() for k, v in params.items()})


def from_record(record, device) -> dict:
    """``ArrayRecord`` -> ``{name: Tensor}`` on ``device``."""
    import torch

    return {k: torch.as_tensor(a.numpy()).to(device) for k, a in record.items()}


def restore_generator(state: bytes):
    """A CPU ``torch.Generator`` in the state the server sent (``bytes(gen.get_state().numpy())``)."""
    import torch

    gen = torch.Generator()
    gen.set_state(torch.frombuffer(bytearray(state), dtype=torch.uint8).clone())
    return gen


def generator_state(gen) -> bytes:
    return bytes(gen.get_state().numpy().tobytes())


def record_bytes(content) -> int:
    """Serialized bytes of every array in a message's ``RecordDict``."""
    return sum(len(array.data) for record in content.array_records.values() for array in record.values())


@dataclass
class WireMeter:
    """Bytes of arrays sent (down) and received (up) by the ServerApp, per message kind."""

    down: dict[str, int] = field(default_factory=dict)
    up: dict[str, int] = field(default_factory=dict)

    def sent(self, kind: str, content) -> None:
        self.down[kind] = self.down.get(kind, 0) + record_bytes(content)

    def received(self, kind: str, content) -> None:
        self.up[kind] = self.up.get(kind, 0) + record_bytes(content)

    def summary(self, ledger: dict) -> dict:
        """The ``wire`` object of ``metrics.json``: measured bytes of the training rounds (every message kind
        ``train*``: PeFLL's three exchanges are ``train.descriptor``, ``train.model``, ``train.embedding_grad``)
        beside the ledger's."""
        train = sum(n for side in (self.down, self.up) for kind, n in side.items() if kind.startswith("train"))
        return {"bytes_down": self.down, "bytes_up": self.up, "train_round_bytes": train,
                "ledger_total_bytes": ledger["total_bytes"],
                "wire_over_ledger": train / ledger["total_bytes"] if ledger["total_bytes"] else None}
