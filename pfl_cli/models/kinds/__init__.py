"""Model kinds (DESIGN.md §9): where a client net comes from, one module per kind.

``model_arch`` names a built-in net (``lenet``, ``pfllib-cnn``, ...; :mod:`pfl_cli.models.client`) or
``KIND:NAME`` for a net from elsewhere:

- ``factory:MODULE:CALLABLE`` (:mod:`.factory`): a user's Python callable that returns an ``nn.Module``
  (``MODULE`` a dotted module on the Python path, or a ``.py`` file);
- ``torchvision:NAME`` (:mod:`.torchvision`): ``torchvision.models.get_model(NAME, weights=None, ...)``;
- ``timm:NAME`` (:mod:`.timm`): ``timm.create_model(NAME, pretrained=False, ...)``.

A kind module declares ``EXTRA`` (the pip extra it needs), ``make(name, input_shape, num_classes, kwargs)``
(a fresh module, random init; nothing is downloaded) and ``source(name)`` (a file whose sha256 the spec
records, or None). What every kind shares lives here and in :mod:`.net`: the spec (``model_kwargs``, the
head module, the normalization layers, ``model_weights`` with its sha256, all recorded so that ``predict``
and ``--resume`` rebuild the same net and refuse a missing or changed file), the declared rules that find
the head (the last ``nn.Linear``, or ``model_head``) and the normalization layers, and the wrapper
:class:`~pfl_cli.models.kinds.net.KindNet` that gives every algorithm ``features()`` / ``head()``.
"""

from __future__ import annotations

import importlib
from pathlib import Path
from typing import Sequence

from pfl_cli.errors import InputError
from pfl_cli.fl.config import MODEL_KINDS, model_kind


def kind_module(kind: str):
    """The module of model kind ``kind`` (:data:`pfl_cli.fl.config.MODEL_KINDS`)."""
    return importlib.import_module(MODEL_KINDS[kind])


def kind_spec(arch: str, input_shape: Sequence[int], num_classes: int, *, kwargs: dict | None = None,
              weights: str = "", head: str = "") -> dict:
    """The JSON-able client spec of ``arch`` (``KIND:NAME``), checked by building the net once.

    The spec records the head and normalization layers the rules found, the sha256 of the weights file and
    of the kind's source file (a factory's module), so :func:`build_kind` rebuilds exactly this net.
    """
    from pfl_cli.models.kinds.net import file_sha256

    kind = model_kind(arch)
    if kind is None:
        raise InputError(f"model_arch {arch!r} names no model kind; use KIND:NAME with KIND one of "
                         f"{', '.join(MODEL_KINDS)}.")
    name = arch.split(":", 1)[1]
    spec = {"kind": "client", "arch": arch, "input_shape": [int(s) for s in input_shape],
            "num_classes": int(num_classes), "model_kwargs": dict(kwargs or {})}
    source = kind_module(kind).source(name)
    if source is not None:
        spec["source"], spec["source_sha256"] = str(source), file_sha256(source)
    if weights:
        path = Path(weights)
        if not path.is_file():
            raise InputError(f"model_weights: no such file {path}; give a local state dict (.pth, .pt or "
                             f".safetensors) of {arch}.")
        spec["weights"], spec["weights_sha256"] = str(path.resolve()), file_sha256(path)
    if head:
        spec["head"] = head
    import torch

    with torch.random.fork_rng(devices=[]):  # the check build draws no number of the caller's streams
        net = build_kind(spec, check=True)
    spec["head"] = net.head_name
    spec["norm"] = list(net.norm_layers)
    return spec


def build_kind(spec: dict, *, check: bool = False):
    """The :class:`~pfl_cli.models.kinds.net.KindNet` a :func:`kind_spec` describes, its files checked first.

    ``check``: also run a forward pass of zeros and refuse a net whose output is not (batch, num_classes).
    """
    from pfl_cli.models.kinds.net import KindNet, check_file, load_weights

    arch = spec["arch"]
    kind, name = model_kind(arch), arch.split(":", 1)[1]
    if kind is None:
        raise InputError(f"model_arch {arch!r}: unknown model kind; known: {', '.join(MODEL_KINDS)}.")
    if spec.get("source"):
        check_file("the factory module", spec["source"], spec["source_sha256"], arch)
    if spec.get("weights"):
        check_file("model_weights", spec["weights"], spec["weights_sha256"], arch)
    module, _, attr = name.rpartition(":")
    if kind == "factory" and module.endswith(".py") and spec.get("source"):
        name = f"{spec['source']}:{attr}"  # the file recorded (checked above), from whatever directory this runs in
    model = kind_module(kind).make(name, tuple(spec["input_shape"]), spec["num_classes"],
                                   dict(spec.get("model_kwargs") or {}))
    net = KindNet(model, arch, head=spec.get("head", ""))
    if spec.get("weights"):
        load_weights(net, Path(spec["weights"]))
    if check:
        net.check_output(tuple(spec["input_shape"]), spec["num_classes"])
    return net


def file_digests(arch: str, weights: str = "") -> list[list[str]]:
    """``[path, sha256]`` of the files a model kind's net is built from, as they are now (the files that are
    there: a missing one is refused by :func:`kind_spec`)."""
    from pfl_cli.models.kinds.net import file_sha256

    name = arch.split(":", 1)[1]
    paths = [kind_module(model_kind(arch)).source(name), Path(weights) if weights else None]
    return [[str(p), file_sha256(p)] for p in paths if p is not None and Path(p).is_file()]
