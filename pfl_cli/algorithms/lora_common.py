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

import math
from contextlib import contextmanager
from dataclasses import dataclass

from pfl_cli.algorithms.base import BACKBONE_KEYS, Algorithm
from pfl_cli.errors import ConfigError, InputError
from pfl_cli.fl.config import NEEDS, TrainConfig, check_own_keys, key

LORA = "Hu et al., LoRA (ICLR 2022)"
IA3 = "Liu et al., (IA)^3 (NeurIPS 2022)"
ADAPTERS = ("lora", "ia3")
REFUSAL = "its method is defined on LoRA's A and B factors, which IA3 has not; fedit trains IA3 vectors"
# Rank and scaling: LoRA's own RoBERTa setting (Hu et al. 2022, App. D, Table 9: r_q = r_v = 8, alpha = 8), the model
# family of the three federated papers' GLUE experiments. Adapter dropout: off in pflx (a run's numbers then do
# not depend on the cohort's execution path, vmap or loop); a key for the papers' nonzero settings.
NO_BACKBONE = ("the LoRA algorithms adapt model_arch's net, frozen (or lora_base_weights): a pre-trained backbone "
               "net is hyperfl-lpm's and the full-training algorithms'")


@dataclass(frozen=True)
class LoRAKeys(TrainConfig):
    """The LoRA keys (Hu et al. 2022, §4.1): targets, rank, scaling, dropout and the frozen base."""

    adapter: str = key("lora", "the adapter on the targeted layers: lora (Hu et al. 2022, §4.1: B A added) | ia3 "
                       "(Liu et al. 2022, §3.3: a learned vector rescaling the layer's output, or its input for "
                       "ia3_feedforward's layers; fedit only)", f"{LORA}: the LoRA algorithms' papers use LoRA",
                       choices=ADAPTERS)
    ia3_feedforward: str = key("", "adapter=ia3: comma-separated patterns of the targeted layers whose input, not "
                               "output, IA3 rescales (peft's feedforward_modules; the paper's l_ff on the feed-forward "
                               "activation, e.g. output.dense of BERT, fc2 of an mlp)",
                               f"{IA3} §3.3: l_k, l_v on attention's keys and values, l_ff on the feed-forward "
                               "activation; \"\" = every target scales its output")
    lora_rank: int = key(8, "r: rank of every LoRA adapter", f"{LORA}, App. D, Table 9 (RoBERTa): r = 8")
    lora_alpha: float = key(8.0, "alpha: the adapter's output is scaled by alpha / r (§4.1)",
                            f"{LORA}, App. D, Table 9 (RoBERTa): alpha = 8")
    lora_dropout: float = key(0.0, "dropout on the adapter's input during local training (peft's lora_dropout)",
                              "pflx: off (the execution paths then give equal numbers)")
    lora_targets: str = key("*", "comma-separated module-name patterns of the base net's linear / convolution "
                            "layers that get adapters (fnmatch; '*' every one before the classifier)",
                            f"{LORA} §4.2: any dense layer may be adapted")
    lora_base_weights: str = key("", "a state dict of model_arch's net to adapt (.pt / .pth / .safetensors, or the "
                                 "model.pt of a pflx train run of one net, e.g. --algorithm centralized on public "
                                 "data; its sha256 is recorded); \"\" = the net frozen at its seeded random "
                                 "initialization")

    def validate(self) -> None:
        super().validate()
        check_own_keys(self, {"lora_rank": "an integer >= 1", "lora_alpha": "a finite number > 0"})
        p = self.lora_dropout
        if isinstance(p, bool) or not isinstance(p, (int, float)) or not math.isfinite(p) or not 0 <= p < 1:
            raise ConfigError(f"lora_dropout must be in [0, 1) for {self.algorithm}; got {p!r}.")
        takes = getattr(self.algorithm_class, "adapter_kinds", ("lora",))
        if self.adapter not in takes:
            raise ConfigError(f"adapter must be {' or '.join(takes)} for {self.algorithm}; got {self.adapter!r} "
                              f"({getattr(self.algorithm_class, 'adapter_refusal', REFUSAL)}).")


