"""The ClientApp: pflx's client side on the one client a SuperNode holds.

A SuperNode's node config names its data: ``partition-dir`` (a pflx partition artifact),
``partition-id`` (the client's position in it, as ``ArtifactPartitioner``'s partition ids) and
optionally ``dataset`` (the node's own copy of the dataset, a pflx dataset spec; default the
partition's). The node's store holds only that client's samples (``build_store(held=...)``):
the normalization statistics and the validation split come from the partition as in
``pflx train``, so the client's fit data and inputs are exactly the simulation's.

:func:`hello` (:data:`~.common.HELLO`) reports what the node holds (the server checks it against the
partition); the algorithms' own handlers are in :mod:`.averaging` (FedAvg, FedProx), :mod:`.pefll`
and :mod:`.pfedhn`, which share :func:`local_delta` (local SGD from a model the server generated)
and :func:`evaluate_model` (a model the server generated, evaluated with no step).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from pfl_cli.interop.flower_app.common import train_config


@dataclass
class NodeData:
    """The node's client: its dataset facts, and (when they fit the partition) its store and algorithm."""

    position: int
    facts: dict
    store: object = None
    algorithm: object = None


def load_node(context, *, build: bool = True) -> NodeData:
    """Read the node config, the partition and the dataset; build the one-client store and the algorithm."""
    from pfl_cli.readers import load_partition
    from pfl_cli.data import load_dataset
    from pfl_cli.data.location import locate_dataset
    from pfl_cli.errors import InputError

    cfg = train_config(context.run_config)
    node = context.node_config
    for key in ("partition-dir", "partition-id"):
        if key not in node:
            raise InputError(f"node config: {key} is missing; start the SuperNode with --node-config "
                             "\"partition-dir='PART' partition-id=K\".")
    part, info, artifact = load_partition(str(node["partition-dir"]), flag="node config partition-dir")
    position = int(node["partition-id"])
    # The partition's dataset wherever it now is (recorded path, beside the partition, PFLX_DATA), digest checked.
    ds = (load_dataset(str(node["dataset"])) if "dataset" in node else
          locate_dataset(info, artifact.path, flag="node config partition-dir"))
    facts = {"partition-id": position, "partition-sha256": artifact.content_hash,
             "input-shape": [int(d) for d in ds.x.shape[1:]], "num-classes": int(ds.num_classes),
             "num-samples": int(ds.num_samples), "labels-sha256": str(ds.labels_sha256 or "")}
    data = NodeData(position, facts)
    fits = (facts["input-shape"] == list(info["input_shape"]) and facts["num-classes"] == int(info["num_classes"])
            and facts["num-samples"] == int(info["num_samples"]) and 0 <= position < part.num_clients)
    if build and fits:
        data.store, data.algorithm = _build(cfg, part, ds, position)
        data.facts["fit-size"] = int(data.store.fit.length[position])
        data.facts["labeled"] = bool(data.store.labeled[position])
    return data


def _build(cfg, part, ds, position: int):
    from pfl_cli.fl.api import make_algorithm
    from pfl_cli.fl.device import resolve_device
    from pfl_cli.fl.store import build_store
    from pfl_cli.privacy.randomness import train_randomness

    if part.rotation is not None:  # rotated clients (partition --rotations): rotated as pflx train rotates them
        import dataclasses

        from pfl_cli.partition.rotation import rotate_clients

        ds = dataclasses.replace(ds, x=rotate_clients(ds.x, part))
    held = np.zeros(part.num_clients, dtype=bool)
    held[position] = True
    store = build_store(ds.x, ds.y, ds.num_classes, part, val_fraction=cfg.val_fraction,
                        rng=train_randomness(cfg).numpy("validation-split"), stable_carve=cfg.dp_epsilon is not None,
                        device=resolve_device(cfg.device),
                        normalize=cfg.normalize, labeled=ds.labeled, hidden_labels=cfg.evaluate_hidden_labels,
                        held=held, vocab_size=ds.extra.get("vocab_size"))  # text: token codes, as pflx train
    return store, make_algorithm(cfg, store)


def hello(message, context):
    """Report the node's client and dataset; with a fitting dataset also its normalization statistics."""
    from flwr.app import ConfigRecord, Message, RecordDict

    data = load_node(context)
    content = RecordDict({"facts": ConfigRecord(data.facts)})
    if data.store is not None:
        from pfl_cli.interop.flower_app.wire import to_record

        content["normalization"] = to_record({"mean": data.store.mean, "std": data.store.std})
    return Message(content, reply_to=message)


def test_counts(position: int, ev):
    """A client's test counts (one row of a ``GroupEval``) as the ``MetricRecord`` the server collects."""
    from flwr.app import MetricRecord

    return MetricRecord({"partition-id": position, **{k: float(getattr(ev, k)[0])
                                                     for k in ("n", "correct", "correct_lm", "loss")}})


def local_delta(data: NodeData, theta: dict, batches, label: str, cohort: list):
    """Local SGD of the node's client from ``theta`` (a model the server generated) on its rows of the
    cohort's ``batches``: a ``RecordDict`` with delta theta = theta~ - theta and the mean loss."""
    from flwr.app import MetricRecord, RecordDict

    from pfl_cli.algorithms.base import stack
    from pfl_cli.fl.cohort import local_sgd_held
    from pfl_cli.interop.flower_app.wire import to_record

    alg = data.algorithm
    rows, new, loss = local_sgd_held(alg.net, stack(theta, len(cohort)), data.store, batches, **alg.sgd_options())
    if int(rows.sum()) != 1:
        raise RuntimeError(f"{label}: this node's client {data.position} is not in the cohort {cohort} it was sent.")
    return RecordDict({"delta": to_record({k: new[k][0] - theta[k] for k in theta}),
                       "result": MetricRecord({"loss": float(loss[0]), "partition-id": data.position})})


def evaluate_model(message, context):
    """A generated model received (PeFLL's Alg. 7 step 6, pFedHN's h(v_i)), evaluated on this client's test
    samples with no optimizer step."""
    from flwr.app import Message, RecordDict

    from pfl_cli.algorithms.base import stack
    from pfl_cli.fl.evaluate import evaluate as evaluate_clients
    from pfl_cli.interop.flower_app.wire import from_record

    data = load_node(context)
    alg = data.algorithm
    theta = stack(from_record(message.content["theta"], alg.device), 1)
    ev = evaluate_clients(alg.net, theta, data.store, np.array([data.position]), "test", personalized=True,
                          cohort_exec=alg.cfg.cohort_exec)
    return Message(RecordDict({"result": test_counts(data.position, ev)}), reply_to=message)
