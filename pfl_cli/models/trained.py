"""A pflx train artifact's ``model.pt`` as a pre-trained checkpoint (recipes/pretrain-then-personalize).

``pflx train`` writes ``model.pt`` as a payload of plain dicts and tensors (``format``, ``algorithm``, ``arch``,
``weights``, ...; :func:`pfl_cli.fl.api.model_payload`). When the algorithm trained one client net (``centralized``,
``fedavg``, ``fedprox``, ...), ``weights`` is ``{"client": state dict}``: that net's weights in its own key layout.
``model_weights`` (a model kind's net) and ``lora_base_weights`` (the base the LoRA algorithms adapt) read such a
file as the state dict it holds, so a backbone pre-trained by ``pflx train`` on public data starts the federated
runs on private clients with no conversion step. A payload of per-client models (a personalized algorithm's) is
refused in one line: it holds no single net.
"""

from __future__ import annotations

PAYLOAD_KEYS = frozenset({"format", "algorithm", "arch", "weights"})


def is_model_payload(obj) -> bool:
    """Whether ``obj`` (a ``torch.load`` result) is a pflx ``model.pt`` payload rather than a state dict."""
    return isinstance(obj, dict) and PAYLOAD_KEYS <= set(obj) and isinstance(obj.get("weights"), dict)


def payload_state(obj: dict, where: str) -> tuple[dict, dict]:
    """``(state dict, client spec)`` of the one client net a pflx ``model.pt`` payload holds.

    ``where`` opens the error message (``model_weights PATH``). Raises InputError when the payload holds anything
    but one client net's tensors (a personalized algorithm's per-client models, a hypernetwork, adapters).
    """
    from pfl_cli.errors import InputError

    weights, arch = obj["weights"], obj.get("arch") or {}
    algorithm = obj.get("algorithm", "?")
    state = weights.get("client")
    spec = arch.get("client") if isinstance(arch, dict) else None
    plain = isinstance(state, dict) and state and all(hasattr(v, "shape") for v in state.values())
    if set(weights) != {"client"} or not plain or not isinstance(spec, dict):
        raise InputError(f"{where}: a pflx model.pt of {algorithm} holds no single client net (its weights: "
                         f"{', '.join(sorted(map(str, weights)))}); give the model.pt of a run that trains one model "
                         "(--algorithm centralized, fedavg, fedprox, ...).")
    if spec.get("arch") in ("lora", "backbone"):
        raise InputError(f"{where}: the model.pt of {algorithm} holds a {spec['arch']} net (a frozen base with "
                         "adapters), not a plain client net; pre-train the base with --algorithm centralized or fedavg.")
    return dict(state), spec
