"""LoRA adapters on a frozen base net (Hu et al., ICLR 2022, §4.1): the client net of the LoRA algorithms.

A targeted layer computes ``base(x) + B(A(dropout(x))) * alpha / r`` (§4.1, with its scaling alpha / r and the
dropout on the adapter's input that ``peft`` applies): ``A`` (``lora_A``) maps the layer's input to rank ``r``,
``B`` (``lora_B``) maps it back; ``A`` starts Kaiming-uniform (a = sqrt 5, as ``nn.Linear``), ``B`` at zero, so
the adapted net starts as its base. A convolution's ``A`` is a convolution of the base's kernel, stride and
padding to ``r`` channels and ``B`` a 1x1 convolution (peft's ``Conv2d``). These are ``peft``'s definitions
(``peft.tuners.lora.layer.Linear`` / ``Conv2d``, default ``LoraConfig``), written here in plain torch so that
a cohort's adapters run through ``torch.func.functional_call`` + ``vmap`` without importing transformers (peft
imports it: seconds at every start); tests/models/test_lora.py holds the two equal on the same weights, and
:mod:`pfl_cli.models.lora_export` writes the adapters in peft's own on-disk format.

Every base weight is a *buffer* (:func:`pfl_cli.models.pretrained.freeze`): a vmapped cohort reads one shared
copy, no optimizer sees it and no gradient is formed for it. The parameters of the net are the adapters and the
classifier (the base's last layer, trained in full like peft's ``modules_to_save`` for classification), named as
peft names them below ``base_model.``: ``model.<layer>.lora_A.weight``, ``model.<layer>.lora_B.weight``.

The base is model_arch's net, randomly initialized from the run's seed (a frozen random feature map) or loaded
from a user's state dict (``lora_base_weights``, recorded with its sha256 so that ``predict`` and ``--resume``
refuse a changed file).

IA3 (Liu et al., NeurIPS 2022, "Few-Shot Parameter-Efficient Fine-Tuning is Better and Cheaper than In-Context
Learning", §3.3) is the second adapter (``adapter=ia3``): a learned vector rescales a targeted layer's output (the
keys and values of attention) or, for a feed-forward module, its input (the feed-forward activation the next
layer reads), ``l_k``, ``l_v``, ``l_ff``, all starting at one. These are peft's ``IA3Config`` definitions
(``peft.tuners.ia3.layer.Linear`` / ``Conv2d``: ``target_modules``, ``feedforward_modules``): the vector
``ia3_l`` has shape ``(out, 1)`` (a feed-forward linear layer ``(1, in)``; a convolution ``(1, C, 1, 1)``), named
``model.<layer>.ia3_l`` as peft saves it; tests/models/test_lora.py holds it equal to peft's on the same weights.
"""

from __future__ import annotations

import fnmatch
import math
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from pfl_cli.errors import ConfigError, InputError

TARGETABLE = (nn.Linear, nn.Conv2d)


class _WrapsBase:
    """The base layer's weight and bias, as peft's layers expose them: model code reads them through the layer it
    wraps (transformers' ViT reads its patch projection's weight dtype)."""

    @property
    def weight(self):
        return self.base_layer.weight

    @property
    def bias(self):
        return self.base_layer.bias


class LoRALayer(_WrapsBase, nn.Module):
    """A frozen ``base_layer`` plus ``lora_B(lora_A(dropout(x))) * scaling``; dropout acts in training mode only.

    ``dual``: a second adapter beside it (``local_A``, ``local_B``: FedDPA's local adapter, Yang et al., NeurIPS
    2024, §4.1), the layer's output then ``base(x) + g * global(x) + l * local(x)`` with the weights ``mix = (g, l)``
    (numbers, or one weight per instance of the batch: FedDPA's instance-wise weighting, §4.3); ``mix`` None is
    ``(1, 0)``, the global adapter alone.
    """

    def __init__(self, base_layer: nn.Module, rank: int, alpha: float, dropout: float, dual: bool = False) -> None:
        super().__init__()
        self.base_layer = base_layer
        self.rank, self.alpha, self.dropout = int(rank), float(alpha), float(dropout)
        self.scaling = self.alpha / self.rank
        self.lora_A, self.lora_B = self._pair(base_layer)
        if dual:
            self.local_A, self.local_B = self._pair(base_layer)
        self.dual = bool(dual)
        self.mix = None

    def _pair(self, base_layer: nn.Module):
        if isinstance(base_layer, nn.Linear):
            a = nn.Linear(base_layer.in_features, self.rank, bias=False)
            b = nn.Linear(self.rank, base_layer.out_features, bias=False)
        else:
            a = nn.Conv2d(base_layer.in_channels, self.rank, base_layer.kernel_size, base_layer.stride,
                          base_layer.padding, bias=False)
            b = nn.Conv2d(self.rank, base_layer.out_channels, 1, 1, groups=base_layer.groups, bias=False)
        nn.init.kaiming_uniform_(a.weight, a=math.sqrt(5))
        nn.init.zeros_(b.weight)
        return a, b

    def forward(self, x):
        z = F.dropout(x, self.dropout, training=True) if self.training and self.dropout > 0 else x
        if not self.dual:
            return self.base_layer(x) + self.lora_B(self.lora_A(z)) * self.scaling
        g, l = self.mix if self.mix is not None else (1.0, 0.0)
        out = self.base_layer(x)
        for w, a, b in ((g, self.lora_A, self.lora_B), (l, self.local_A, self.local_B)):
            if isinstance(w, torch.Tensor):  # one weight per instance: (batch,) against (batch, ...)
                out = out + b(a(z)) * self.scaling * w.reshape(-1, *([1] * (out.dim() - 1)))
            elif w:
                out = out + b(a(z)) * (self.scaling * w)
        return out


