"""Reader of a train artifact's ``model.pt`` (imports torch: used by predict and attack only)."""

from __future__ import annotations

from typing import Any

from pfl_cli.manifest import MODEL_FORMAT, Artifact
from pfl_cli.readers._rules import is_int, listed, refuse


def _tensors_only(tree: Any) -> bool:
    import torch

    if isinstance(tree, dict):
        return all(isinstance(k, str) and _tensors_only(v) for k, v in tree.items())
    return isinstance(tree, torch.Tensor)


def read_model_payload(art: Artifact, flag: str, *, num_classes: int | None = None) -> dict:
    """The model payload of ``model.pt`` (``pfl_cli.fl.api.model_payload``), checked.

    Rules: loads with ``torch.load(weights_only=True)``; a dict with ``format``
    ``pflx-model-1`` (:data:`pfl_cli.manifest.MODEL_FORMAT`), ``algorithm`` (the manifest
    config's), ``arch`` (an object), ``weights`` (nested objects of tensors), ``normalization`` (``mean`` and ``std`` float
    tensors of one shape, ``std`` > 0) and ``num_classes`` (a one-element integer tensor, >= 1,
    and the ``num_classes`` of metrics.json's dataset when given).
    """
    import torch

    name = "model.pt"
    listed(art, flag, name)
    try:
        payload = torch.load(art.file(name), weights_only=True, map_location="cpu")
    except Exception as err:  # noqa: BLE001 - any unreadable file gets the same advice
        raise refuse(art, flag, name, f"must be a torch file of plain tensors ({type(err).__name__})") from None
    if not isinstance(payload, dict):
        raise refuse(art, flag, name, "must hold a model payload (a dict)", type(payload).__name__)
    if payload.get("format") != MODEL_FORMAT:
        raise refuse(art, flag, name, f"format must be {MODEL_FORMAT!r}", payload.get("format"))
    said = art.config.get("algorithm")
    if not isinstance(payload.get("algorithm"), str) or (isinstance(said, str) and payload["algorithm"] != said):
        raise refuse(art, flag, name, f"algorithm must be the manifest config's ({said!r})", payload.get("algorithm"))
    if not isinstance(payload.get("arch"), dict):
        raise refuse(art, flag, name, "arch must be an object", type(payload.get("arch")).__name__)
    if not isinstance(payload.get("weights"), dict) or not _tensors_only(payload["weights"]):
        raise refuse(art, flag, name, "weights must be nested objects of tensors")
    norm = payload.get("normalization")
    ok = isinstance(norm, dict) and all(isinstance(norm.get(k), torch.Tensor) and norm[k].is_floating_point()
                                        for k in ("mean", "std"))
    if not ok or norm["mean"].shape != norm["std"].shape or not bool(torch.isfinite(norm["mean"]).all()) \
            or not bool((norm["std"] > 0).all()):
        raise refuse(art, flag, name, "normalization must hold finite float tensors mean and std (> 0) of one shape")
    classes = payload.get("num_classes")
    if not (isinstance(classes, torch.Tensor) and classes.numel() == 1 and not classes.is_floating_point()
            and classes.dtype != torch.bool
            and int(classes) >= 1):
        raise refuse(art, flag, name, "num_classes must be a one-element integer tensor >= 1", classes)
    if num_classes is not None and is_int(num_classes) and int(classes) != num_classes:
        raise refuse(art, flag, name, f"num_classes must be metrics.json's {num_classes}", int(classes))
    from pfl_cli.readers.files import with_located_files

    payload["arch"] = with_located_files(art, payload["arch"])  # a backbone's weights file, wherever it now is
    return payload


# What restoring a state dict raises when the tree does not fit the model: a missing key, a tensor of
# another shape (RuntimeError from load_state_dict), a value that is not a tensor.
LOAD_ERRORS = (KeyError, RuntimeError, TypeError, ValueError, AttributeError, IndexError)


def weights_mismatch(tree: Any, like: dict, path: str = "") -> str | None:
    """The first way ``tree`` differs from the weights tree ``like`` in names or tensor shapes (None: none).

    Per-client rows (``private``, a :class:`pfl_cli.fl.client_state.ClientState`) are skipped: their
    leading axis is the clients of the partition they were trained on, checked when they load.
    """
    if not isinstance(tree, dict):
        return f"{path or 'the tree'} must be an object"
    for key, ref in like.items():
        if key == "private":
            continue
        if key not in tree:
            return f"{path}{key} is missing"
        got = tree[key]
        if isinstance(ref, dict):
            found = weights_mismatch(got, ref, f"{path}{key}.")
            if found:
                return found
        elif not hasattr(got, "shape") or tuple(got.shape) != tuple(ref.shape):
            return f"{path}{key} must have shape {tuple(ref.shape)}; got {tuple(getattr(got, 'shape', ())) or got!r:.40}"
    return None


def restore(load, tree: Any, what: str, *, fix: str, like: dict | None = None) -> None:
    """``load(tree)``, or ArtifactError (exit 2) when ``tree`` does not fit the model that ``what`` describes.

    The readers check a payload's structure; only the algorithm knows its tensors' names and
    shapes: ``like`` (the algorithm's own weights) gives them, and the load itself is the last check.
    """
    from pfl_cli.errors import ArtifactError

    def refused(detail: str) -> ArtifactError:
        return ArtifactError(f"{what} does not fit the model it describes ({detail}). {fix}")

    mismatch = weights_mismatch(tree, like) if like is not None else None
    if mismatch:
        raise refused(mismatch)
    try:
        load(tree)
    except LOAD_ERRORS as err:
        detail = str(err).splitlines()[0][:120] if str(err) else ""
        raise refused(f"{type(err).__name__}: {detail}".rstrip(": ")) from None
