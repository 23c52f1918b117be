"""Body / head split of a client net: the one rule every algorithm that splits a net uses.

The head is the classifier, the net's last layer, whose parameter prefix the net declares
(``net.classifier``: LeNet's ``fc3``, an MLP's last ``fcN``, HyperFL's CNN's ``fc2``, a
pre-trained backbone net's ``head``), as in FedRep (Collins et al. 2021, §2: "the head is the
final fully-connected layer"), FedPer and LG-FedAvg; the body is everything before it. pFedHN-PC
and HyperFL generate the body (the feature extractor) and keep the head private; PPSGD and
CENTAUR keep the head on the client (HyperFL App. D.1). A net with one layer
(an MLP without hidden layers) has no body, so a split is refused.
"""

from __future__ import annotations

from pfl_cli.errors import InputError


def split_names(net, algorithm: str | None = None) -> tuple[list[str], list[str]]:
    """``(body, head)``: the parameter names of ``net`` in its own order, the head its classifier.

    ``algorithm``: the algorithm that shares one part and keeps the other, named in the refusal
    of a net without a body; None: the hypernetwork algorithms, which generate the body.
    """
    prefix = f"{net.classifier}."
    names = [k for k, _ in net.named_parameters()]
    head = [k for k in names if k.startswith(prefix)]
    body = [k for k in names if not k.startswith(prefix)]
    if body:
        return body, head
    if algorithm is None:
        raise InputError("client net: a feature extractor before the classifier is needed (the hypernetwork "
                         "generates it); got a single linear layer (mlp_hidden=[]); give it hidden layers, "
                         "e.g. --set mlp_hidden=[64,64].")
    raise InputError(f"algorithm {algorithm!r} splits the client net into a body and a head; the mlp without "
                     f"hidden layers (mlp_hidden={list(getattr(net, 'hidden', []))}) has no body. Set mlp_hidden "
                     "to at least one layer (e.g. --set mlp_hidden=[32]).")


def part_floats(spec: dict, part: str, algorithm: str | None = None) -> int:
    """Parameters in the ``part`` ("body" or "head") of the client net ``spec`` describes: what an algorithm
    that shares only that part exchanges, each way, per client and round."""
    from pfl_cli.models import build

    net = build(spec)
    body, head = split_names(net, algorithm)
    names = set(body if part == "body" else head)
    return sum(p.numel() for k, p in net.named_parameters() if k in names)
