"""Upload compression of model deltas, one batched call over the cohort, with per-client error feedback.

A client's upload is its model delta ``u_i = theta_i - x`` (FedAvg, McMahan et al. 2017, Alg. 1). A compressor
``C`` sends ``C(p_i)`` instead, every tensor of the model flattened into one vector of d coordinates:

- ``topk``: the k = ceil(density * d) coordinates of largest magnitude (Stich, Cordonnier, Jaggi, "Sparsified SGD
  with memory", NeurIPS 2018, Alg. 1 with top_k); on the wire k values and k indices (float32 + int32).
- ``qsgd``: stochastic quantization to s levels, ``||p|| sgn(p_j) xi_j`` with ``xi_j`` the level below or above
  ``s |p_j| / ||p||``, the one above drawn with probability its distance from the one below (Alistarh, Grubic, Li,
  Tomioka, Vojnovic, "QSGD", NeurIPS 2017, §3.1, Eq. 3: unbiased); on the wire the norm (float32) and, per
  coordinate, a sign bit and ceil(log2(s + 1)) bits for the level (the fixed-width code, not the paper's Elias code).
- ``sign``: ``(||p||_1 / d) sgn(p)`` (Karimireddy, Rebjock, Stich, Jaggi, "Error feedback fixes SignSGD and other
  gradient compression schemes", ICML 2019, Alg. 2 EF-SGD with the scaled sign); on the wire one bit a coordinate
  and the scale (float32).

Error feedback (Stich et al. 2018, Alg. 1 lines 4-6; Karimireddy et al. 2019, Alg. 2): ``p_i = u_i + e_i``, the
client sends ``C(p_i)`` and keeps ``e_i <- p_i - C(p_i)``. The memory e is per-client state, kept for every
client of the partition (a client that did not answer keeps its memory), checkpointed with the run.
"""

from __future__ import annotations

import math

FLOAT_BYTES = 4
INDEX_BYTES = 4
KINDS = ("topk", "qsgd", "sign")


def wire_bytes(kind: str, d: int, *, density: float = 0.01, levels: int = 16) -> int:
    """Bytes one client's compressed upload of ``d`` coordinates takes on the wire.

    >>> wire_bytes("topk", 1000, density=0.01)   # 10 values + 10 indices
    80
    >>> wire_bytes("sign", 1000)                 # 1000 bits + the scale
    129
    >>> wire_bytes("qsgd", 1000, levels=16)      # the norm + 1000 x (1 sign bit + 5 level bits)
    754
    """
    if kind == "topk":
        return topk_count(d, density) * (FLOAT_BYTES + INDEX_BYTES)
    if kind == "sign":
        return math.ceil(d / 8) + FLOAT_BYTES
    if kind == "qsgd":
        return FLOAT_BYTES + math.ceil(d * (1 + math.ceil(math.log2(levels + 1))) / 8)
    raise ValueError(f"compression must be one of {', '.join(KINDS)}; got {kind!r}.")


def topk_count(d: int, density: float) -> int:
    return max(1, min(d, math.ceil(density * d)))


def compress(kind: str, p, *, density: float = 0.01, levels: int = 16, gen=None):
    """``C(p)`` of every row of ``p`` (c, d) at once: what the server decodes from each client's message."""
    import torch

    c, d = p.shape
    if c == 0 or d == 0:
        return p.clone()
    if kind == "topk":
        k = topk_count(d, density)
        idx = p.abs().topk(k, dim=1, sorted=False).indices
        return torch.zeros_like(p).scatter_(1, idx, p.gather(1, idx))
    if kind == "sign":
        scale = p.abs().sum(1, keepdim=True) / d
        return torch.where(p >= 0, scale, -scale)
    if kind == "qsgd":
        norm = p.norm(dim=1, keepdim=True)
        ratio = torch.where(norm > 0, p.abs() / norm.clamp_min(1e-30), torch.zeros_like(p)) * levels
        lower = ratio.floor()
        up = torch.rand(p.shape, generator=gen, dtype=p.dtype).to(p.device) < (ratio - lower)
        return norm * p.sign() * (lower + up.to(p.dtype)) / levels
    raise ValueError(f"compression must be one of {', '.join(KINDS)}; got {kind!r}.")


