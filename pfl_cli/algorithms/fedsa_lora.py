"""FedSA-LoRA (Guo, Zeng, Wang, Fan, Wang, Qu, "Selective Aggregation for Low-Rank Adaptation in Federated
Learning", ICLR 2025, §4): A shared, B personal.

Each round a cohort client trains A and B of every adapter and its classifier on the frozen base, starting from
the global A and its own B and classifier; the server averages only the A matrices, by client data size (§4:
only the A matrices are shared with the server for aggregation, the B matrices are kept locally; A learns
general knowledge, B client-specific knowledge), and each client keeps its B. The classifier stays on the
client with B (pflx's choice for classification heads, which the method's description leaves open). Only A
travels: 2 x |A| floats per cohort client and round. A client never sampled, or a new one, gets the global A
frozen and a fresh B (zero) and classifier trained ``new_client_epochs`` epochs on its own data (pflx's protocol,
FedRep's for its private part; the paper serves no new clients).

Under client-level ``--dp`` the shared A takes DP-FedAvg's round (McMahan et al. 2018, Alg. 1; :mod:`pfl_cli.fl.dp`):
each cohort client's delta of A clipped to L2 ``clip``, Gaussian noise on the sum, divided by the fixed
denominator, so that the global A is the mechanism's output. B and the classifier never leave the client: they are
client-held state (kept in a checkpoint as such, :func:`pfl_cli.fl.dp.private_snapshot`) and not in ``model.pt``,
which holds the released A and the public start of B and the classifier; ``predict`` then serves every client,
train clients too, with the new-client protocol (a fresh B and classifier on the released A). Removing a client
removes all its clipped contributions, whatever its own B made them, so the client-level guarantee covers A.
"""

from __future__ import annotations

from dataclasses import dataclass

from pfl_cli.algorithms.lora_common import LoRAClient, LoRAKeys, parts_floats
from pfl_cli.algorithms.partial import PartialSharing, PartialSharingConfig
from pfl_cli.fl.config import key
from pfl_cli.fl.params import stack
from pfl_cli.privacy.randomness import mechanism_generator


@dataclass(frozen=True)
class FedSALoRAConfig(PartialSharingConfig, LoRAKeys):
    """FedSA-LoRA's keys: the partial-sharing round and the LoRA keys."""

    algorithm: str = key("fedsa-lora", "the algorithm these keys configure")


class FedSALoRA(LoRAClient, PartialSharing):
    name = "fedsa-lora"
    individual_reads = ""  # under --secagg the mean (or DP-FedAvg's release) of A from the cohort's sums
    search_space = {"lr": "log:1e-3:1"}
    search_space_source = ("Guo et al. 2025 (FedSA-LoRA) §5: the learning rate is the tuned setting, over the "
                           "client lr's log range")
    tune_group = "train"
    paper = "FedSA-LoRA: Guo et al., ICLR 2025 §4 (A averaged, B and the classifier kept by each client)"
    new_client_protocol = "the global A frozen; a fresh B and classifier trained new_client_epochs"
    config = FedSALoRAConfig
    dp_unit = "client"  # DP-FedAvg on the shared A (run_round below); B and the classifier stay on the client
    dp_contribution = "A delta (B and the classifier stay on the client)"
    client_held_state = ("private",)  # each client's B and classifier: kept on the client, never released

    @classmethod
    def floats_per_client_round(cls, arch: dict) -> int:
        return 2 * parts_floats(arch, "A")

    def build(self) -> None:
        self.net = self.client_net()
        parts = self.parts
        self.shared, self.private_names = parts["A"], parts["B"] + parts["head"]
        init = {k: v.detach().clone() for k, v in self.net.named_parameters()}
        self.init_private = {k: init[k] for k in self.private_names}
        self.global_params = init
        self.private = self.new_private_state(self.init_private)

    def run_round(self, t, cohort, gen):
        if self.dp is None:
            return super().run_round(t, cohort, gen)
        import torch

        if len(cohort) == 0:  # an empty Poisson cohort: no client trains, the noise is still added
            deltas, loss = stack({k: self.global_params[k] for k in self.shared}, 0), torch.zeros(0)
        else:
            start = stack(self.global_params, len(cohort))
            start.update(self.private.gather(cohort))
            theta, loss = self.local_update(start, cohort, gen)
            self.record_exchange({k: self.global_params[k] for k in self.shared},
                                 {k: theta[k] for k in self.shared}, len(cohort))
            deltas = {k: theta[k] - self.global_params[k] for k in self.shared}
            self.private.scatter(cohort, {k: theta[k] for k in self.private_names})
        if self.cfg.secagg:  # each client clips its own delta, the server adds the noise to the secure sum
            from pfl_cli.fl.secagg import secure_sum

            rows = self.dp.client_rows(deltas, mechanism_generator(self.cfg, f"dp-client-noise-{t}", self.device))
            step = self.dp.release_sum(secure_sum(rows, modulus=getattr(self.dp, "modulus", None), spent=(deltas,)),
                                       mechanism_generator(self.cfg, f"dp-noise-{t}", self.device))
        else:
            step = self.dp.private_mean(deltas, mechanism_generator(self.cfg, f"dp-noise-{t}", self.device))
        self.global_params.update(self.server_average({k: self.global_params[k] + step[k] for k in self.shared}))
        return loss

    def weights(self):
        """Under ``--dp`` the released A and the public start of B and the classifier only (no client's own)."""
        if self.dp is None:
            return super().weights()
        from pfl_cli.fl.params import cpu_tree

        return {"client": cpu_tree(self.global_params)}

    def load_weights(self, weights):
        if "private" in weights:
            return super().load_weights(weights)
        self.global_params = {k: v.to(self.device) for k, v in weights["client"].items()}
        self.private = self.new_private_state(self.init_private)  # no client known: each gets its own fresh part

    def protocol(self, new: bool) -> dict:
        from pfl_cli.algorithms.base import epochs_protocol

        return epochs_protocol(new, self.cfg.new_client_epochs, "its own B and classifier on the global A",
                               "a fresh B and classifier trained {e} epochs on the global A",
                               "a fresh B (zero) and classifier on the global A")