class IA3Layer(_WrapsBase, nn.Module):
    """A frozen ``base_layer`` whose output (or, ``feedforward``, input) is rescaled channel-wise by ``ia3_l``."""

    def __init__(self, base_layer: nn.Module, feedforward: bool) -> None:
        super().__init__()
        self.base_layer = base_layer
        self.feedforward = bool(feedforward)
        conv = isinstance(base_layer, nn.Conv2d)
        width = (base_layer.in_channels if conv else base_layer.in_features) if feedforward else \
            (base_layer.out_channels if conv else base_layer.out_features)
        # peft's shapes (update_layer): a linear layer's (out, 1) or (1, in), a convolution's (1, C, 1, 1)
        shape = (1, width, 1, 1) if conv else (1, width) if feedforward else (width, 1)
        self.ia3_l = nn.Parameter(torch.ones(shape))
        self._flatten = not conv  # a linear layer's vector multiplies the last (feature) axis

    def forward(self, x):
        scale = self.ia3_l.flatten() if self._flatten else self.ia3_l
        if self.feedforward:
            return self.base_layer(x * scale)
        return self.base_layer(x) * scale


class LoRANet(nn.Module):
    """``model`` (the base net, frozen) with LoRA (or IA3) layers in place of its targeted layers; its classifier
    trains."""

    # vmap draws each client's dropout mask apart (no random op runs when dropout is 0 or outside training)
    vmap_randomness = "different"

    def __init__(self, base: nn.Module, targets: list[str], rank: int = 8, alpha: float = 8.0, dropout: float = 0.0,
                 dual: bool = False, *, adapter: str = "lora", feedforward: list[str] = ()) -> None:
        super().__init__()
        self.model = base
        self.classifier = f"model.{base.classifier}"
        self.targets = list(targets)
        head = dict(base.named_modules())[base.classifier]
        head_params = {id(p) for p in head.parameters()}
        for name, p in list(base.named_parameters()):
            if id(p) not in head_params:
                owner, _, leaf = name.rpartition(".")
                module = base.get_submodule(owner) if owner else base
                del module._parameters[leaf]
                module.register_buffer(leaf, p.detach())
        for name in self.targets:
            parent, _, leaf = name.rpartition(".")
            holder = base.get_submodule(parent) if parent else base
            layer = getattr(holder, leaf)
            setattr(holder, leaf, IA3Layer(layer, name in feedforward) if adapter == "ia3" else
                    LoRALayer(layer, rank, alpha, dropout, dual))
        self.eval()  # dropout off (evaluation, new clients' scoring); the algorithms switch it on for local steps
        self.cohort_fold = _foldable(self, adapter, dual)

    def forward(self, x):
        return self.model(x)


