"""What the federated LoRA algorithms share (FedIT, FFA-LoRA, FedSA-LoRA, FlexLoRA, and the hypernetworks that generate
adapters: PeFLL-LoRA, pFedHN-LoRA, HyperFL-LPM-LoRA): the LoRA keys and the client net.

The client net is :class:`~pfl_cli.models.lora.LoRANet`: model_arch's net frozen (its weights buffers, seeded
random or ``lora_base_weights``), LoRA adapters on the layers ``lora_targets`` names, its classifier trained in
full. Each algorithm says which of the three parts (``A``, ``B``, ``head``: :func:`pfl_cli.models.lora.lora_parts`)
its clients train, which the server averages and which a client keeps. Adapter dropout (``lora_dropout``) acts in
local training only; its masks are drawn from torch's generator seeded from the round's stream, so a run and its
resumed run draw the same masks (with vmap each client its own: ``LoRANet.vmap_randomness``).
"""

from __future__ import annotations

from pfl_cli.algorithms.base import BACKBONE_KEYS, Algorithm
from pfl_cli.fl.adapters import LORA, AdapterTraining, LoRAKeys, adapter_dropout, lora_arch  # noqa: F401 (re-exported)

NO_BACKBONE = ("the LoRA algorithms adapt model_arch's net, frozen (or lora_base_weights): a pre-trained backbone "
               "net is hyperfl-lpm's and the full-training algorithms'")


class LoRAClient(AdapterTraining):
    """Mixin of the LoRA algorithms: their client net, the parts of it, and dropout during local training
    (:class:`pfl_cli.fl.adapters.AdapterTraining`)."""

    inert_keys = {k: NO_BACKBONE for k in BACKBONE_KEYS}
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