class UploadCodec:
    """The compressor of a run's uploads and its per-client error memory (``num_clients`` rows, lazily built)."""

    def __init__(self, kind: str, *, density: float, levels: int, error_feedback: bool, num_clients: int,
                 seed: int) -> None:
        if kind not in KINDS:
            raise ValueError(f"compression must be one of {', '.join(KINDS)}; got {kind!r}.")
        self.kind, self.density, self.levels = kind, float(density), int(levels)
        self.error_feedback, self.num_clients, self.seed = bool(error_feedback), int(num_clients), int(seed)
        self.memory = None  # (num_clients, d) float32: e_i, zeros until a client first uploads
        self.round = 0
        self.calls = 0

    def begin_round(self, t: int) -> None:
        self.round = int(t)
        self.calls = 0  # compress_models calls this round (an asynchronous round makes several)

    def wire_bytes(self, d: int) -> int:
        return wire_bytes(self.kind, d, density=self.density, levels=self.levels)

    def compress_models(self, alg, cohort, global_params: dict, theta: dict, *, stacked: bool = False,
                        record: bool = True) -> dict:
        """The cohort's models as the server decodes them: ``x + C(u_i + e_i)``; records what crossed the wire in
        ``alg.traffic`` (the model down in float32, each compressed delta up in its encoding's bytes).

        ``global_params`` holds the keys that travel (a part of the model for the partial-sharing methods); with
        ``stacked`` it holds one start model per cohort row, (c, ...), each client's own download (an
        asynchronous server's jobs start from different versions); ``record`` False leaves the traffic to the
        caller (:meth:`receive` when each upload reaches the server)."""
        import torch

        from pfl_cli.rng import torch_generator

        c = len(cohort)
        names = list(global_params)
        one = {k: (v[0] if stacked else v) for k, v in global_params.items()}  # one model's shapes
        flat = torch.cat([(theta[k] - global_params[k]).reshape(c, -1) for k in names], 1)
        d = flat.shape[1]
        rows = cohort.to(flat.device)
        if self.error_feedback:
            if self.memory is None:
                self.memory = torch.zeros((self.num_clients, d), dtype=flat.dtype, device=flat.device)
            flat = flat + self.memory[rows]
        stream = f"compression-{self.round}" + (f"-{self.calls}" if self.calls else "")
        self.calls += 1
        gen = torch_generator(self.seed, stream) if self.kind == "qsgd" else None
        sent = compress(self.kind, flat, density=self.density, levels=self.levels, gen=gen)
        if self.error_feedback:
            self.memory[rows] = flat - sent
        if record:
            for k, g in one.items():
                alg.traffic.send(k, g, copies=c)
            self.receive(alg, d, c)
        out, start = {}, 0
        for k in names:
            g = one[k]
            out[k] = global_params[k] + sent[:, start:start + g.numel()].reshape(c, *g.shape)
            start += g.numel()
        return {**theta, **out}

    def receive(self, alg, d: int, copies: int) -> None:
        """Record ``copies`` compressed uploads of ``d`` coordinates reaching the server, in their encoding's bytes."""
        sent_values = topk_count(d, self.density) if self.kind == "topk" else d
        alg.traffic.receive(f"delta ({self.kind})", _Count(sent_values), copies=copies,
                            wire_bytes=copies * self.wire_bytes(d))

    def state(self) -> dict:
        return {"memory": None if self.memory is None else self.memory.detach().cpu().clone()}

    def load_state(self, state: dict, device) -> None:
        mem = state.get("memory")
        self.memory = None if mem is None else mem.to(device)


class _Count:
    """A message of ``n`` values (the ledger reads ``numel()`` only)."""

    def __init__(self, n: int) -> None:
        self.n = int(n)

    def numel(self) -> int:
        return self.n
