"""FlexLoRA (Bai, Chen, Qian, Yao, Li, "Federated Fine-tuning of Large Language Models under Heterogeneous Tasks and
Client Resources", NeurIPS 2024, §3): clients of different LoRA ranks, aggregated as full-size updates.

Each client trains a LoRA adapter of its own rank r_i (``flex_ranks``: one rank per client, cycled over the
partition's clients; empty: every client ``lora_rank``). The server forms each cohort client's full-size update
dW_i = B_i A_i of every adapted layer, averages them by client data size (§3: "synthesizing a full-size LoRA
weight from individual client contributions"), and hands each client the truncated SVD of the average at its own
rank (§3: SVD "for weight redistribution"): B_i = U_r sqrt(S_r), A_i = sqrt(S_r) V_r^T (the singular values
split evenly between the two, pflx's choice). The classifier trains in full and is averaged. Before the first
aggregation every client starts from the shared seeded LoRA start (A random, B zero) cut to its rank.

In pflx a client of rank r_i < ``lora_rank`` holds an adapter of ``lora_rank`` whose components past r_i are zero
in both A and B: they stay zero under plain SGD (each one's gradient is the product with the other's zero), so the
cohort trains in one batched call over one shape. Every client's adapter is scaled by alpha / ``lora_rank``.
A client's model (and a new client's) is the global update cut to its rank; its classifier the global one.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import numpy as np

from pfl_cli.algorithms.base import Algorithm
from pfl_cli.algorithms.lora_common import LoRAClient, LoRAKeys
from pfl_cli.errors import ConfigError
from pfl_cli.fl.config import key
from pfl_cli.fl.params import cpu_tree, stack
from pfl_cli.fl.secagg import cohort_mean


@dataclass(frozen=True)
class FlexLoRAConfig(LoRAKeys):
    """FlexLoRA's keys: FedAvg's round, the LoRA keys and the clients' ranks."""

    algorithm: str = key("flexlora", "the algorithm these keys configure")
    rounds: int = key(5000, "communication rounds", "thesis §4.4, App. B.1.2: all methods but Local train 5000 rounds")
    local_steps: int = key(50, "k: client SGD steps per round", "thesis §4.4: k = 50")
    local_epochs: Optional[int] = key(None, "epochs of local SGD per round instead of local_steps (null: steps)")
    flex_ranks: str = key("", "comma-separated LoRA ranks, client j taking rank j mod their number (each <= "
                          "lora_rank); \"\" = every client lora_rank",
                          "Bai et al. 2024 §4: clients' ranks drawn from resource distributions (e.g. 8 to 200)")

    def validate(self) -> None:
        super().validate()
        ranks(self)


def ranks(cfg) -> list[int]:
    """The ``flex_ranks`` list (refused in one line unless every entry is an integer in [1, lora_rank])."""
    text = str(cfg.flex_ranks).strip()
    if not text:
        return [int(cfg.lora_rank)]
    try:
        out = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        out = []
    if not out or any(r < 1 or r > cfg.lora_rank for r in out):
        raise ConfigError(f"flex_ranks must list integer ranks in [1, lora_rank={cfg.lora_rank}] (e.g. '2,4,8'); "
                          f"got {cfg.flex_ranks!r}.")
    return out


