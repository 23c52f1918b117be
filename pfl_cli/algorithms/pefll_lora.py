"""PeFLL-LoRA: PeFLL's embedding network and hypernetwork generating a client's LoRA adapters and classifier.

The thesis's proposal (Scott 2026, §7.3 "Future Directions"): "rather than generating full model weights, the
hypernetwork could be repurposed to generate client-specific LoRA adapters [...]. This would drastically reduce the
dimensionality of the output space, providing an efficient, feed-forward approach to personalizing powerful
foundation models to heterogeneous clients."

Everything of PeFLL (thesis Alg. 7 and 8, :mod:`pfl_cli.algorithms.pefll`) stands; only the target network
changes. theta = h(v) is now the parameters of the LoRA client net of the LoRA algorithms
(:mod:`pfl_cli.algorithms.lora_common`): model_arch's net frozen (seeded random, or ``lora_base_weights``), the
adapters ``lora_A`` / ``lora_B`` (Hu et al., LoRA, ICLR 2022, §4.1: base(x) + B A x alpha / r) on the layers
``lora_targets`` names and the classifier. The hypernetwork has one output head per adapter matrix and per
classifier tensor (Table B.3's FC5 split per target tensor, sized D = |A| + |B| + |head| instead of the whole net),
so a client's local steps (Alg. 8 step 10) move only the adapters and the classifier over the one shared frozen
base (its weights are buffers: a cohort's ``functional_call`` reads one copy), and only they travel. A client never
seen in training gets its adapters in one forward pass over its data (Alg. 7): descriptor, hypernetwork, no
optimizer step; ``pflx predict --save-models`` writes them in peft's format (:mod:`pfl_cli.models.lora_export`).
"""

from __future__ import annotations

from dataclasses import dataclass

from pfl_cli.algorithms.base import descriptor_dim
from pfl_cli.algorithms.lora_common import LoRAClient, LoRAKeys, lora_client_spec
from pfl_cli.algorithms.pefll import PeFLL, PeFLLConfig
from pfl_cli.fl.config import key


@dataclass(frozen=True)
class PeFLLLoRAConfig(PeFLLConfig, LoRAKeys):
    """PeFLL's keys (thesis §4.4, App. B.1.2) and the LoRA keys (Hu et al. 2022) of the generated adapters."""

    algorithm: str = key("pefll-lora", "the algorithm these keys configure")


class PeFLLLoRA(LoRAClient, PeFLL):
    name = "pefll-lora"
    # under --secagg (pfl_cli.fl.secagg)
    individual_reads = ("each client's adapter delta, back-propagated through the hypernetwork at that client's own "
                        "embedding")
    search_space = PeFLL.search_space
    search_space_source = PeFLL.search_space_source
    tune_group = "new"
    paper = ("PeFLL (Scott et al., ICLR 2024; thesis Alg. 7, 8) generating LoRA adapters and the classifier, thesis "
             "§7.3's proposal")
    new_client_protocol = "its LoRA adapters and classifier generated from its descriptor, no optimizer step (Alg. 7)"
    config = PeFLLLoRAConfig
    serves_unlabeled = "pefll-lora with --embedding cnn-x or mlp-x (label-free descriptors, Table 4.2)"

    @staticmethod
    def resolve_arch(cfg, store) -> dict:
        """PeFLL's nets with the LoRA client net as the hypernetwork's target (its parameters: A, B, classifier)."""
        from pfl_cli.models import embedding_spec, hyper_spec

        text = {"vocab": getattr(store, "vocab_size", None), "lstm_hidden": cfg.lstm_hidden}
        client = lora_client_spec(cfg, store)
        dim = descriptor_dim(cfg, store.num_clients)
        return {
            "client": client,
            "embedding": embedding_spec(cfg.embedding, store.input_shape, store.num_classes, dim, **text),
            "hypernetwork": hyper_spec(dim, client, cfg.hyper_size, cfg.hyper_hidden),
        }
