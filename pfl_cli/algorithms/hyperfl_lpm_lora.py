"""HyperFL-LPM-LoRA: HyperFL-LPM with LoRA adapters in place of its bottleneck adapters.

HyperFL-LPM (Guo et al., AAAI 2025, §3.3, App. D.1; :mod:`pfl_cli.algorithms.hyperfl_lpm`) freezes a pre-trained
backbone and has its hypernetwork generate bottleneck adapters (down-projection, ReLU, up-projection after each
block, Houlsby et al. 2019). Here the hypernetwork generates LoRA adapters instead (Hu et al., LoRA, ICLR 2022, §4.1:
base(x) + B A x alpha / r on the backbone's linear and convolution layers that ``lora_targets`` names), which §3.3
lists beside adapters among the parameter-efficient fine-tuning techniques it may use ("Hu et al. 2022"), and the
thesis proposes for its hypernetworks (Scott 2026, §7.3). The client net is the backbone frozen (``tune=probe``:
no bottleneck adapters) wrapped by :class:`~pfl_cli.models.lora.LoRANet`: the generated A and B are its body, the
classifier its head. HyperFL's round is unchanged (step 1, eq. 4: the classifier; step 2, eq. 5: hypernetwork and
embedding through the generated adapters; the hypernetwork averaged, eq. 6), and so is its new-client protocol.
"""

from __future__ import annotations

from dataclasses import dataclass

from pfl_cli.algorithms.hyperfl import DEFAULT_EMBED_DIM
from pfl_cli.algorithms.hyperfl_lpm import HyperFLLPM, HyperFLLPMConfig, check_image_backbone
from pfl_cli.algorithms.lora_common import LoRAKeys
from pfl_cli.fl.config import key


@dataclass(frozen=True)
class HyperFLLPMLoRAConfig(HyperFLLPMConfig, LoRAKeys):
    """HyperFL-LPM's keys (App. D.1) and the LoRA keys (Hu et al. 2022) of the generated adapters."""

    algorithm: str = key("hyperfl-lpm-lora", "the algorithm these keys configure")


class HyperFLLPMLoRA(HyperFLLPM):
    name = "hyperfl-lpm-lora"
    individual_reads = ""  # under --secagg HyperFL's round: the hypernetwork's mean from sums
    search_space = HyperFLLPM.search_space
    search_space_source = HyperFLLPM.search_space_source
    tune_group = "train"
    config = HyperFLLPMLoRAConfig
    # pflx attack's model of HyperFL's upload has been checked on bottleneck adapters (tests/attack), not on generated
    # LoRA adapters: not offered here until it is
    models_upload = False
    # HyperFL's local steps are its own two stages, which run no adapter dropout; the frozen base is the backbone
    inert_keys = {"lora_dropout": "HyperFL's two local stages run without adapter dropout",
                  "lora_base_weights": "its frozen base is the backbone (backbone_weights)",
                  "backbone_tune": "the backbone is frozen and LoRA adapts it (backbone_tune=probe, fixed)",
                  "model_arch": "its client net is the backbone (--set backbone=), never model_arch's",
                  "mlp_hidden": "its client net is the backbone (--set backbone=), never an mlp"}
    paper = "HyperFL-LPM (Guo et al., AAAI 2025 §3.3) generating LoRA adapters (Hu et al. 2022) instead of bottleneck ones"
    new_client_protocol = "its embedding and classifier trained local_epochs under the global hypernetwork"

    @staticmethod
    def resolve_arch(cfg, store) -> dict:
        from pfl_cli.fl.split import split_names
        from pfl_cli.models import build, hyper_spec
        from pfl_cli.models.lora import lora_spec
        from pfl_cli.models.pretrained import backbone_spec

        check_image_backbone(cfg, store)
        base = backbone_spec(cfg.backbone, store.input_shape, store.num_classes, tune="probe",
                             weights=cfg.backbone_weights or None)
        unweighted = {k: v for k, v in base.items() if k not in ("weights", "weights_sha256")}
        client = lora_spec(base, build(unweighted), targets=cfg.lora_targets, rank=cfg.lora_rank,
                           alpha=cfg.lora_alpha, dropout=0.0)
        # the adapter names need no weights: the LoRA net built over the backbone without reading its file
        adapters = split_names(build({**client, "base": unweighted}))[0]
        dim = int(cfg.embed_dim) or DEFAULT_EMBED_DIM
        # App. D.1 / B.4: Linear(64, hidden) -> ReLU -> one linear head per generated tensor (here each A and B)
        return {"client": client,
                "hypernetwork": hyper_spec(dim, client, "M", cfg.hyper_hidden, n_hidden=0, relu_out=True,
                                           generate=adapters)}
