"""LoRA adapters as what an algorithm trains (issue 46): the LoRA keys, the adapted client net, adapter dropout, and
``adapters=lora``, the key that makes the personalized part of a full-weight method LoRA adapters.

The LoRA algorithms (FedIT, FFA-LoRA, FedSA-LoRA, FlexLoRA, FedDPA; :mod:`pfl_cli.algorithms.lora_common`) always
train adapters. A method that trains model_arch's full weights (Local, FedRep) takes ``adapters`` (:class:`AdapterKeys`):
``full`` (the default) leaves it as it was; ``lora`` gives it the LoRA client net instead (model_arch's net frozen,
its seeded start or ``lora_base_weights``, adapters on the layers ``lora_targets`` names, its classifier trained in
full: :mod:`pfl_cli.models.lora`), so that whatever the method trains, keeps or shares of the net is adapters and
the classifier. What that means for each method is said by the method (its docstring, ``pflx algorithms NAME``).
"""

from __future__ import annotations

import math
from contextlib import contextmanager
from dataclasses import dataclass

from pfl_cli.errors import ConfigError, InputError
from pfl_cli.fl.config import TrainConfig, check_own_keys, key

LORA = "Hu et al., LoRA (ICLR 2022)"
ADAPTER_CHOICES = ("full", "lora")


@dataclass(frozen=True)
class LoRAKeys(TrainConfig):
    """The LoRA keys (Hu et al. 2022, §4.1): targets, rank, scaling, dropout and the frozen base."""

    # Rank and scaling: LoRA's own RoBERTa setting (Hu et al. 2022, App. D, Table 9: r_q = r_v = 8, alpha = 8), the
    # model family of the three federated papers' GLUE experiments. Adapter dropout: off in pflx (a run's numbers
    # then do not depend on the cohort's execution path, vmap or loop); a key for the papers' nonzero settings.
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


LORA_KEYS = ("lora_rank", "lora_alpha", "lora_dropout", "lora_targets", "lora_base_weights")


@dataclass(frozen=True)
class AdapterKeys(LoRAKeys):
    """``adapters`` (full weights, or LoRA adapters on the frozen base) and the LoRA keys it reads."""

    adapters: str = key("full", "full: train model_arch's full weights; lora: LoRA adapters (the lora_* keys) on "
                        "model_arch's net frozen, and its classifier", "pflx (issue 46): full, the method as "
                        "published", choices=ADAPTER_CHOICES)

    def validate(self) -> None:
        super().validate()
        if self.adapters not in ADAPTER_CHOICES:
            raise ConfigError(f"adapters must be one of {', '.join(ADAPTER_CHOICES)} for {self.algorithm}; got "
                              f"{self.adapters!r}.")
        if self.adapters == "full":
            refuse_lora_keys_when_full(self, "adapters", LORA_KEYS)
        elif getattr(self, "backbone", ""):
            raise ConfigError(f"backbone has no effect on {self.algorithm} with adapters=lora (the adapters go on "
                              f"model_arch's net, frozen); got {self.backbone!r}. Drop one of them.")


def uses_adapters(cfg) -> bool:
    """Whether the run's client net is the LoRA net: a LoRA algorithm's config, or ``adapters=lora``."""
    return getattr(cfg, "adapters", "lora") == "lora" and hasattr(cfg, "lora_rank")


def lora_arch(cfg, store, base: dict) -> dict:
    """``{"client": spec}`` of the LoRA client net over the client spec ``base`` (model_arch's net)."""
    from pfl_cli.models import build
    from pfl_cli.models.lora import lora_spec

    if getattr(store, "vocab_size", None) is not None and not cfg.model_arch.startswith("hf:"):
        raise InputError(f"{cfg.algorithm}: LoRA adapts linear and convolution layers; the text client net "
                         "(LSTM) has none before its classifier; adapt a transformers checkpoint "
                         "(--model-arch hf:DIR).")
    return {"client": lora_spec(base, build(base), targets=cfg.lora_targets, rank=cfg.lora_rank,
                                alpha=cfg.lora_alpha, dropout=cfg.lora_dropout, weights=cfg.lora_base_weights,
                                # IA3's vectors instead (the LoRA algorithms' adapter=ia3: lora_common.LoRAKeys)
                                adapter=getattr(cfg, "adapter", "lora"),
                                feedforward=getattr(cfg, "ia3_feedforward", ""))}


def refuse_lora_keys_when_full(cfg, switch: str, names) -> None:
    """Refuse a ``lora_*`` key set away from its default while ``switch`` (``adapters``, ``finetune_adapters``)
    is ``full``, where no adapter exists for it to shape."""
    defaults = type(cfg)()
    for name in names:
        if getattr(cfg, name) != getattr(defaults, name):
            raise ConfigError(f"{name} has no effect on {cfg.algorithm} with {switch}=full (the lora_* keys shape the "
                              f"adapters of {switch}=lora); got {getattr(cfg, name)!r}. Add --set {switch}=lora, or "
                              f"drop {name}.")


class AdapterTraining:
    """Mixin: local steps with the adapters' dropout on (LoRA nets with ``lora_dropout`` > 0), its masks from a seed
    drawn from the round's stream, so that a run and its resumed run draw the same masks (with vmap each client its
    own: ``LoRANet.vmap_randomness``)."""

    def cohort_sgd(self, start, clients, gen, **options):
        with adapter_dropout(self, gen):
            return super().cohort_sgd(start, clients, gen, **options)


@contextmanager
def adapter_dropout(alg, gen):
    """The adapters' dropout on for the local steps run inside (a no-op without LoRA adapters or ``lora_dropout``):
    its masks are drawn by torch's global generator seeded from ``gen`` (the round's stream), restored afterwards."""
    if not uses_adapters(alg.cfg) or not alg.cfg.lora_dropout:
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


def adapted_arch(cfg, store, arch: dict) -> dict:
    """``arch`` (the method's own client net), or its LoRA net under ``adapters=lora``."""
    return lora_arch(cfg, store, arch["client"]) if cfg.adapters == "lora" else arch