def _foldable(net: nn.Module, adapter: str, dual: bool) -> frozenset[str]:
    """The names of the per-client tensors with which a cohort may run folded into one batch
    (:func:`pfl_cli.fl.cohort.cohort_forward`): the weights and biases of the net's linear layers (the adapters
    and a linear classifier), or none (the cohort then runs under vmap).

    Folding computes the shared frozen base once on every client's rows and each client's own linear layers as
    one grouped matmul over its rows (the batched multi-LoRA of Punica / S-LoRA). It is exact only where no layer
    mixes rows across the batch and every per-client tensor is read through ``F.linear``: not with BatchNorm (its
    statistics would pool the clients), IA3's vectors (read by ``*``), FedDPA's instance-weighted pair, or a
    convolution's adapters.
    """
    batch_statistics = any(isinstance(m, nn.modules.batchnorm._BatchNorm) or "batchnorm" in type(m).__name__.lower()
                           for m in net.modules())  # torch's, pflx's own (mlp-bn), timm's BatchNormAct2d
    if adapter != "lora" or dual or batch_statistics:
        return frozenset()
    names = set()
    for prefix, m in net.named_modules():
        if isinstance(m, LoRALayer) and not isinstance(m.base_layer, nn.Linear):
            return frozenset()
        if type(m) is nn.Linear:
            names.update(f"{prefix}.{k}" for k, v in m._parameters.items() if v is not None)
    return frozenset(names) if net.classifier + ".weight" in names else frozenset()


def lora_parts(names) -> dict[str, list[str]]:
    """``{"A": [...], "B": [...], "head": [...], "local": [...], "ia3": [...]}``: a LoRA net's parameter names by
    role (in the net's order); ``local``: the second adapter of a dual net (FedDPA's local adapter, both its A and
    B); ``ia3``: an IA3 net's vectors."""
    parts = {"A": [], "B": [], "head": [], "local": [], "ia3": []}
    for k in names:
        role = ("A" if ".lora_A." in k else "B" if ".lora_B." in k
                else "local" if ".local_A." in k or ".local_B." in k else "ia3" if k.endswith(".ia3_l") else "head")
        parts[role].append(k)
    return parts


def set_mix(net: nn.Module, mix) -> None:
    """The weights ``(global, local)`` of a dual LoRA net's two adapters in every layer (None: the global alone)."""
    for m in net.modules():
        if isinstance(m, LoRALayer):
            m.mix = mix


def set_dropout(net: nn.Module, on: bool) -> None:
    """Switch the LoRA layers' dropout on (local training) or off (everything else)."""
    for m in net.modules():
        if isinstance(m, LoRALayer):
            m.train(on)


def match_targets(base: nn.Module, patterns: str, rank: int | None = None) -> list[str]:
    """The names of ``base``'s linear and convolution layers that ``patterns`` select, its classifier excepted (it
    trains in full): comma-separated module names or fnmatch patterns, each matching a name or its last dotted
    components as peft's ``target_modules`` do (``query,value`` selects every BERT layer's query and value
    projections; ``fc1,conv*``; ``*`` every layer).

    A grouped convolution (depthwise: MobileNet's, EfficientNet's, ShuffleNet's) takes an adapter of ``rank`` only
    when its groups divide the rank, peft's rule (its ``B`` is a grouped 1x1 convolution from r channels): patterns
    leave the others out, and naming one of them is refused."""
    wanted = [p.strip() for p in str(patterns).split(",") if p.strip()]
    if not wanted:
        raise ConfigError(f"lora_targets must name at least one module pattern (e.g. '*' or 'fc1,conv*'); got "
                          f"{patterns!r}.")
    modules = dict(base.named_modules())
    layers = [n for n, m in modules.items() if isinstance(m, TARGETABLE) and n != base.classifier
              and not n.startswith(f"{base.classifier}.")]
    if rank is not None:
        grouped = {n for n in layers if isinstance(modules[n], nn.Conv2d) and int(rank) % modules[n].groups}
        named = sorted(grouped & set(wanted))
        if named:
            raise ConfigError(f"lora_targets names {named[0]!r}, a convolution of {modules[named[0]].groups} groups, "
                              f"which an adapter of rank {rank} cannot adapt (peft's rule: the groups divide the "
                              "rank); give a rank its groups divide, or leave it out.")
        layers = [n for n in layers if n not in grouped]
    # peft's rule for a list of target modules (a name equal to, or ending in ".<pattern>"), with fnmatch globs
    chosen = [n for n in layers if any(fnmatch.fnmatchcase(n, p) or fnmatch.fnmatchcase(n, f"*.{p}") for p in wanted)]
    if not chosen:
        raise ConfigError(f"lora_targets {patterns!r} matches none of the base net's linear or convolution layers "
                          f"before its classifier ({', '.join(layers) or 'none'}); name some of them.")
    return chosen


