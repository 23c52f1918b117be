"""Body / head split of a client net (FedRep, FedPer, LG-FedAvg).

The head is the last linear layer (the classifier), as in FedRep (Collins et al. 2021,
§2: "the head is the final fully-connected layer") and FedPer; the body is everything
before it. LeNet's head is ``fc3``; an MLP's is its last ``fcN``. A net with one layer
(an MLP without hidden layers) has no body to share, so a split is refused.
"""

from __future__ import annotations

from pfl_cli.errors import InputError


def head_names(arch: dict, algorithm: str) -> tuple[str, ...]:
    """The parameter names of the head of the client net ``arch`` (a client spec)."""
    if arch["arch"] == "lenet":
        return ("fc3.weight", "fc3.bias")
    layers = len(arch.get("hidden", [])) + 1
    if layers < 2:
        raise InputError(f"algorithm {algorithm!r} splits the client net into a body and a head; the mlp without "
                         f"hidden layers (mlp_hidden={arch.get('hidden')}) has no body. Set mlp_hidden to at "
                         "least one layer (e.g. --set mlp_hidden=[32]).")
    return (f"fc{layers}.weight", f"fc{layers}.bias")


def split_names(net, arch: dict, algorithm: str) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """(body, head) parameter names of ``net`` in its own order."""
    head = set(head_names(arch, algorithm))
    names = [k for k, _ in net.named_parameters()]
    return tuple(k for k in names if k not in head), tuple(k for k in names if k in head)
