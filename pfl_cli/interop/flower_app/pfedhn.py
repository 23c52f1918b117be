"""pFedHN on Flower (Shamsian et al. 2021, Alg. 1 with two errata fixed as in its official code).

The hypernetwork h(.; phi), the embedding table and their optimizer live in the ServerApp only; a
node holds one client's data and never sees h or any embedding. One training round is one exchange
per cohort client, the two messages of pFedHN's traffic ledger:

====================  ==========================  ==========================  ====================
exchange              server -> node              node -> server              Alg. 1 lines
====================  ==========================  ==========================  ====================
``LOCAL``             theta_i = h(v_i; phi)       delta theta_i (+ loss)      1-2
====================  ==========================  ==========================  ====================

then the server steps phi and the embeddings along J^T (theta_i - theta~_i), averaged over the
cohort (lines 3-4, :meth:`PFedHN.server_update`). Both sides call pFedHN's own code
(:meth:`~PFedHN.generate`, :meth:`~PFedHN.step_batches` with ``local_sgd_held``,
:meth:`~PFedHN.server_update`), the code ``pflx train`` runs: the node draws its client's batches
from the round generator the server sends (its state after the cohort draw), so the deployed
model is the simulation's.

Evaluation: a train client's model is h(v_i) (``MODEL``: down, evaluated on the node's test
samples, no step). A client without an embedding (a holdout node, or one that joined late) takes
pFedHN's new-client protocol (A.9.4, :meth:`PFedHN.new_clients`): phi frozen, a fresh embedding
trained ``embed_rounds`` times by the same ``LOCAL`` exchange (theta = h(v) down, delta theta up),
its step on the server; then its model down.

Fault rule (the averaging rule): a client that fails or does not reply within ``round-timeout`` is
dropped from the round; the server's step averages the clients that replied (their rows of
J^T (theta - theta~) over their number, the dropped rows zero), and participation.csv records the
drop. A new client that drops during its embedding fit is not evaluated (logged).
"""

from __future__ import annotations

from logging import WARNING

import numpy as np

LOCAL = "train.pflx_pfedhn_local"
MODEL = "evaluate.pflx_pfedhn_model"


def one_round(grid, alg, meter, accepted: dict, t: int, members: list, state: bytes, timeout: float):
    """One round of Alg. 1; returns (clients that completed it, why the others did not, their losses)."""
    import torch

    cohort = torch.as_tensor(members, dtype=torch.long, device=alg.device)
    theta = alg.generate(cohort)                                                                     # line 1
    delta, why, loss = _train_remote(grid, alg, meter, accepted, members, members, theta, f"round {t + 1}", state,
                                     timeout, "train")
    kept = [c for c in members if c in delta]                                                        # line 2
    if not kept:
        return kept, why, loss
    rows, replied = _replies(alg, members, delta)
    neg_delta = {k: torch.zeros_like(v) for k, v in theta.items()}
    for out, plain in alg.generated[""]:
        # The simulation's (theta - theta~) / c: -(theta~ - theta) is the same float, c the clients that replied.
        neg_delta[out][rows] = -replied[plain] / len(kept)
        alg.traffic.send(plain, theta[out][rows].detach())
        alg.traffic.receive(f"delta.{plain}", neg_delta[out][rows])
    alg.server_update(theta, neg_delta)                                                              # lines 3-4
    return kept, why, loss


def _replies(alg, cohort: list, delta: dict):
    """The rows of ``cohort`` whose nodes replied (LongTensor) and their delta theta stacked in cohort order
    ({plain name: (replied, ...)})."""
    import torch

    replied = [c for c in cohort if c in delta]
    rows = torch.as_tensor([cohort.index(c) for c in replied], dtype=torch.long, device=alg.device)
    return rows, {plain: torch.stack([delta[c][plain] for c in replied]) for _, plain in alg.generated[""]}


def _train_remote(grid, alg, meter, accepted: dict, cohort: list, members: list, theta: dict, label: str,
                  state: bytes, timeout: float, kind: str):
    """``LOCAL`` to each of ``members``' nodes (rows of ``cohort``, whose batches the nodes draw from the
    generator ``state``): its rows of ``theta``; returns ({client: delta theta_i}, {client: why no
    reply}, {client: loss})."""
    from flwr.app import ConfigRecord, RecordDict

    from pfl_cli.interop.flower_app.server import exchange
    from pfl_cli.interop.flower_app.wire import from_record, to_record

    round_ = ConfigRecord({"label": label, "cohort": cohort, "generator": state})
    contents = {c: RecordDict({"theta": to_record({plain: theta[out][cohort.index(c)].detach()
                                                   for out, plain in alg.generated[""]}), "round": round_})
                for c in members}
    got, why = exchange(grid, meter, f"{kind}.model", LOCAL, contents, accepted, timeout)
    delta = {c: from_record(got[c]["delta"], alg.device) for c in members if c in got}
    return delta, why, {c: float(got[c]["result"]["loss"]) for c in delta}


