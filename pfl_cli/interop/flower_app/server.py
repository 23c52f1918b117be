"""The ServerApp: pflx's server side on Flower's deployment engine, writing a normal ``train`` artifact.

One run, in order:

1. **Nodes.** Wait (``connect-timeout`` s) until a SuperNode for every client of the partition is
   connected, then ask each what it holds (:data:`~.common.HELLO`). A node is refused, with one
   log line naming the difference, when its dataset is not the partition's (input shape, classes,
   size, labels), its partition is another, or its partition id is unknown or already taken.
   Clients without an accepted node never enter a cohort.
2. **Rounds** (thesis Alg. 3): the cohort is drawn exactly as ``pflx train`` draws it (same
   generator, same sampler), each cohort client's node gets the global model and the round's
   generator state (so its batch draws are the simulation's) and sends back its model; the
   server takes the data-size-weighted mean and its server step (:meth:`FedAvg.server_step`).
3. **Evaluation** of the last round's model on every accepted client's test samples. Nodes that
   connected during training, for clients without a node, are handshaken first and join it: each
   gets its model in one exchange (PeFLL: Alg. 7, no optimizer step).
4. **Artifact** (written by ``pfl_cli.cli.flower.write_deployment``, the ServerApp's writer): ``model.pt``, ``config.yaml``, ``metrics.csv``, ``metrics.json`` (with
   ``communication``, the ledger, and ``wire``, the bytes measured on the wire), ``clients.csv``
   and ``participation.csv`` (round, client, node, status), written atomically at the end.

Fault rule (documented in docs/tutorials/deploy-flower.md): a round completes with the cohort
clients that replied within ``round-timeout`` seconds; those that did not (a node killed, a
failed ClientApp) are dropped from that round and recorded; a round with fewer than
``min-clients`` replies fails the run, and nothing is written.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from logging import INFO, WARNING
from pathlib import Path

import numpy as np

from pfl_cli.errors import RunError
from pfl_cli.interop.flower_app.common import HELLO, train_config


def log(level: int, text: str) -> None:
    from flwr.common.logger import log as flwr_log

    flwr_log(level, "pflx: %s", text)


@dataclass
class ServerStore:
    """What the server side of an algorithm reads of a ``ClientStore``: public facts, no samples.

    Sizes and labeled flags come from the nodes' handshake, the normalization statistics from
    the nodes (each computes the partition's, as ``build_store`` does), shapes from ``dataset.json``.
    """

    device: object
    num_clients: int
    input_shape: tuple
    num_classes: int
    role: np.ndarray
    labeled: np.ndarray
    fit: object  # fl.store.Padded: the nodes' fit sizes, every index NOT_HERE (the server draws batches, reads none)
    mean: object
    std: object
    partition_sha: bytes  # fl.client_state.partition_digest, as build_store computes it
    vocab_size: int | None = None  # text data (dataset.json's vocab_size): the LSTM client net, as build_store's

    def clients(self, role: int) -> np.ndarray:
        return np.flatnonzero(self.role == role)


@dataclass
class Deployment:
    """A finished run on Flower: what the writer of the ``train`` artifact needs (``pfl_cli.cli.flower``)."""

    cfg: object
    out: Path
    force: bool
    algorithm: object
    store: ServerStore
    partition: object
    info: dict
    partition_artifact: object
    history: list
    evaluation: object
    participation: list
    meter: object
    accepted: dict


def serve(grid, context) -> Deployment:
    """Steps 1-3 of the module docstring; the ServerApp (``pfl_cli.cli.flower.server_main``) writes step 4."""
    from pfl_cli.artifacts import ArtifactWriter, load_partition
    from pfl_cli.interop.flower_app import check_deployable, round_function, rounds_for

    run_config = context.run_config
    cfg = train_config(run_config)
    check_deployable(cfg)
    out, partition = Path(str(run_config["out"])), Path(str(run_config["partition"]))
    force = bool(run_config.get("force", False))
    ArtifactWriter(out, stage="train", config={}, seed=cfg.seed, force=force)  # --out problems first
    part, info, part_art = load_partition(partition, flag="run config partition")
    connect_timeout = float(run_config.get("connect-timeout", 120))
    private = cfg.dp_epsilon is not None  # --dp: the log names no client, no count and no client range
    nodes = _wait_for_nodes(grid, part.num_clients, connect_timeout, private=private)
    # The handshake waits connect-timeout too: a node's first ClientApp start (torch, the dataset) is its slowest.
    accepted, facts, norm = _handshake(grid, nodes, part, info, part_art, connect_timeout, private=private)
    store = _server_store(cfg, part, info, part_art, facts, norm)
    from pfl_cli.fl.api import make_algorithm

    alg = make_algorithm(cfg, store)
    if cfg.dp_epsilon is not None:
        from pfl_cli.fl.api import plan_dp

        alg.dp = plan_dp(cfg, store)  # calibrated before the first round, from public inputs only
    from pfl_cli.interop.flower_app.wire import WireMeter

    meter = WireMeter()
    rounds = rounds_for(cfg)  # the algorithm's messages: .averaging, .pefll or .pfedhn
    history, participation = run_rounds(grid, alg, cfg, accepted, part, meter, run_config, round_function(cfg))
    accepted = {**accepted, **_join_late(grid, nodes, accepted, part, info, part_art, connect_timeout,
                                         private=private)}
    if alg.dp is not None and not cfg.write_nonprivate:
        # Under --dp an evaluation on the clients' private test data is a diagnostic nobody asked for.
        from pfl_cli.fl.loop import Evaluation

        evaluation = Evaluation(cfg.rounds, {})
    else:
        evaluation = rounds.evaluate(grid, alg, cfg, accepted, part, meter,
                                     float(run_config.get("round-timeout", 120)))
    return Deployment(cfg, out, force, alg, store, part, info, part_art, history, evaluation, participation, meter,
                      accepted)


def _wait_for_nodes(grid, wanted: int, timeout: float, *, private: bool = False) -> list[int]:
    """The SuperNodes connected once there is one per client of the partition, or at ``timeout``. Under
    ``--dp`` the log names no count: the number of clients is private (the ledger's bound is public)."""
    deadline = time.monotonic() + timeout
    while True:
        nodes = sorted(grid.get_node_ids())
        if len(nodes) >= wanted or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    log(INFO, "SuperNodes connected" if private else f"{len(nodes)} SuperNodes connected for the partition's "
                                                      f"{wanted} clients")
    return nodes


def _join_late(grid, known: list[int], accepted: dict, part, info, part_art, timeout: float, *,
               private: bool = False) -> dict:
    """Nodes that connected while the rounds ran, for clients without a node: after the handshake they join
    the final evaluation, which gives each its model in one exchange (PeFLL: Alg. 7, descriptor up,
    generated model down, no optimizer step; FedAvg: the global model). Under ``--dp`` the log names
    neither the clients nor how many joined."""
    new = sorted(set(grid.get_node_ids()) - set(known))
    if not new:
        return {}
    joined, _, _ = _handshake(grid, new, part, info, part_art, timeout, taken=accepted, private=private)
    if joined and private:
        log(INFO, "SuperNodes joined after training: they get the final model")
    elif joined:
        log(INFO, f"{len(joined)} SuperNodes joined after training (clients "
                  f"{sorted(int(part.client_id[c]) for c in joined)}): they get the final model")
    return joined


def _send(grid, messages: list, timeout: float, meter, kind: str) -> list:
    """``send_and_receive`` with the bytes of both directions metered."""
    for m in messages:
        meter.sent(kind, m.content)
    replies = list(grid.send_and_receive(messages, timeout=timeout))
    for r in replies:
        if not r.has_error():
            meter.received(kind, r.content)
    return replies


def _origin(reply, messages) -> int:
    """The node a reply answers for: an error the SuperLink writes for an unavailable node comes from the
    SuperLink, so the node is found through the message it replies to (ids are set when pushed)."""
    sent_to = {m.metadata.message_id: m.metadata.dst_node_id for m in messages if m.metadata.message_id}
    return sent_to.get(reply.metadata.reply_to_message_id, reply.metadata.src_node_id)


def _handshake(grid, nodes: list[int], part, info, part_art, timeout: float, *, taken: dict | None = None,
               private: bool = False):
    """Ask every node what it holds; accept those whose client and dataset are the partition's (and whose
    client is not ``taken`` already: the nodes accepted at the start, when late nodes join).

    ``private`` (``--dp``): a refusal names the node and why, never a client (a partition id), the
    partition's client range or which clients have no node: how many clients there are, and who they
    are, is what the ledger's bound keeps private."""
    from flwr.app import Message, RecordDict

    from pfl_cli.interop.flower_app.wire import WireMeter, from_record

    messages = [Message(RecordDict(), dst_node_id=n, message_type=HELLO) for n in nodes]
    replies = _send(grid, messages, timeout, WireMeter(), "hello")
    accepted: dict[int, int] = {}      # client position -> node id
    taken = dict(taken or {})
    facts: dict[int, dict] = {}
    norm = None
    expected = {"partition-sha256": part_art.content_hash, "input-shape": list(info["input_shape"]),
                "num-classes": int(info["num_classes"]), "num-samples": int(info["num_samples"]),
                "labels-sha256": str(info.get("labels_sha256") or "")}
    for reply in replies:
        node = _origin(reply, messages)
        if reply.has_error():
            log(WARNING, f"node {node} refused: its ClientApp failed the handshake: {reply.error.reason}")
            continue
        got = dict(reply.content["facts"])
        position = int(got["partition-id"])
        wrong = [f"{key} {got[key]!r} (the partition's dataset has {want!r})" if key != "partition-sha256" else
                 "another partition artifact (sha256 differs)"
                 for key, want in expected.items() if want and got.get(key) != want]
        if wrong:
            log(WARNING, f"node {node} refused: its dataset does not fit the partition: {'; '.join(wrong)}")
        elif not 0 <= position < part.num_clients:
            log(WARNING, f"node {node} refused: its partition-id is not a client of the partition" if private else
                f"node {node} refused: partition-id {position} is not a client of the partition "
                f"(0..{part.num_clients - 1})")
        elif position in accepted or position in taken:
            log(WARNING, f"node {node} refused: its partition-id is already held by another node" if private else
                f"node {node} refused: partition-id {position} is already held by node "
                f"{accepted.get(position, taken.get(position))}")
        else:
            accepted[position] = node
            facts[position] = got
            norm = norm or from_record(reply.content["normalization"], "cpu")
    missing = sorted(set(range(part.num_clients)) - set(accepted) - set(taken))
    if missing and not taken:
        log(WARNING, "some clients of the partition have no accepted node: they take no part in training"
            if private else f"no accepted node for clients {missing} (partition ids): they take no part in training")
    if not accepted and not taken:
        raise RunError("flower: no SuperNode was accepted; see the refusals above.")
    return accepted, facts, norm


def _server_store(cfg, part, info, part_art, facts: dict, norm: dict) -> ServerStore:
    import torch

    from pfl_cli.fl.client_state import partition_digest
    from pfl_cli.fl.device import resolve_device

    n = part.num_clients
    labeled = np.zeros(n, dtype=bool)
    length = torch.zeros(n, dtype=torch.long)
    for position, f in facts.items():
        labeled[position] = bool(f["labeled"])
        length[position] = int(f["fit-size"])
    return ServerStore(device=resolve_device(cfg.device), num_clients=n, input_shape=tuple(info["input_shape"]),
                       num_classes=int(info["num_classes"]), role=np.asarray(part.role), labeled=labeled,
                       fit=_sizes_only(length), mean=norm["mean"], std=norm["std"],
                       partition_sha=partition_digest(part.client_id, np.asarray(part.role), part.train_offsets,
                                                      part.train_indices),
                       vocab_size=info.get("vocab_size"))


def _sizes_only(length):
    """A ``Padded`` of the clients' fit sizes whose indices are all ``NOT_HERE``: the server draws a cohort's
    batches from it (consuming the round generator as ``pflx train`` does), and its nodes read their own."""
    import torch

    from pfl_cli.fl.store import NOT_HERE, Padded

    width = max(int(length.max()) if len(length) else 1, 1)
    return Padded(torch.full((len(length), width), NOT_HERE, dtype=torch.long), length)


def exchange(grid, meter, kind: str, message_type: str, contents: dict, accepted: dict, timeout: float):
    """Send each client's ``contents[position]`` (a ``RecordDict``) to its node and wait for the replies.

    Returns ``({position: reply content}, {position: why it has none})``: a ClientApp's error
    ("failed: ...") or no reply within ``timeout`` (a node gone).
    """
    from flwr.app import Message

    messages = [Message(content, dst_node_id=accepted[c], message_type=message_type) for c, content in contents.items()]
    by_node = {accepted[c]: c for c in contents}
    got, why = {}, {}
    for reply in _send(grid, messages, timeout, meter, kind):
        c = by_node.get(_origin(reply, messages))
        if c is None:
            continue
        if reply.has_error():
            why[c] = f"failed: {reply.error.reason}"
        else:
            got[c] = reply.content
    for c in contents:
        if c not in got:
            why.setdefault(c, f"no reply within {timeout:g} s")
    return got, why


def close_round(t: int, members: list, kept: list, why: dict, accepted: dict, part, participation: list,
                run_config, *, private: bool = False) -> None:
    """Record who took part in round ``t`` (participation.csv) and fail the run below ``min-clients`` (the
    documented fault rule: a round completes with the clients that replied).

    ``private`` (``--dp``): the record is kept for ``nonprivate-participation.csv`` only, nothing is
    logged and ``min-clients`` is not applied: who was in a Poisson cohort, and how many replied, is what
    the ledger's subsampling amplification keeps secret (DP-FedAvg divides by the expected cohort q N,
    so a drop needs no rule).
    """
    timeout = float(run_config.get("round-timeout", 120))
    min_clients = int(run_config.get("min-clients", 1))
    for c in members:
        status = "trained" if c in kept else why.get(c, f"no reply within {timeout:g} s")
        participation.append([t + 1, int(part.client_id[c]), accepted[c], status])
        if c not in kept and not private:
            log(WARNING, f"round {t + 1}: client {int(part.client_id[c])} (node {accepted[c]}) dropped: {status}")
    if not private and len(kept) < min(min_clients, len(members)):
        raise RunError(f"flower: round {t + 1}: {len(kept)} of the cohort's {len(members)} clients replied "
                       f"within {timeout:g} s, fewer than min-clients ({min_clients}); nothing was written.")


def round_cohort(alg, t: int, total: int, train_clients, randomness):
    """The simulation's round generator and cohort (pfl_cli.fl.loop), and the generator's state after the
    draw: a node restores it to draw its client's batches as ``pflx train`` does."""
    gen = randomness.torch(f"round-{t}")
    cohort = alg.sample_cohort(train_clients, alg.cohort_size(t, total, len(train_clients)), gen)
    from pfl_cli.interop.flower_app.wire import generator_state

    return [int(c) for c in cohort], generator_state(gen)


def run_rounds(grid, alg, cfg, accepted: dict, part, meter, run_config, one_round):
    """The rounds of a deployment: each draws the simulation's cohort, runs the algorithm's exchanges and
    server step (``one_round(grid, alg, meter, accepted, t, members, generator_state, timeout) -> (kept,
    why, {client: loss})``), records participation and the ledger's round; returns the loss rows and
    participation."""
    from pfl_cli.fl.dp import released_state_finite
    from pfl_cli.privacy.randomness import train_randomness

    randomness = train_randomness(cfg)  # under --dp: OS entropy unless noise=seeded, as pflx train
    timeout = float(run_config.get("round-timeout", 120))
    train_clients = train_clients_of(alg, part)
    total, losses, participation = cfg.rounds, [], []
    private = alg.dp is not None
    for t in range(total):
        members, state = round_cohort(alg, t, total, train_clients, randomness)
        kept, why, loss = one_round(grid, alg, meter, accepted, t, members, state, timeout)
        close_round(t, members, kept, why, accepted, part, participation, run_config, private=private)
        alg.traffic.close_round(len(kept))
        if private:  # the loss and the cohort are private: judged on the released model, logged as a count
            if not released_state_finite(alg):
                raise RunError(f"flower: the released model is not finite after round {t + 1} (training "
                               "diverged); nothing was written. Lower lr or the --dp clip.")
            losses.append(float(np.mean(list(loss.values()))) if loss else float("nan"))
            log(INFO, f"round {t + 1}/{total}")
            continue
        if getattr(cfg, "secagg", False):  # the server learns the cohort's sum only, no client's loss
            log(INFO, f"round {t + 1}/{total}: {len(kept)} clients (secure aggregation: no loss is revealed)")
            continue
        losses.append(check_loss({c: loss[c] for c in kept}, t))
        log(INFO, f"round {t + 1}/{total}: {len(kept)} clients, loss {losses[-1]:.4f}")
    return mean_loss_row(losses, total), participation


def train_clients_of(alg, part):
    import torch

    from pfl_cli.fl.store import ROLE_TRAIN

    clients = torch.as_tensor(np.flatnonzero(part.role == ROLE_TRAIN), device=alg.device)
    alg.check_trainable(clients)
    return clients


def evaluation_of(results: dict, part, rounds: int):
    """Per-client test counts ``{position: {n, correct, correct_lm, loss}}`` -> an ``Evaluation`` by group."""
    from pfl_cli.fl.evaluate import GroupEval
    from pfl_cli.fl.loop import Evaluation
    from pfl_cli.fl.store import ROLE_HOLDOUT, ROLE_TRAIN

    groups = {}
    for name, role in (("train", ROLE_TRAIN), ("holdout", ROLE_HOLDOUT)):
        clients = np.array(sorted(c for c in results if part.role[c] == role), dtype=np.int64)
        if len(clients):
            groups[name] = GroupEval(clients=clients, **{k: np.array([results[c][k] for c in clients])
                                                         for k in ("n", "correct", "correct_lm", "loss")})
    if not groups:
        raise RunError("flower: no node returned an evaluation; nothing was written.")
    return Evaluation(rounds, groups)


def mean_loss_row(losses: list, total: int) -> list:
    """The train-loss rows of metrics.csv: the mean of the rounds' mean client losses."""
    return [[total, "train", "train_loss", float(np.mean(losses)) if losses else float("nan")]]


def check_loss(losses: dict, t: int) -> float:
    mean = float(np.mean(list(losses.values())))
    if not np.isfinite(mean):
        raise RunError(f"flower: training diverged: the loss became {mean} at round {t + 1}.")
    return mean
