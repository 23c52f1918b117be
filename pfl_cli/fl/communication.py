"""What an algorithm really sends and receives: a ledger of the tensors exchanged, by message name.

Algorithms call :meth:`Traffic.send` / :meth:`Traffic.receive` on the tensors that would cross
the network in a real deployment (server -> client is ``down``, client -> server is ``up``),
at the place in ``run_round`` where they are produced, so the figures in ``metrics.json``
come from the tensors themselves, not from a formula kept beside the code. The round loop
closes each round with the cohort size; the ledger is part of the checkpoint, so a resumed
run reports the same totals as an uninterrupted one.

Bytes are counted beside floats: a float32 tensor costs 4 bytes a float, and a compressed upload
(:mod:`pfl_cli.fl.compression`) the bytes its encoding really takes (``wire_bytes``), so
``total_bytes`` is what crossed the wire, not floats times four.
"""

from __future__ import annotations

from dataclasses import dataclass, field

FLOAT_BYTES = 4  # float32 on the wire


@dataclass
class Traffic:
    """Floats and bytes exchanged, summed over every client and round so far, per message name."""

    rounds: int = 0
    client_rounds: int = 0
    down: dict[str, int] = field(default_factory=dict)
    up: dict[str, int] = field(default_factory=dict)
    down_bytes: dict[str, int] = field(default_factory=dict)
    up_bytes: dict[str, int] = field(default_factory=dict)

    def send(self, name: str, tensor, copies: int = 1, wire_bytes: int | None = None) -> None:
        """The server sends ``tensor`` (a per-client stack, or one tensor to ``copies`` clients); ``wire_bytes``:
        what its encoding takes in all (default float32, 4 bytes a float)."""
        floats = int(tensor.numel()) * int(copies)
        self.down[name] = self.down.get(name, 0) + floats
        self.down_bytes[name] = self.down_bytes.get(name, 0) + (FLOAT_BYTES * floats if wire_bytes is None
                                                                else int(wire_bytes))

    def receive(self, name: str, tensor, copies: int = 1, wire_bytes: int | None = None) -> None:
        """The server receives ``tensor`` (a per-client stack, or ``copies`` equal-sized messages); ``wire_bytes``:
        what its encoding takes in all (default float32, 4 bytes a float)."""
        floats = int(tensor.numel()) * int(copies)
        self.up[name] = self.up.get(name, 0) + floats
        self.up_bytes[name] = self.up_bytes.get(name, 0) + (FLOAT_BYTES * floats if wire_bytes is None
                                                            else int(wire_bytes))

    def close_round(self, clients: int) -> None:
        self.rounds += 1
        self.client_rounds += int(clients)

    def per_client_round(self) -> dict[str, dict[str, float]]:
        """``{"down": {name: floats}, "up": {...}}``: the mean message sizes per client and round."""
        n = max(self.client_rounds, 1)
        return {"down": {k: v / n for k, v in self.down.items()}, "up": {k: v / n for k, v in self.up.items()}}

    def summary(self) -> dict:
        """The ``communication`` object of ``metrics.json`` (bytes as sent: float32 is 4 bytes per float, a
        compressed upload its encoding's size)."""
        down, up = sum(self.down.values()), sum(self.up.values())
        sent = sum(self.down_bytes.values()) + sum(self.up_bytes.values())
        n, r = max(self.client_rounds, 1), max(self.rounds, 1)
        per = self.per_client_round()
        return {
            "floats_down_per_client_round": down / n,
            "floats_up_per_client_round": up / n,
            "bytes_up_per_client_round": sum(self.up_bytes.values()) / n,
            "bytes_per_round": sent / r,
            "total_bytes": sent,
            "rounds": self.rounds,
            "client_rounds": self.client_rounds,
            "messages": per,
        }

    def state(self) -> dict:
        return {"rounds": self.rounds, "client_rounds": self.client_rounds, "down": dict(self.down),
                "up": dict(self.up), "down_bytes": dict(self.down_bytes), "up_bytes": dict(self.up_bytes)}

    def load_state(self, state: dict) -> None:
        self.rounds, self.client_rounds = int(state["rounds"]), int(state["client_rounds"])
        self.down = {k: int(v) for k, v in state["down"].items()}
        self.up = {k: int(v) for k, v in state["up"].items()}
        # (a checkpoint written before bytes were counted: its messages were float32)
        self.down_bytes = {k: int(v) for k, v in state.get("down_bytes", {k: FLOAT_BYTES * v for k, v in
                                                                           self.down.items()}).items()}
        self.up_bytes = {k: int(v) for k, v in state.get("up_bytes", {k: FLOAT_BYTES * v for k, v in
                                                                       self.up.items()}).items()}
