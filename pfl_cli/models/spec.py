"""JSON-able architecture specs: rebuild a trained network from ``model.pt`` without pickling.

A spec is a plain dict of JSON types (str, int, list, dict) that names the network and every
constructor argument, with ``"auto"`` already resolved. ``model.pt`` stores state dicts; the
spec (in the artifact's JSON) says which modules to build before ``load_state_dict``::

    {"kind": "client", "arch": "lenet", "input_shape": [3, 32, 32], "num_classes": 10, "hidden": [32]}
    {"kind": "embedding", "arch": "cnn", "input_shape": [3, 32, 32], "num_classes": 10,
     "dim": 26, "hidden": 64}
    {"kind": "hypernetwork", "in_dim": 26, "target": {<client spec>}, "size": "M", "hidden": 100}
    {"kind": "client", "arch": "lstm", "input_shape": [80], "num_classes": 80, "hidden": [256, 256], "vocab": 80}
    {"kind": "client", "arch": "torchvision:resnet18", "input_shape": [3, 32, 32], "num_classes": 10,
     "model_kwargs": {}, "head": "fc", "norm": ["model.bn1", ...], "weights": "/abs/r18.pth", "weights_sha256": "..."}

The last is a model kind's net (:mod:`pfl_cli.models.kinds`): ``factory:``, ``torchvision:`` or ``timm:``,
rebuilt from the files whose sha256 it records (refused when one is missing or changed).

:func:`build` turns any of them into a fresh (randomly initialized) module with the same
parameter names and shapes as the one that was trained.
"""

from __future__ import annotations

from math import prod
from typing import Any, Sequence

from torch import nn

from pfl_cli.errors import InputError, check_param
from pfl_cli.models.client import check_hidden, check_input_shape, check_int, client_model, resolve_arch
from pfl_cli.models.embedding import embedding_net, resolve_embedding
from pfl_cli.models.hypernetwork import HyperNetwork, hyper_layers
from pfl_cli.models.sequence import LEAF_HIDDEN
from pfl_cli.models.util import count_parameters

SPEC_KINDS = ("client", "embedding", "hypernetwork", "table")


def client_spec(
    arch: str, input_shape: Sequence[int], num_classes: int, hidden: Sequence[int] = (32,), kernels: int = 16,
    *, vocab: int | None = None, lstm_hidden: int = 256,
) -> dict:
    """Spec of :func:`~pfl_cli.models.client.client_model` with ``arch`` resolved.

    ``hidden`` (the MLP widths) is recorded for every arch but the LSTM; LeNet ignores it.
    ``vocab`` (the number of token codes) marks text data, whose net is LEAF's LSTM: its spec
    records ``vocab`` and ``hidden`` = two layers of ``lstm_hidden`` (LEAF's 256).

    Examples
    --------
    >>> client_spec("auto", (64,), 10)
    {'kind': 'client', 'arch': 'mlp', 'input_shape': [64], 'num_classes': 10, 'hidden': [32]}
    >>> client_spec("auto", (80,), 80, vocab=80)["hidden"]
    [256, 256]
    """
    resolved = resolve_arch(arch, input_shape, vocab)
    if resolved == "lstm":
        hidden = (check_int("lstm_hidden", lstm_hidden, 1),) * len(LEAF_HIDDEN)
    spec = {
        "kind": "client",
        "arch": resolved,
        "input_shape": list(check_input_shape(input_shape)),
        "num_classes": check_int("num_classes", num_classes, 2),
        "hidden": list(check_hidden("mlp_hidden", hidden)),
    }
    if resolved == "lstm":
        spec["vocab"] = check_int("vocab_size", vocab, 2)
    if check_int("kernels", kernels, 1) != 16:  # pFedHN's S / L LeNets (the default M is Table B.1)
        spec["kernels"] = kernels
    return spec


