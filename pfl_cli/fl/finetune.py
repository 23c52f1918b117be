"""Serving by fine-tuning (issue 46): the served model fine-tuned ``finetune_steps`` local steps per client, on all its
weights or, with ``finetune_adapters=lora``, on fresh LoRA adapters over it frozen.

The methods whose server holds one full-weight model (FedAvg and the methods built on its server model,
:class:`~pfl_cli.fl.global_model.OneGlobalModel`'s asynchronous ones) serve a client that model fine-tuned
``finetune_steps`` local SGD steps on the client's fit data. :func:`finetune` is that step for all of them, reached
through :meth:`Algorithm.finetune <pfl_cli.algorithms.base.Algorithm.finetune>` (the engine never imports this module:
it builds LoRA nets, and ``pfl_cli.models`` imports the engine's package).

``finetune_adapters=lora`` (:class:`FinetuneAdapterKeys`) makes the personalized part LoRA adapters (Hu et al., ICLR
2022, §4.1): the served model becomes the frozen base of a :class:`~pfl_cli.models.lora.LoRANet` (adapters of rank
``lora_rank``, scaling ``lora_alpha / lora_rank`` on the layers ``lora_targets`` names; ``A`` drawn from the run's
seed, ``B`` zero, so every client starts at the served model), and each client trains only its adapters and the
classifier (trained in full, as peft's ``modules_to_save``) for ``finetune_steps`` steps: every client of a chunk in
one batched :func:`~pfl_cli.fl.cohort.local_sgd` call, with the batches the full-weight path draws. Federated training
is unchanged (the global model trains in full) and nothing new travels: fine-tuning is the client's own.

A client's served model is its adapters merged into the base, ``W + (alpha / r) B A`` per adapted layer (peft's
``merge_and_unload``; a convolution's ``A`` has the base's kernel and ``B`` is 1x1, so the merged kernel is
``sum_r B[:, r] A[r]``), the classifier its own: the same function as the adapted net, as full weights, which
evaluation, ``predict`` and ``--save-models`` read as they read the full-weight path's. A grouped convolution cannot
merge an adapter (its ``A`` mixes every input channel): ``lora_targets`` leaves such layers out, and naming one is
refused.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from pfl_cli.errors import ConfigError
from pfl_cli.fl.adapters import LoRAKeys, refuse_lora_keys_when_full
from pfl_cli.fl.config import TrainConfig, check_own_keys, key
from pfl_cli.fl.params import stack

FINETUNE_CHOICES = ("full", "lora")
# the LoRA keys fine-tuning reads, each meaning what it means on the LoRA algorithms (the same key, help and default);
# no lora_base_weights (the base is the served model) and no lora_dropout (fine-tuning runs plain SGD steps)
FINETUNE_LORA_KEYS = ("lora_rank", "lora_alpha", "lora_targets")


def _lora_key(name: str):
    f = {f.name: f for f in dataclasses.fields(LoRAKeys)}[name]
    return key(f.default, f.metadata["doc"], f.metadata["source"])


@dataclass(frozen=True)
class FinetuneAdapterKeys(TrainConfig):
    """``finetune_adapters`` (what ``finetune_steps`` trains) and the LoRA keys it reads; a config with
    ``finetune_steps`` takes it."""

    finetune_adapters: str = key("full", "what finetune_steps trains: full (every weight of the served model) | lora "
                                 "(fresh LoRA adapters, the lora_* keys, on the served model frozen, and its "
                                 "classifier)", "pflx (issue 46): full, FedAvg's fine-tuning",
                                 choices=FINETUNE_CHOICES)
    lora_rank: int = _lora_key("lora_rank")
    lora_alpha: float = _lora_key("lora_alpha")
    lora_targets: str = _lora_key("lora_targets")

    def validate(self) -> None:
        super().validate()
        if self.finetune_adapters not in FINETUNE_CHOICES:
            raise ConfigError(f"finetune_adapters must be one of {', '.join(FINETUNE_CHOICES)} for {self.algorithm}; "
                              f"got {self.finetune_adapters!r}.")
        if self.finetune_adapters == "full":
            refuse_lora_keys_when_full(self, "finetune_adapters", FINETUNE_LORA_KEYS)
            return
        steps = getattr(self, "finetune_steps", 0)
        if not steps:
            raise ConfigError(f"finetune_adapters=lora has no effect on {self.algorithm} with finetune_steps 0 (the "
                              f"adapters are what fine-tuning trains; a client is then served the global model); got "
                              f"finetune_steps {steps!r}. Set --finetune-steps N > 0, or drop finetune_adapters.")
        check_own_keys(self, {"lora_rank": "an integer >= 1", "lora_alpha": "a finite number > 0"})
        if getattr(self, "backbone", ""):
            raise ConfigError(f"finetune_adapters=lora on {self.algorithm} adapts model_arch's net; got backbone "
                              f"{self.backbone!r} (its own adapters). Drop one of them.")

    def without_finetuning(self) -> dict:
        """The keys that make this config serve without fine-tuning adapters (``predict --finetune-steps 0`` on a
        model trained with ``finetune_adapters=lora``: the global model as it is): full, the LoRA keys at their
        defaults."""
        defaults = type(self)()
        return {"finetune_adapters": "full", **{k: getattr(defaults, k) for k in FINETUNE_LORA_KEYS}}


def lora_finetuning(cfg) -> bool:
    """Whether ``cfg`` fine-tunes LoRA adapters (``finetune_adapters=lora``)."""
    return getattr(cfg, "finetune_adapters", "full") == "lora"


def finetune(alg, start: dict, clients, gen, steps: int) -> dict:
    """Each of ``clients``' model (stacked): the served model ``start`` fine-tuned ``steps`` local SGD steps on the
    client's fit data, all weights (:meth:`Algorithm.train_clients`) or LoRA adapters and the classifier merged into
    it (``finetune_adapters=lora``, see the module)."""
    if not lora_finetuning(alg.cfg):
        return alg.train_clients(start, clients, gen, steps=steps)
    net, theta = adapter_finetune(alg, start, clients, gen, steps)
    return merge_adapters(net, start, theta)


def check_finetune(alg) -> None:
    """Refuse, before any round, fine-tuning adapters the run's net cannot take (``lora_targets`` matching none of
    its layers, a grouped convolution, no classifier): the adapted net is built once over the initial model."""
    if lora_finetuning(alg.cfg) and getattr(alg.cfg, "finetune_steps", 0):
        served_adapter_net(alg, {k: v.detach() for k, v in alg.net.named_parameters()})


def finetune_protocol(cfg, steps: int, served: str = "global model") -> str:
    """The protocol ``metrics.json`` records: ``served``, or it fine-tuned ``steps`` steps (which part, with
    adapters)."""
    if not steps:
        return served
    if lora_finetuning(cfg):
        return f"{served} frozen, LoRA adapters (rank {cfg.lora_rank}) and classifier fine-tuned {steps} local steps"
    return f"{served} fine-tuned {steps} local steps"


def served_adapter_net(alg, start: dict):
    """The :class:`~pfl_cli.models.lora.LoRANet` over the served model ``start`` (a copy of ``alg.net`` holding it,
    frozen), with fresh adapters on ``lora_targets``: ``A`` drawn from the run's seed (the same for every client),
    ``B`` zero."""
    import copy
    import math

    import torch
    from torch import nn

    from pfl_cli.models.lora import LoRANet, match_targets
    from pfl_cli.rng import seed_sequence

    cfg = alg.cfg
    base = copy.deepcopy(alg.net)
    if not hasattr(base, "classifier"):
        raise ConfigError(f"finetune_adapters=lora on {cfg.algorithm}: the client net names no classifier (the part "
                          "trained in full beside the adapters); use a built-in net, or finetune_adapters=full.")
    with torch.no_grad():
        for name, p in base.named_parameters():
            p.copy_(start[name])
    targets = match_targets(base, cfg.lora_targets, cfg.lora_rank)
    modules = dict(base.named_modules())
    grouped = [n for n in targets if isinstance(modules[n], nn.Conv2d) and modules[n].groups > 1]
    if grouped:  # the group-rank rule let it through; merging its adapter into the kernel cannot
        raise ConfigError(f"lora_targets names {grouped[0]!r}, a convolution of {modules[grouped[0]].groups} groups, "
                          f"whose adapter cannot be merged into its kernel (finetune_adapters=lora serves merged "
                          "weights); leave it out.")
    with torch.random.fork_rng(devices=[]):  # the constructor's own draws leave the global generator as it was
        net = LoRANet(base, targets, cfg.lora_rank, cfg.lora_alpha)
    # A's start (Kaiming-uniform, as the constructor's) from a generator of a named stream of the run's seed, never the
    # global one: stacked runs (pfl_cli.fl.stack) fine-tune in threads at once
    gen = torch.Generator().manual_seed(int(seed_sequence(cfg.seed, "finetune-adapters").generate_state(1)[0]))
    with torch.no_grad():
        for name in targets:
            nn.init.kaiming_uniform_(net.model.get_submodule(name).lora_A.weight, a=math.sqrt(5), generator=gen)
    return net.to(alg.device)


def adapter_finetune(alg, start: dict, clients, gen, steps: int, chunk: int = 64):
    """``(net, theta)``: the :func:`served_adapter_net` and every client's adapters and classifier {name: (c, ...)}
    after ``steps`` local SGD steps (the client optimizer's settings), ``chunk`` clients in one batched call, the
    batches drawn from ``gen`` as the full-weight path draws them. The steps count in ``client_sgd_steps``."""
    import torch

    from pfl_cli.fl.cohort import local_sgd

    net = served_adapter_net(alg, start)
    init = {k: v.detach() for k, v in net.named_parameters()}
    out: dict[str, list] = {k: [] for k in init}
    for lo in range(0, len(clients), chunk):
        sel = torch.as_tensor(clients[lo:lo + chunk], device=alg.device)
        batches = alg.local_batches(sel, gen, steps=steps)
        theta, _ = local_sgd(net, stack(init, len(sel)), alg.store, batches, **alg.sgd_options())
        alg.client_sgd_steps += batches.active_steps()
        for k, v in theta.items():
            out[k].append(v)
    return net, {k: torch.cat(v) if v else init[k].unsqueeze(0)[:0] for k, v in out.items()}


def merge_adapters(net, start: dict, theta: dict) -> dict:
    """Full weights {name: (c, ...)} of ``start``'s net: each adapted layer's weight plus its client's
    ``(alpha / r) B A``, the classifier each client's own, the rest ``start`` (see the module)."""
    import torch

    c = next(iter(theta.values())).shape[0]
    out = {k: v.unsqueeze(0).expand(c, *v.shape).clone() for k, v in start.items()}
    for layer in net.targets:
        a, b = theta[f"model.{layer}.lora_A.weight"], theta[f"model.{layer}.lora_B.weight"]
        scaling = net.model.get_submodule(layer).scaling
        # linear: B (c, out, r) A (c, r, in); convolution: B (c, out, r, 1, 1) A (c, r, in, kh, kw)
        delta = torch.einsum("cor,cri...->coi...", b.flatten(2), a)
        out[f"{layer}.weight"] = out[f"{layer}.weight"] + scaling * delta
    for k, v in theta.items():
        if ".lora_A." not in k and ".lora_B." not in k:  # the classifier, trained in full
            out[k.removeprefix("model.")] = v
    return out
