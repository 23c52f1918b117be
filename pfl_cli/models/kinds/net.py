"""What every model kind shares: the wrapper that gives algorithms a head and features, the declared rules.

Rules (DESIGN.md §9), the same for every kind:

- **head**: the net's last ``nn.Linear`` (in module registration order), or the module ``model_head`` names;
  it must be an ``nn.Linear`` whose output is the net's output (checked on a forward pass). FedRep, FedPer,
  FedBABU, LG-FedAvg, FedRoD, GPFL, ... split the net there (:mod:`pfl_cli.fl.split`); ``features()`` is the
  head's input.
- **normalization layers**: every ``BatchNorm``, ``GroupNorm``, ``LayerNorm`` and ``InstanceNorm`` module
  (recorded in the spec as ``norm``).
- **train / eval behaviour**: the wrapped module stays in eval mode in every stage. A cohort runs its clients
  through one ``torch.func.functional_call`` (vmapped, or client by client), which cannot carry each client's
  BatchNorm running statistics nor draw each client's own dropout masks; so BatchNorm normalizes with the
  statistics the net holds (a weights file's, or mean 0 and variance 1 at random init), never updated, and
  dropout (and timm's stochastic depth) is off. The cohort path and a per-client loop then compute the same
  thing, and a client's predictions do not depend on which samples share its batch.
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Sequence

import torch
from torch import nn

from pfl_cli.errors import InputError

NORM_TYPES = (nn.modules.batchnorm._BatchNorm, nn.GroupNorm, nn.LayerNorm, nn.modules.instancenorm._InstanceNorm)
PREFIX = "model."


def file_sha256(path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def check_file(what: str, path: str, sha256: str, arch: str) -> None:
    """Refuse (one line) a file a spec records that is gone or whose content changed since it was recorded."""
    p = Path(path)
    if not p.is_file():
        raise InputError(f"{what} {p}: missing; model_arch {arch!r} is rebuilt from it (recorded with sha256 "
                         f"{sha256[:12]}). Put the same file back at that path.")
    if file_sha256(p) != sha256:
        raise InputError(f"{what} {p}: changed since the model was built (sha256 {file_sha256(p)[:12]}, recorded "
                         f"{sha256[:12]}); model_arch {arch!r} is rebuilt from it. Restore the same file.")


def find_head(model: nn.Module, override: str, arch: str) -> str:
    """The head's module name: ``override`` when given (it must be an ``nn.Linear``), else the last ``nn.Linear``."""
    modules = dict(model.named_modules())
    if override:
        if override not in modules:
            linears = [n for n, m in modules.items() if isinstance(m, nn.Linear)]
            raise InputError(f"model_head must name an nn.Linear module of {arch}; got {override!r}, which it does "
                             f"not have (its nn.Linear modules: {', '.join(linears) or 'none'}).")
        if not isinstance(modules[override], nn.Linear):
            raise InputError(f"model_head must name an nn.Linear module of {arch} (the head the algorithms split "
                             f"off); got {override!r}, a {type(modules[override]).__name__}.")
        return override
    linears = [n for n, m in modules.items() if isinstance(m, nn.Linear) and n]
    if not linears:
        raise InputError(f"model_arch {arch!r}: the head is the net's last nn.Linear, and this net has none (e.g. a "
                         "convolutional classifier); give it a linear classifier, or name one with --set model_head=.")
    return linears[-1]