# IA3's vectors have no rank, scaling or dropout; the feed-forward modules are IA3's (check_inert refuses a key set
# where it changes nothing)
NEEDS.update({k: (lambda cfg: getattr(cfg, "adapter", "lora") == "lora", "beside adapter=ia3 (IA3's vectors have no "
                  "rank, scaling or dropout)") for k in ("lora_rank", "lora_alpha", "lora_dropout")})
NEEDS["ia3_feedforward"] = (lambda cfg: getattr(cfg, "adapter", "lora") == "ia3", "without adapter=ia3")


class LoRAClient:
    """Mixin of the LoRA algorithms: their client net, the parts of it, and dropout during local training."""

    inert_keys = {k: NO_BACKBONE for k in BACKBONE_KEYS}
    adapter_kinds = ("lora",)  # the adapters its round is defined on (the ``adapter`` key)
    adapter_refusal = REFUSAL
    models_upload = False  # pflx attack models FedAvg's full-model upload, not an adapter's

    @staticmethod
    def resolve_arch(cfg, store) -> dict:
        return {"client": lora_client_spec(cfg, store)}

    @property
    def parts(self) -> dict[str, list[str]]:
        from pfl_cli.models.lora import lora_parts

        return lora_parts(k for k, _ in self.net.named_parameters())

    def cohort_sgd(self, start, clients, gen, **options):
        """Local steps with the adapters' dropout on, its masks from a seed drawn from the round's stream."""
        with adapter_dropout(self, gen):
            return super().cohort_sgd(start, clients, gen, **options)


def lora_client_spec(cfg, store) -> dict:
    """The LoRA client spec of the LoRA keys of ``cfg``: model_arch's net (a model kind's, an ``hf:`` checkpoint's),
    frozen, with adapters on the layers ``lora_targets`` names (refused on the text LSTM, which has none)."""
    from pfl_cli.models import build
    from pfl_cli.models.lora import lora_spec

    if getattr(store, "vocab_size", None) is not None and not cfg.model_arch.startswith("hf:"):
        raise InputError(f"{cfg.algorithm}: LoRA adapts linear and convolution layers; the text client net "
                         "(LSTM) has none before its classifier; adapt a transformers checkpoint "
                         "(--model-arch hf:DIR).")
    base = Algorithm.resolve_arch(cfg, store)["client"]
    return lora_spec(base, build(base), targets=cfg.lora_targets, rank=cfg.lora_rank, alpha=cfg.lora_alpha,
                     dropout=cfg.lora_dropout, weights=cfg.lora_base_weights, adapter=cfg.adapter,
                     feedforward=cfg.ia3_feedforward)


@contextmanager
def adapter_dropout(alg, gen):
    """The adapters' dropout on for the local steps run inside (a no-op without ``lora_dropout``): its masks are
    drawn by torch's global generator seeded from ``gen`` (the round's stream), restored afterwards."""
    if not alg.cfg.lora_dropout:
        yield
        return
    import torch

    from pfl_cli.models.lora import set_dropout

    seed = int(torch.randint(0, 2 ** 62, (1,), generator=gen, device=gen.device))
    cuda = [alg.device.index or 0] if alg.device.type == "cuda" else []
    with torch.random.fork_rng(devices=cuda):
        torch.manual_seed(seed)
        set_dropout(alg.net, True)
        try:
            yield
        finally:
            set_dropout(alg.net, False)


def parts_floats(arch: dict, *names: str) -> int:
    """Floats in the parts ``names`` ("A", "B", "head") of the LoRA client net ``arch["client"]``."""
    from pfl_cli.models import build
    from pfl_cli.models.lora import lora_parts

    net = build(arch["client"])
    params = dict(net.named_parameters())
    parts = lora_parts(params)
    return sum(params[k].numel() for n in names for k in parts[n])
