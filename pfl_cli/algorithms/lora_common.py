"""What the federated LoRA algorithms share (FedIT, FFA-LoRA, FedSA-LoRA, FlexLoRA, and the hypernetworks that generate
adapters: PeFLL-LoRA, pFedHN-LoRA, HyperFL-LPM-LoRA): the LoRA keys and the client net.

The client net is :class:`~pfl_cli.models.lora.LoRANet`: model_arch's net frozen (its weights buffers, seeded
random or ``lora_base_weights``), LoRA adapters on the layers ``lora_targets`` names, its classifier trained in
full. Each algorithm says which of the three parts (``A``, ``B``, ``head``: :func:`pfl_cli.models.lora.lora_parts`)
its clients train, which the server averages and which a client keeps. Adapter dropout (``lora_dropout``) acts in
local training only; its masks are drawn from torch's generator seeded from the round's stream, so a run and its
resumed run draw the same masks (with vmap each client its own: ``LoRANet.vmap_randomness``).

``adapter=ia3`` puts IA3's vectors (Liu et al. 2022, §3.3) on the same targets instead of LoRA's factors, on the
algorithms whose round needs no A and B (``adapter_kinds``: FedIT, FedAvg on whatever the client trains); the
others refuse it. IA3 has no rank, scaling or dropout: those keys are refused beside it (:data:`NEEDS`), as is
``ia3_feedforward`` beside LoRA.
"""

from __future__ import annotations

from dataclasses import dataclass

from pfl_cli.algorithms.base import BACKBONE_KEYS, Algorithm
from pfl_cli.errors import ConfigError
from pfl_cli.fl import adapters
from pfl_cli.fl.adapters import LORA, AdapterTraining, adapter_dropout, lora_arch  # noqa: F401 (re-exported)
from pfl_cli.fl.config import NEEDS, key

IA3 = "Liu et al., (IA)^3 (NeurIPS 2022)"
ADAPTERS = ("lora", "ia3")
REFUSAL = "its method is defined on LoRA's A and B factors, which IA3 has not; fedit trains IA3 vectors"

NO_BACKBONE = ("the LoRA algorithms adapt model_arch's net, frozen (or lora_base_weights): a pre-trained backbone "
               "net is hyperfl-lpm's and the full-training algorithms'")


@dataclass(frozen=True)
class LoRAKeys(adapters.LoRAKeys):
    """The LoRA algorithms' keys: the LoRA keys (:class:`pfl_cli.fl.adapters.LoRAKeys`) and the adapter kind."""

    adapter: str = key("lora", "the adapter on the targeted layers: lora (Hu et al. 2022, §4.1: B A added) | ia3 "
                       "(Liu et al. 2022, §3.3: a learned vector rescaling the layer's output, or its input for "
                       "ia3_feedforward's layers; fedit only)", f"{LORA}: the LoRA algorithms' papers use LoRA",
                       choices=ADAPTERS)
    ia3_feedforward: str = key("", "adapter=ia3: comma-separated patterns of the targeted layers whose input, not "
                               "output, IA3 rescales (peft's feedforward_modules; the paper's l_ff on the feed-forward "
                               "activation, e.g. output.dense of BERT, fc2 of an mlp)",
                               f"{IA3} §3.3: l_k, l_v on attention's keys and values, l_ff on the feed-forward "
                               "activation; \"\" = every target scales its output")

    def validate(self) -> None:
        super().validate()
        takes = getattr(self.algorithm_class, "adapter_kinds", ("lora",))
        if self.adapter not in takes:
            raise ConfigError(f"adapter must be {' or '.join(takes)} for {self.algorithm}; got {self.adapter!r} "
                              f"({getattr(self.algorithm_class, 'adapter_refusal', REFUSAL)}).")


# IA3's vectors have no rank, scaling or dropout; the feed-forward modules are IA3's (check_inert refuses a key set
# where it changes nothing)
NEEDS.update({k: (lambda cfg: getattr(cfg, "adapter", "lora") == "lora", "beside adapter=ia3 (IA3's vectors have no "
                  "rank, scaling or dropout)") for k in ("lora_rank", "lora_alpha", "lora_dropout")})
NEEDS["ia3_feedforward"] = (lambda cfg: getattr(cfg, "adapter", "lora") == "ia3", "without adapter=ia3")


class LoRAClient(AdapterTraining):
    """Mixin of the LoRA algorithms: their client net, the parts of it, and dropout during local training
    (:class:`pfl_cli.fl.adapters.AdapterTraining`)."""

    inert_keys = {k: NO_BACKBONE for k in BACKBONE_KEYS}
    adapter_kinds = ("lora",)  # the adapters its round is defined on (the ``adapter`` key)
    adapter_refusal = REFUSAL
    models_upload = False  # pflx attack models FedAvg's full-model upload, not an adapter's

    @staticmethod
    def resolve_arch(cfg, store) -> dict:
        return lora_arch(cfg, store, Algorithm.resolve_arch(cfg, store)["client"])

    @property
    def parts(self) -> dict[str, list[str]]:
        from pfl_cli.models.lora import lora_parts

        return lora_parts(k for k, _ in self.net.named_parameters())


def lora_client_spec(cfg, store) -> dict:
    """The LoRA client spec of the LoRA keys of ``cfg`` over model_arch's net (:func:`pfl_cli.fl.adapters.lora_arch`);
    the hypernetwork algorithms size their generated tensors from it."""
    return lora_arch(cfg, store, Algorithm.resolve_arch(cfg, store)["client"])["client"]


def parts_floats(arch: dict, *names: str) -> int:
    """Floats in the parts ``names`` ("A", "B", "head") of the LoRA client net ``arch["client"]``."""
    from pfl_cli.models import build
    from pfl_cli.models.lora import lora_parts

    net = build(arch["client"])
    params = dict(net.named_parameters())
    parts = lora_parts(params)
    return sum(params[k].numel() for n in names for k in parts[n])