def evaluate(grid, alg, cfg, accepted: dict, part, meter, timeout: float):
    """Every accepted node's model (h(v_i), or a new client's fitted embedding) down, its test counts up."""
    import torch
    from flwr.app import ConfigRecord, RecordDict

    from pfl_cli.fl.evaluate import NEW_CLIENT_STREAM
    from pfl_cli.interop.flower_app.server import evaluation_of, exchange, log
    from pfl_cli.interop.flower_app.wire import to_record
    from pfl_cli.rng import torch_generator

    clients = np.array(sorted(accepted), dtype=np.int64)
    known = alg.has_state(clients)
    models, why = {}, {}
    if known.any():
        with torch.no_grad():
            theta = alg.generate(torch.as_tensor(clients[known], device=alg.device))
        models.update({int(c): {plain: theta[out][i] for out, plain in alg.generated[""]}
                       for i, c in enumerate(clients[known])})
    if (~known).any():  # A.9.4 as pflx train's evaluation runs it: predict's generator, the clients in order
        gen = torch_generator(cfg.seed, NEW_CLIENT_STREAM)
        fresh = [int(c) for c in clients[~known]]
        remote = _NewClientFit(grid, alg, meter, accepted, fresh, timeout)
        theta = alg.new_clients(clients[~known], gen, "", local=remote)
        why.update(remote.why)
        models.update({c: {k: v[i] for k, v in theta.items()} for i, c in enumerate(fresh) if c not in remote.why})
    contents = {c: RecordDict({"theta": to_record(models[c]), "config": ConfigRecord({"round": cfg.rounds})})
                for c in sorted(models)}
    got, more = exchange(grid, meter, "evaluate", MODEL, contents, accepted, timeout)
    why.update(more)
    for c, reason in why.items():
        log(WARNING, f"node {accepted[c]}: no evaluation: {reason}")
    return evaluation_of({c: got[c]["result"] for c in got}, part, cfg.rounds)


class _NewClientFit:
    """:meth:`PFedHN._local` for :meth:`PFedHN.new_clients` on the nodes: theta = h(v) down, delta theta up.

    The server draws the clients' batches from ``gen`` as the simulation does (it reads no sample:
    its store's indices are ``NOT_HERE``), so ``gen`` advances exactly as it would in ``pflx train``
    and each node, given the state before the draw, draws its own client's batches. A client that
    does not reply keeps theta~ = theta (no step on its embedding) and is left out of the evaluation.
    """

    def __init__(self, grid, alg, meter, accepted: dict, clients: list, timeout: float):
        self.grid, self.alg, self.meter, self.accepted = grid, alg, meter, accepted
        self.clients, self.timeout, self.why, self.fits = clients, timeout, {}, 0

    def __call__(self, theta, sel, gen, heads, momentum, group):
        from pfl_cli.interop.flower_app.wire import generator_state

        state = generator_state(gen)
        self.alg.step_batches(sel, gen, lazy=True)  # the draw the nodes make: gen moves past it here too
        live = [c for c in self.clients if c not in self.why]
        delta, why, _ = _train_remote(self.grid, self.alg, self.meter, self.accepted, self.clients, live, theta,
                                      f"new-client embedding fit {self.fits + 1}", state, self.timeout, "evaluate")
        self.why.update({c: f"embedding fit {self.fits + 1}: {reason}" for c, reason in why.items()})
        self.fits += 1
        new = {out: theta[out].detach().clone() for out, _ in self.alg.generated[group]}
        if delta:
            rows, replied = _replies(self.alg, self.clients, delta)
            for out, plain in self.alg.generated[group]:
                new[out][rows] += replied[plain]
        return new, {}, None


# ---------------------------------------------------------------------------------------------- node side
def local_train(message, context):
    """Alg. 1 line 2: K local SGD steps from the theta_i received, on the batches the simulation draws
    from the generator sent; delta theta_i goes up."""
    import torch

    from pfl_cli.interop.flower_app.node import load_node, local_delta
    from pfl_cli.interop.flower_app.wire import from_record, restore_generator

    data = load_node(context)
    alg = data.algorithm
    round_ = message.content["round"]
    cohort = torch.as_tensor(list(round_["cohort"]), dtype=torch.long, device=alg.device)
    batches = alg.step_batches(cohort, restore_generator(round_["generator"]), lazy=True)
    content = local_delta(data, from_record(message.content["theta"], alg.device), batches, str(round_["label"]),
                          list(round_["cohort"]))
    from flwr.app import Message

    return Message(content, reply_to=message)