class FlexLoRA(LoRAClient, Algorithm):
    name = "flexlora"
    individual_reads = ""  # under --secagg the weighted sum of B A and the head from secure sums
    search_space = {"lr": "log:1e-3:1"}
    search_space_source = ("Bai et al. 2024 (FlexLoRA) §4: the learning rate is the tuned setting, over the client "
                           "lr's log range")
    tune_group = "train"
    paper = "FlexLoRA: Bai et al., NeurIPS 2024 §3 (full-size update average, SVD to each client's rank)"
    new_client_protocol = "the global update cut to the client's rank by SVD, the global classifier"
    config = FlexLoRAConfig
    # Why no DP variant: its upload is not an adapter but the full-size update B_i A_i (out x in per layer), and a
    # client's delta from the global update also carries the cut of that update to the client's rank (the SVD
    # residual), which would spend every client's clip; DP-FedAvg over such deltas is not written.
    dp_refused = ("each client's upload is its full-size update B A (out x in per adapted layer, the dimension the "
                  "noise would take), redistributed by SVD at each client's rank; a DP variant of that is not "
                  "written. Use fedit, ffa-lora or fedsa-lora, which run under client-level --dp.")

    @classmethod
    def floats_per_client_round(cls, arch: dict) -> int:
        from pfl_cli.models import num_parameters

        return 2 * num_parameters(arch["client"])

    def build(self) -> None:
        self.net = self.client_net()
        parts = self.parts
        init = {k: v.detach().clone() for k, v in self.net.named_parameters()}
        self.init = init
        self.layers = [k.removesuffix(".lora_A.weight") for k in parts["A"]]
        self.head = {k: init[k] for k in parts["head"]}
        self.delta = {layer: None for layer in self.layers}  # the global full-size update (None before a round)
        self.rank_of = np.asarray(ranks(self.cfg), dtype=np.int64)
        self.personalized = len(set(self.rank_of.tolist())) > 1

    def client_ranks(self, clients) -> np.ndarray:
        return self.rank_of[np.asarray(clients, dtype=np.int64) % len(self.rank_of)]

    def adapters(self, clients) -> dict:
        """Every client's start: its rank's cut of the global update (or of the seeded LoRA start), and the head."""
        import torch

        clients = np.asarray(clients.cpu() if hasattr(clients, "cpu") else clients, dtype=np.int64)
        r = torch.as_tensor(self.client_ranks(clients), device=self.device)
        keep = torch.arange(self.cfg.lora_rank, device=self.device)[None, :] < r[:, None]  # (c, R)
        out = stack(self.head, len(clients))
        for layer in self.layers:
            a, b = self.init[f"{layer}.lora_A.weight"], self.init[f"{layer}.lora_B.weight"]
            if self.delta[layer] is not None:
                b, a = svd_factors(self.delta[layer], a.shape, b.shape)
            m = keep.to(a.dtype)
            out[f"{layer}.lora_A.weight"] = a.unsqueeze(0) * m.view(*m.shape, *[1] * (a.dim() - 1))
            out[f"{layer}.lora_B.weight"] = b.unsqueeze(0) * m.view(m.shape[0], 1, m.shape[1], *[1] * (b.dim() - 2))
        return out

    def run_round(self, t, cohort, gen):
        start = self.adapters(cohort)
        theta, loss, _ = self.cohort_sgd(start, cohort, gen, **self.round_schedule())
        self.record_exchange({k: v[0] for k, v in start.items()}, theta, len(cohort))
        products = {layer: full_update(theta[f"{layer}.lora_B.weight"], theta[f"{layer}.lora_A.weight"])
                    for layer in self.layers}
        mean = cohort_mean(self.store, cohort, {**products, **{k: theta[k] for k in self.head}}, secagg=self.cfg.secagg)
        self.delta = {layer: mean[layer] for layer in self.layers}
        self.head = {k: mean[k] for k in self.head}
        return loss

    def personalize(self, clients, gen):
        models = self.adapters(np.asarray(clients, dtype=np.int64))
        if self.personalized:
            return models, True
        return {k: v[0] for k, v in models.items()}, False

    def protocol(self, new: bool) -> dict:
        return {"protocol": "the global update cut to the client's rank", "rounds": 0}

    def state(self):
        return {"delta": {k: v.detach().clone() for k, v in self.delta.items() if v is not None},
                "head": {k: v.detach().clone() for k, v in self.head.items()}}

    def load_state(self, state):
        self.delta = {layer: (state["delta"][layer].to(self.device) if layer in state["delta"] else None)
                      for layer in self.layers}
        self.head = {k: v.to(self.device) for k, v in state["head"].items()}

    def weights(self):
        return {"delta": cpu_tree({k: v for k, v in self.delta.items() if v is not None}),
                "head": cpu_tree(self.head)}

    def load_weights(self, weights):
        self.load_state(weights)


def full_update(b, a):
    """(c, out, r[, 1, 1]) x (c, r, in[, kh, kw]) -> the full-size updates B A, (c, out, in * kh * kw)."""
    import torch

    return torch.bmm(b.flatten(2), a.flatten(2))


def svd_factors(delta, a_shape, b_shape):
    """(B, A) of rank ``a_shape[0]`` from the truncated SVD of ``delta`` (out, in*k*k): B = U sqrt(S),
    A = sqrt(S) V^T."""
    import torch

    r = a_shape[0]
    u, s, vh = torch.linalg.svd(delta, full_matrices=False)
    k = min(r, s.shape[0])
    root = s[:k].sqrt()
    b = torch.zeros(delta.shape[0], r, dtype=delta.dtype, device=delta.device)
    a = torch.zeros(r, delta.shape[1], dtype=delta.dtype, device=delta.device)
    b[:, :k] = u[:, :k] * root
    a[:k] = root[:, None] * vh[:k]
    return b.reshape(b_shape), a.reshape(a_shape)