def embedding_spec(
    kind: str, input_shape: Sequence[int], num_classes: int, dim: int, hidden: int = 64,
    *, vocab: int | None = None, lstm_hidden: int = 256,
) -> dict:
    """Spec of :func:`~pfl_cli.models.embedding.embedding_net` with ``kind`` resolved.

    For text (``vocab`` given) the LSTM kinds record ``vocab`` and ``hidden`` = the client
    LSTM's layers (two of ``lstm_hidden``): "the same LSTM" (PeFLL thesis App. B.1.3).

    Examples
    --------
    >>> embedding_spec("auto", (3, 32, 32), 10, 26)["arch"]
    'cnn'
    """
    resolved = resolve_embedding(kind, input_shape, vocab)
    spec = {
        "kind": "embedding",
        "arch": resolved,
        "input_shape": list(check_input_shape(input_shape)),
        "num_classes": check_int("num_classes", num_classes, 2),
        "dim": check_int("embed_dim", dim, 1),
        "hidden": check_int("embed_hidden", hidden, 1),
    }
    if resolved in ("lstm", "lstm-x"):
        spec["hidden"] = [check_int("lstm_hidden", lstm_hidden, 1)] * len(LEAF_HIDDEN)
        spec["vocab"] = check_int("vocab_size", vocab, 2)
    elif vocab is not None:  # linear: reads the label only
        spec["vocab"] = check_int("vocab_size", vocab, 2)
    return spec


def hyper_spec(in_dim: int, target_spec: dict, size: str = "M", hidden: int = 100, *,
               n_hidden: int | None = None, relu_out: bool = False, generate: list[str] | None = None,
               targets: dict[str, dict] | None = None) -> dict:
    """Spec of :func:`~pfl_cli.models.hypernetwork.hypernetwork` for the network ``target_spec``.

    The optional keys (``n_hidden``, ``relu_out``, ``generate``, ``targets``) are written only when
    set, so PeFLL's specs are unchanged. ``targets`` (name -> client spec) makes one hypernetwork
    generate several target nets at once, tensors named ``<name>/<parameter>`` (pFedHN's mixed model
    sizes, §5.2: "size equal to the sum of the weights of the three sized networks combined").
    """
    hyper_layers(size)
    target_kind = _kind(target_spec)
    check_param("target_spec kind", target_kind != "hypernetwork", "must not be a hypernetwork", target_kind)
    spec = {
        "kind": "hypernetwork",
        "in_dim": check_int("embed_dim", in_dim, 1),
        "target": dict(target_spec),
        "size": size,
        "hidden": check_int("hyper_hidden", hidden, 1),
    }
    if n_hidden is not None:
        spec["n_hidden"] = check_int("n_hidden", n_hidden, 0)
    if relu_out:
        spec["relu_out"] = True
    if generate is not None:
        spec["generate"] = list(generate)
    if targets is not None:
        spec["targets"] = {k: dict(v) for k, v in targets.items()}
    return spec


def _generated_shapes(spec: dict) -> dict[str, tuple[int, ...]]:
    """Name -> shape of every tensor a hypernetwork spec generates."""
    generate = spec.get("generate")
    targets = spec.get("targets") or {"": _field(spec, "target")}
    shapes = {}
    for prefix, target in targets.items():
        for k, p in build(target).named_parameters():
            if generate is None or k in generate:
                shapes[f"{prefix}/{k}" if prefix else k] = tuple(p.shape)
    return shapes


def table_spec(rows: int, dim: int) -> dict:
    """Spec of a trainable embedding table ``nn.Embedding(rows, dim)`` (pFedHN's client embeddings v_i)."""
    return {"kind": "table", "rows": check_int("rows", rows, 1), "dim": check_int("embed_dim", dim, 1)}


def _kind(spec: Any) -> str:
    check_param("spec", isinstance(spec, dict), "must be a dict", type(spec).__name__)
    kind = spec.get("kind")
    check_param("spec kind", kind in SPEC_KINDS, f"must be one of {', '.join(SPEC_KINDS)}", kind)
    return kind


def _field(spec: dict, key: str) -> Any:
    if key not in spec:
        raise InputError(f"{spec['kind']} spec needs the key {key!r}; got keys {sorted(spec)}.")
    return spec[key]


