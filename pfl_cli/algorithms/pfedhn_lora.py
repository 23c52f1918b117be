"""pFedHN-LoRA: pFedHN's hypernetwork generating a client's LoRA adapters and classifier from its embedding.

pFedHN (Shamsian et al., ICML 2021, §3, Alg. 1; :mod:`pfl_cli.algorithms.pfedhn`) with the target network of the
LoRA algorithms (:mod:`pfl_cli.algorithms.lora_common`): theta_i = h(v_i; phi) is the adapters ``lora_A`` /
``lora_B`` of the layers ``lora_targets`` names (Hu et al., LoRA, ICLR 2022, §4.1) and the classifier, over
model_arch's net frozen (seeded random, or ``lora_base_weights``): the thesis's proposal (Scott 2026, §7.3) of
hypernetworks that generate adapters instead of whole networks, on pFedHN's trainable client embeddings. The round
is pFedHN's (K local steps on the generated adapters, one server step on (phi, v) along J^T (theta - theta~)); a
client never seen in training fits a fresh embedding v ~ N(0, I) with phi frozen for ``embed_rounds`` rounds of the
same rule (§5, "generalization to novel clients"), and its adapters are h(v).

One target shape: pFedHN's mixed client sizes (§5.2, ``client_sizes``) are widths of whole nets; the adapters of one
frozen base have one shape.
"""

from __future__ import annotations

from dataclasses import dataclass

from pfl_cli.algorithms.base import descriptor_dim
from pfl_cli.algorithms.lora_common import LoRAClient, LoRAKeys, adapter_dropout, lora_client_spec
from pfl_cli.algorithms.pfedhn import PFedHN, PFedHNConfig
from pfl_cli.fl.config import key


@dataclass(frozen=True)
class PFedHNLoRAConfig(PFedHNConfig, LoRAKeys):
    """pFedHN's keys (paper §5, App. B; official code) and the LoRA keys (Hu et al. 2022) of the generated adapters."""

    algorithm: str = key("pfedhn-lora", "the algorithm these keys configure")


class PFedHNLoRA(LoRAClient, PFedHN):
    name = "pfedhn-lora"
    # under --secagg (pfl_cli.fl.secagg)
    individual_reads = ("each client's adapter delta, back-propagated through the hypernetwork at that client's own "
                        "embedding")
    search_space = PFedHN.search_space
    search_space_source = PFedHN.search_space_source
    tune_group = "train"
    paper = "pFedHN (Shamsian et al., ICML 2021, Alg. 1) generating LoRA adapters and the classifier (thesis §7.3)"
    new_client_protocol = "a fresh embedding trained embed_rounds rounds, hypernetwork frozen; its adapters h(v)"
    config = PFedHNLoRAConfig
    inert_keys = {**LoRAClient.inert_keys,
                  "client_sizes": "the adapters of one frozen base net have one shape (pFedHN's S / M / L sizes, §5.2, "
                                  "are widths of whole nets)"}

    @classmethod
    def resolve_arch(cls, cfg, store) -> dict:
        """pFedHN's table and hypernetwork with the LoRA client net as its target (A, B, classifier)."""
        from pfl_cli.fl.store import ROLE_TRAIN
        from pfl_cli.models import hyper_spec, table_spec

        client = lora_client_spec(cfg, store)
        rows = max(len(store.clients(ROLE_TRAIN)), 1)   # one row per train client: holdout clients have none
        dim = descriptor_dim(cfg, rows)  # §5: e = int(1 + n/4), n the train clients (the table's rows)
        return {"client": client, "table": table_spec(rows, dim),
                "hypernetwork": hyper_spec(dim, client, cfg.hyper_size, cfg.hyper_hidden)}

    def _local(self, theta, clients, gen, heads=None, momentum=None, group: str = ""):
        """pFedHN's K local steps, with the adapters' dropout on (``lora_dropout``)."""
        with adapter_dropout(self, gen):
            return super()._local(theta, clients, gen, heads, momentum, group)