class KindNet(nn.Module):
    """A model kind's ``nn.Module`` under ``model.``, with the head and normalization layers the rules found.

    ``classifier`` (the head's parameter prefix), ``head()`` and ``features()`` are what pflx's algorithms
    read of a client net (:mod:`pfl_cli.fl.split`, :mod:`pfl_cli.fl.heads`). ``features(x)`` runs the net
    with the head swapped for the identity, so it is the head's input whatever the net's forward does.
    """

    def __init__(self, model: nn.Module, arch: str, head: str = "") -> None:
        super().__init__()
        self.model = model
        self.arch = arch
        self.head_name = find_head(model, head, arch)
        self.classifier = PREFIX + self.head_name
        self.norm_layers = [PREFIX + n for n, m in model.named_modules() if isinstance(m, NORM_TYPES)]
        self.model.eval()

    def train(self, mode: bool = True):
        super().train(mode)
        self.model.eval()  # the module docstring: running statistics fixed, dropout off, in every stage
        return self

    def forward(self, x):
        return self.model(x)

    def head(self) -> nn.Module:
        return self.model.get_submodule(self.head_name)

    def features(self, x):
        parent, _, leaf = self.head_name.rpartition(".")
        owner = self.model.get_submodule(parent) if parent else self.model
        real = owner._modules[leaf]
        owner._modules[leaf] = nn.Identity()
        try:
            return self.model(x)
        finally:
            owner._modules[leaf] = real

    def check_output(self, input_shape: Sequence[int], num_classes: int) -> None:
        """Refuse a net whose output on (2, *input_shape) is not (2, num_classes) logits equal to head(features)."""
        x = torch.randn(2, *input_shape, generator=torch.Generator().manual_seed(0))
        try:
            with torch.no_grad():
                out = self(x)
        except Exception as err:  # a user's module: any error of its forward on this data's shape
            raise InputError(f"model_arch {self.arch!r} fails on this data's inputs of shape {tuple(input_shape)} "
                             f"({type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''}); give "
                             "--set model_kwargs= that fit them (e.g. in_chans, img_size).") from None
        if not isinstance(out, torch.Tensor) or tuple(out.shape) != (2, num_classes):
            got = tuple(out.shape) if isinstance(out, torch.Tensor) else type(out).__name__
            raise InputError(f"model_arch {self.arch!r} must map a batch of inputs {tuple(input_shape)} to logits "
                             f"(batch, {num_classes}); got {got}.")
        try:
            with torch.no_grad():
                split = self.head()(self.features(x))
        except Exception:  # the net's layers after the head read its output: it is not the last layer
            split = None
        if split is None or split.shape != out.shape or not torch.allclose(out, split, atol=1e-5, rtol=1e-4):
            raise InputError(f"model_arch {self.arch!r}: its head {self.head_name!r} (the last nn.Linear, or "
                             "model_head) does not give the net's output from its input; name the module that does "
                             "with --set model_head=NAME.")


def load_state(path: Path) -> dict[str, torch.Tensor]:
    """The tensors of a ``.safetensors`` file or a torch state dict (read with ``weights_only=True``)."""
    if path.suffix == ".safetensors":
        try:
            from safetensors.torch import load_file
        except ImportError:
            raise InputError(f"model_weights {path}: reading .safetensors needs the safetensors package: "
                             "pip install 'pflx[models]'.") from None
        try:
            return load_file(str(path))
        except Exception as err:  # safetensors' own error type for a corrupt header
            raise InputError(f"model_weights {path}: not a readable safetensors file ({err}).") from None
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as err:  # pickle / zip errors of a file that is not a torch state dict
        raise InputError(f"model_weights {path}: not a readable torch state dict ({type(err).__name__}).") from None
    from pfl_cli.models.trained import is_model_payload, payload_state

    if is_model_payload(state):  # a pflx train artifact's model.pt: the one client net it holds
        state, spec = payload_state(state, f"model_weights {path}")
        if ":" in str(spec.get("arch", "")):  # trained as a model kind's net: its keys sit under KindNet's prefix
            state = {k.removeprefix(PREFIX): v for k, v in state.items()}
        return state
    for key in ("state_dict", "model"):
        if isinstance(state, dict) and isinstance(state.get(key), dict):
            state = state[key]
    if not isinstance(state, dict) or not all(isinstance(v, torch.Tensor) for v in state.values()):
        raise InputError(f"model_weights {path}: must hold a state dict (name -> tensor); got {type(state).__name__}.")
    return state


def load_weights(net: KindNet, path: Path) -> None:
    """Copy a state dict in the wrapped module's own key layout into it, by key.

    Every key must be there with its shape, except the head's: a head of another width (ImageNet's 1,000
    classes) or no head is skipped, and the head keeps its seeded random init. An unexpected key is refused.
    """
    state = load_state(path)
    expected = net.model.state_dict()
    head = net.head_name + "."
    for key, tensor in expected.items():
        mismatch = key not in state or tuple(state[key].shape) != tuple(tensor.shape)
        if mismatch and not key.startswith(head):
            got = "is missing" if key not in state else f"has shape {tuple(state[key].shape)}"
            raise InputError(f"model_weights {path}: key {key!r} {got}; {net.arch} expects {tuple(tensor.shape)} "
                             f"({len(expected)} tensors in its own layout).")
    extra = [k for k in state if k not in expected]
    if extra:
        raise InputError(f"model_weights {path}: unexpected key {extra[0]!r}; not a state dict of {net.arch}.")
    with torch.no_grad():
        for key, tensor in expected.items():
            if key in state and tuple(state[key].shape) == tuple(tensor.shape):
                tensor.copy_(state[key].to(tensor.dtype))