def build(spec: dict) -> nn.Module:
    """A fresh module (default initialization) described by a spec dict.

    Dispatches on ``spec["kind"]``: ``"client"``, ``"embedding"`` or ``"hypernetwork"`` (which
    builds its target from ``spec["target"]`` to get the generated shapes).

    Raises
    ------
    InputError
        For an unknown kind, a missing key or an invalid value.
    """
    kind = _kind(spec)
    if kind == "client" and spec.get("arch") == "backbone":  # HyperFL-LPM: a pre-trained backbone
        from pfl_cli.models.pretrained import build_pretrained

        return build_pretrained(spec)
    if kind == "client" and spec.get("arch") == "hf":  # a transformers checkpoint on disk (model_arch hf:DIR)
        from pfl_cli.models.hf_checkpoint import build_hf

        return build_hf(spec)
    if kind == "client" and spec.get("arch") == "lora":  # LoRA adapters on a frozen base net (the LoRA algorithms)
        from pfl_cli.models.lora import build_lora

        return build_lora(spec, build)
    if kind == "client" and ":" in str(spec.get("arch", "")):  # a model kind's net (pfl_cli.models.kinds)
        from pfl_cli.models.kinds import build_kind

        return build_kind(spec)
    if kind == "client":
        return client_model(
            _field(spec, "arch"),
            tuple(_field(spec, "input_shape")),
            _field(spec, "num_classes"),
            hidden=tuple(spec.get("hidden", (32,))),
            kernels=spec.get("kernels", 16),
            vocab=spec.get("vocab"),
        )
    if kind == "embedding":
        return embedding_net(
            _field(spec, "arch"),
            tuple(_field(spec, "input_shape")),
            _field(spec, "num_classes"),
            _field(spec, "dim"),
            hidden=spec.get("hidden", 64),
            vocab=spec.get("vocab"),
        )
    if kind == "table":
        return nn.Embedding(_field(spec, "rows"), _field(spec, "dim"))  # N(0, 1) init, as pFedHN's code
    n_hidden = spec["n_hidden"] if "n_hidden" in spec else hyper_layers(_field(spec, "size"))
    return HyperNetwork(_field(spec, "in_dim"), _generated_shapes(spec), hidden=spec.get("hidden", 100),
                        n_hidden=n_hidden, relu_out=bool(spec.get("relu_out", False)))


def num_parameters(spec: dict) -> int:
    """Parameter count of ``build(spec)``; for a hypernetwork without building its ~100x D heads."""
    if _kind(spec) != "hypernetwork":
        return count_parameters(build(spec))
    d = sum(prod(shape) for shape in _generated_shapes(spec).values())
    h = check_int("hyper_hidden", spec.get("hidden", 100), 1)
    dim = check_int("embed_dim", _field(spec, "in_dim"), 1)
    n_hidden = spec["n_hidden"] if "n_hidden" in spec else hyper_layers(_field(spec, "size"))
    return h * dim + h + n_hidden * (h * h + h) + (h + 1) * d  # §2.3: 100 l + 100 + 10,100 n + 101 D


def describe(spec: dict) -> str:
    """One line naming the network of ``spec`` and its parameter count.

    Examples
    --------
    >>> describe(client_spec("lenet", (3, 32, 32), 10))
    'client lenet, input (3, 32, 32), 10 classes: 121,182 parameters'
    >>> describe(embedding_spec("linear", (64,), 10, 26))
    'embedding linear, input (64,), 10 classes -> 26: 286 parameters'
    """
    kind = _kind(spec)
    count = f"{num_parameters(spec):,} parameters"
    if kind == "hypernetwork":
        target = describe(spec["target"]).split(":")[0]
        width = spec.get("hidden", 100)
        return f"hypernetwork {spec['size']} (hidden {width}), {spec['in_dim']} -> [{target}]: {count}"
    if kind == "table":
        return f"embedding table, {spec['rows']} x {spec['dim']}: {count}"
    shape = tuple(spec["input_shape"])
    if kind == "client":
        return f"client {spec['arch']}, input {shape}, {spec['num_classes']} classes: {count}"
    return f"embedding {spec['arch']}, input {shape}, {spec['num_classes']} classes -> {spec['dim']}: {count}"