def match_feedforward(targets: list[str], patterns: str) -> list[str]:
    """The targets (:func:`match_targets`) that ``patterns`` (``ia3_feedforward``, the same rule) name as IA3's
    feed-forward modules, whose input is rescaled (peft's ``feedforward_modules``, a subset of its targets)."""
    wanted = [p.strip() for p in str(patterns).split(",") if p.strip()]
    chosen = [n for n in targets if any(fnmatch.fnmatchcase(n, p) or fnmatch.fnmatchcase(n, f"*.{p}") for p in wanted)]
    if wanted and not chosen:
        raise ConfigError(f"ia3_feedforward {patterns!r} matches none of the adapted layers ({', '.join(targets)}); "
                          "name some of them (a feed-forward module is one of lora_targets).")
    return chosen


def lora_spec(base: dict, net: nn.Module, *, targets: str, rank: int = 8, alpha: float = 8.0, dropout: float = 0.0,
              weights: str = "", dual: bool = False, adapter: str = "lora", feedforward: str = "") -> dict:
    """The JSON-able client spec of a :class:`LoRANet` over the base net ``base`` (a client spec; ``net`` is it
    built, whose layers ``targets`` names): LoRA adapters of ``rank``, ``alpha``, ``dropout``, or (``adapter="ia3"``)
    IA3 vectors, on the layers ``feedforward`` names scaling their input."""
    from pfl_cli.models.pretrained import file_sha256

    probe = base.get("arch") == "backbone" and base.get("tune") == "probe"  # HyperFL-LPM's frozen backbone
    if str(base.get("arch", "")).endswith("-bn") or base.get("arch") == "lora" or (base.get("arch") == "backbone"
                                                                                   and not probe):
        raise InputError(f"LoRA: the frozen base must be a plain client net (mlp, lenet, hyperfl-cnn, hf:DIR); got "
                         f"model_arch {base.get('arch')!r}.")
    # grouped convolutions: LoRA's rank must suit them (peft's rule, match_targets); IA3 scales any one's channels
    chosen = match_targets(net, targets, None if adapter == "ia3" else rank)
    spec = {"kind": "client", "arch": "lora", "base": dict(base), "input_shape": list(base["input_shape"]),
            "num_classes": int(base["num_classes"]), "targets": chosen}
    if adapter == "ia3":
        spec.update(adapter="ia3", feedforward=match_feedforward(chosen, feedforward))
    else:
        spec.update(rank=int(rank), alpha=float(alpha), dropout=float(dropout))
    if dual:  # a local adapter beside the global one in every targeted layer (FedDPA)
        spec["dual"] = True
    if weights:
        path = Path(weights)
        if not path.is_file():
            raise ConfigError(f"lora_base_weights: no such file {path}; give a local state dict of the base net "
                              f"(.pt / .pth / .safetensors).")
        spec["base_weights"], spec["base_sha256"] = str(path), file_sha256(path)
    return spec


def build_lora(spec: dict, build) -> LoRANet:
    """The net of a :func:`lora_spec`: its base built with ``build`` (:func:`pfl_cli.models.build`) and loaded from
    its weights file, then adapted."""
    base = build(spec["base"])
    if spec.get("base_weights"):
        load_base_weights(base, Path(spec["base_weights"]), spec.get("base_sha256"))
    if spec.get("adapter") == "ia3":
        return LoRANet(base, spec["targets"], adapter="ia3", feedforward=spec["feedforward"])
    return LoRANet(base, spec["targets"], spec["rank"], spec["alpha"], spec["dropout"], bool(spec.get("dual")))


def load_base_weights(base: nn.Module, path: Path, sha256: str | None) -> None:
    """Copy a state dict of the base net into ``base``, refusing a changed file or a missing / misshapen key."""
    from pfl_cli.models.pretrained import file_sha256, load_backbone_state

    if not path.is_file() or (sha256 is not None and file_sha256(path) != sha256):
        raise InputError(f"lora_base_weights {path}: missing or changed since the model was built (sha256 differs); "
                         "give the same file.")
    state = load_backbone_state(path, "lora_base_weights")
    state = {k.removeprefix("client."): v for k, v in state.items()}
    expected = base.state_dict()
    for key, tensor in expected.items():
        if key not in state or tuple(state[key].shape) != tuple(tensor.shape):
            got = "missing" if key not in state else f"of shape {tuple(state[key].shape)}"
            raise InputError(f"lora_base_weights {path}: key {key!r} is {got}; the base net needs {len(expected)} "
                             f"tensors ({key}: {tuple(tensor.shape)}).")
    with torch.no_grad():
        for key, tensor in expected.items():
            tensor.copy_(state[key].to(tensor.dtype))
