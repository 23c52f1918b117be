"""What an algorithm really sends and receives: a ledger of the tensors exchanged, by message name.

Algorithms call :meth:`Traffic.send` / :meth:`Traffic.receive` on the tensors that would cross
the network in a real deployment (server -> client is ``down``, client -> server is ``up``),
at the place in ``run_round`` where they are produced, so the figures in ``metrics.json``
come from the tensors themselves, not from a formula kept beside the code. The round loop
closes each round with the cohort size; the ledger is part of the checkpoint, so a resumed
run reports the same totals as an uninterrupted one.
"""

from __future__ import annotations

from dataclasses import dataclass, field

FLOAT_BYTES = 4  # float32 on the wire


@dataclass
class Traffic:
    """Floats exchanged, summed over every client and round so far, per message name."""

    rounds: int = 0
    client_rounds: int = 0
    down: dict[str, int] = field(default_factory=dict)
    up: dict[str, int] = field(default_factory=dict)

    def send(self, name: str, tensor, copies: int = 1) -> None:
        """The server sends ``tensor`` (a per-client stack, or one tensor to ``copies`` clients)."""
        self.down[name] = self.down.get(name, 0) + int(tensor.numel()) * int(copies)

    def receive(self, name: str, tensor, copies: int = 1) -> None:
        """The server receives ``tensor`` (a per-client stack, or ``copies`` equal-sized messages)."""
        self.up[name] = self.up.get(name, 0) + int(tensor.numel()) * int(copies)

    def close_round(self, clients: int) -> None:
        self.rounds += 1
        self.client_rounds += int(clients)

    def per_client_round(self) -> dict[str, dict[str, float]]:
        """``{"down": {name: floats}, "up": {...}}``: the mean message sizes per client and round."""
        n = max(self.client_rounds, 1)
        return {"down": {k: v / n for k, v in self.down.items()}, "up": {k: v / n for k, v in self.up.items()}}

    def summary(self) -> dict:
        """The ``communication`` object of ``metrics.json`` (float32: 4 bytes per float)."""
        down, up = sum(self.down.values()), sum(self.up.values())
        n, r = max(self.client_rounds, 1), max(self.rounds, 1)
        per = self.per_client_round()
        return {
            "floats_down_per_client_round": down / n,
            "floats_up_per_client_round": up / n,
            "bytes_per_round": FLOAT_BYTES * (down + up) / r,
            "total_bytes": FLOAT_BYTES * (down + up),
            "rounds": self.rounds,
            "client_rounds": self.client_rounds,
            "messages": per,
        }

    def state(self) -> dict:
        return {"rounds": self.rounds, "client_rounds": self.client_rounds, "down": dict(self.down),
                "up": dict(self.up)}

    def load_state(self, state: dict) -> None:
        self.rounds, self.client_rounds = int(state["rounds"]), int(state["client_rounds"])
        self.down = {k: int(v) for k, v in state["down"].items()}
        self.up = {k: int(v) for k, v in state["up"].items()}
