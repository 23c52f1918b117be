"""PeFLL on Flower: thesis Alg. 8's split back-propagation across the network, Alg. 7 for evaluation.

The hypernetwork h (eta_h) and its optimizer live in the ServerApp only; a node holds one client's
data and receives the embedding network eta_v. One training round is three exchanges per cohort
client, the six messages of thesis Alg. 8 (§4.3, App. B.1.3) (and of PeFLL's traffic ledger):

====================  ==========================  ==========================  ====================
exchange              server -> node              node -> server              Alg. 8 steps
====================  ==========================  ==========================  ====================
``DESCRIBE``          eta_v (+ round generator)   raw descriptor v_i          3-7
``LOCAL``             theta_i = h(v_i)            delta theta_i (+ loss)      8-11
``BACKPROP``          dv_i (the VJP through h)    d eta_v^(i)                 12-15
====================  ==========================  ==========================  ====================

then the server averages and steps (lines 17-18). Both sides call PeFLL's own halves
(:meth:`PeFLL.client_descriptor`, :meth:`~PeFLL.server_generate`, :meth:`~PeFLL.server_backward`,
:meth:`~PeFLL.client_embedding_grad`, :meth:`~PeFLL._server_step`), the code ``pflx train`` runs, so the
numbers are the simulation's: every tensor agrees bitwise except the embedding network's gradient,
which the simulation back-propagates through the whole cohort's batch at once and the deployment
as a sum of the nodes' own VJPs (the same terms summed in another order: float rounding).

A node keeps what its later messages of the round need in its run state (``context.state``,
Flower keeps it between a run's messages): the round's generator after the descriptor draw, its
descriptor batch B_i and the eta_v it received, so its step-14 VJP runs on the same graph as step 6
(recomputed, thesis Alg. 8 line 8). Evaluation (and a client that never trained: a holdout node) is
Alg. 7: eta_v down, the node's descriptor up, its generated model down, zero optimizer steps; the
node evaluates that model on its test samples.

Fault rule (the averaging rule): a client that fails or does not reply within ``round-timeout`` in
any of the three exchanges is dropped from the round; the server's step then uses the clients that
completed all three (their hypernetwork VJP recomputed over them, their d eta_v rescaled to the
same mean), and participation.csv records the drop.
"""

from __future__ import annotations

from logging import WARNING

import numpy as np

DESCRIBE = "train.pflx_pefll_describe"
LOCAL = "train.pflx_pefll_local"
BACKPROP = "train.pflx_pefll_backprop"
EVAL_DESCRIBE = "query.pflx_pefll_describe"
EVAL_MODEL = "evaluate.pflx_pefll_model"
STATE = "pflx-pefll-round"  # the node's run state: a ConfigRecord, and ArrayRecords with these suffixes


def one_round(grid, alg, meter, accepted, t, members, state, timeout):
    """One round of Alg. 8; returns (clients that completed it, why the others did not, their losses)."""
    import torch
    from flwr.app import ConfigRecord, RecordDict

    from pfl_cli.interop.flower_app.server import exchange
    from pfl_cli.interop.flower_app.wire import from_record, to_record

    eta_v = {k: p.detach() for k, p in alg.embed.named_parameters()}
    round_ = ConfigRecord({"round": t, "cohort": members, "generator": state})
    got, why = exchange(grid, meter, "train.descriptor", DESCRIBE,                                    # steps 3-7
                        {c: RecordDict({"embedding": to_record(eta_v), "round": round_}) for c in members},
                        accepted, timeout)
    kept = [c for c in members if c in got]
    if not kept:
        return kept, why, {}
    raw = {c: from_record(got[c]["descriptor"], alg.device)["v"] for c in kept}
    raw_leaf, theta = alg.server_generate(torch.stack([raw[c] for c in kept]))                      # step 8
    got, more = exchange(grid, meter, "train.model", LOCAL,                                          # steps 9-11
                         {c: RecordDict({"theta": to_record({k: theta[k][i].detach() for k in alg.names})})
                          for i, c in enumerate(kept)}, accepted, timeout)
    why.update(more)
    delta = {c: from_record(got[c]["delta"], alg.device) for c in kept if c in got}
    loss = {c: float(got[c]["result"]["loss"]) for c in delta}
    sent = dict(zip(kept, range(len(kept))))  # row of each client in the generated theta
    kept = [c for c in kept if c in delta]
    if not kept:
        return kept, why, loss
    if len(kept) < len(sent):  # a client dropped: generate again over those that trained
        raw_leaf, theta = alg.server_generate(torch.stack([raw[c] for c in kept]))
    g_h, g_raw = _server_backward(alg, theta, raw_leaf, delta, kept)                                  # step 12
    got, more = exchange(grid, meter, "train.embedding_grad", BACKPROP,                              # steps 13-15
                         {c: RecordDict({"descriptor_grad": to_record({"v": g_raw[i]})}) for i, c in enumerate(kept)},
                         accepted, timeout)
    why.update(more)
    done = [c for c in kept if c in got]
    if not done:
        return done, why, loss
    if len(done) < len(kept):  # dropped after training: the eta_h VJP over those that completed the round
        raw_leaf, theta = alg.server_generate(torch.stack([raw[c] for c in done]))
        g_h, _ = _server_backward(alg, theta, raw_leaf, delta, done)
    scale = len(kept) / len(done)  # each node's d eta_v carries 1 / len(kept) (its dv did)
    e_params = list(alg.embed.parameters())
    g_e = _sum_node_grads([from_record(got[c]["embedding_grad"], alg.device) for c in done],
                          [k for k, _ in alg.embed.named_parameters()], scale)
    alg._server_step(list(alg.hnet.parameters()), g_h, e_params, g_e)                                # lines 17-18
    # The ledger of the clients that completed the round (theta has their rows; delta theta its shape).
    alg._record_traffic(len(done), raw_leaf, theta, theta)
    return done, why, loss


def _server_backward(alg, theta, raw_leaf, delta: dict, clients: list):
    """Step 12 on the rows of ``clients``: -delta / |P| (the simulation's ``(theta - new) / c``) through h."""
    import torch

    c = len(clients)
    neg_delta = [-torch.stack([delta[i][k] for i in clients]) / c for k in alg.names]
    return alg.server_backward(theta, raw_leaf, neg_delta)


def _sum_node_grads(grads: list[dict], names: list[str], scale: float) -> list:
    """The nodes' d eta_v summed in cohort order (line 18's sum; the 1 / |P| is inside each dv)."""
    total = []
    for name in names:
        g = grads[0][name].clone()
        for other in grads[1:]:
            g += other[name]
        total.append(g * scale if scale != 1.0 else g)
    return total


def evaluate(grid, alg, cfg, accepted: dict, part, meter, timeout: float):
    """Alg. 7 on every accepted node: eta_v down, its descriptor up, h(v) down, evaluated on its test samples."""
    import torch
    from flwr.app import ConfigRecord, RecordDict

    from pfl_cli.interop.flower_app.server import evaluation_of, exchange, log
    from pfl_cli.interop.flower_app.wire import from_record, to_record

    eta_v = {k: p.detach() for k, p in alg.embed.named_parameters()}
    got, why = exchange(grid, meter, "evaluate", EVAL_DESCRIBE,
                        {c: RecordDict({"embedding": to_record(eta_v), "config": ConfigRecord({"round": cfg.rounds})})
                         for c in accepted}, accepted, timeout)
    described = [c for c in sorted(accepted) if c in got]
    results = {}
    if described:
        raw = torch.stack([from_record(got[c]["descriptor"], alg.device)["v"] for c in described])
        theta = alg.server_models(raw)                                                                # Alg. 7 step 5
        got, more = exchange(grid, meter, "evaluate", EVAL_MODEL,
                             {c: RecordDict({"theta": to_record({k: theta[k][i] for k in alg.names})})
                              for i, c in enumerate(described)}, accepted, timeout)
        why.update(more)
        results = {c: got[c]["result"] for c in got}
    for c, reason in why.items():
        log(WARNING, f"node {accepted[c]}: no evaluation: {reason}")
    return evaluation_of(results, part, cfg.rounds)


# ---------------------------------------------------------------------------------------------- node side
def describe(message, context):
    """Steps 4-7: the descriptor v_i of this client's batch B_i under the eta_v received (raw: the server
    standardizes it). Keeps the round's generator, B_i and eta_v in the node's run state."""
    from flwr.app import Array, ArrayRecord, ConfigRecord, Message, RecordDict

    from pfl_cli.interop.flower_app.wire import generator_state, to_record

    data, alg, row, cohort, gen = _round_node(context, message.content["round"], message.content["embedding"])
    d_index, d_mask = alg.descriptor_batches(cohort, gen)                                             # step 5
    index, mask = d_index[row:row + 1], d_mask[row:row + 1]
    raw = alg.client_descriptor(index, mask)                                                          # step 6
    round_ = message.content["round"]
    context.state[STATE] = ConfigRecord({"round": int(round_["round"]), "cohort": list(round_["cohort"]),
                                         "generator": generator_state(gen), "row": row})
    context.state[STATE + ".batch"] = ArrayRecord({"index": Array(index.cpu().numpy()), "mask": Array(mask.cpu().numpy())})
    context.state[STATE + ".embedding"] = message.content["embedding"]
    return Message(RecordDict({"descriptor": to_record({"v": raw[0]})}), reply_to=message)


def local_train(message, context):
    """Steps 9-11: k local SGD steps from the theta_i received, on the batches the simulation draws;
    delta theta_i goes up."""
    import torch
    from flwr.app import Message

    from pfl_cli.interop.flower_app.node import local_delta
    from pfl_cli.interop.flower_app.wire import from_record, restore_generator

    data, alg, state = _stored(context)
    cohort = torch.as_tensor(list(state["cohort"]), dtype=torch.long, device=alg.device)
    batches = alg.step_batches(cohort, restore_generator(state["generator"]), lazy=True)
    content = local_delta(data, from_record(message.content["theta"], alg.device), batches,
                          f"round {state['round']}", list(state["cohort"]))
    return Message(content, reply_to=message)


def backprop(message, context):
    """Steps 13-15: the VJP of the dv_i received through v(B_i; eta_v), on B_i and the eta_v of step 6."""
    import torch
    from flwr.app import Message, RecordDict

    from pfl_cli.interop.flower_app.wire import from_record, to_record

    data, alg, state = _stored(context)
    batch = context.state[STATE + ".batch"]
    index = torch.as_tensor(batch["index"].numpy(), device=alg.device)
    mask = torch.as_tensor(batch["mask"].numpy(), device=alg.device)
    raw = alg.client_descriptor(index, mask)                                        # step 6's graph, recomputed
    g_raw = from_record(message.content["descriptor_grad"], alg.device)["v"][None]
    grads = alg.client_embedding_grad(raw, g_raw)                                                     # step 14
    out = {k: torch.zeros_like(p) if g is None else g for (k, p), g in zip(alg.embed.named_parameters(), grads)}
    return Message(RecordDict({"embedding_grad": to_record(out)}), reply_to=message)


def evaluate_describe(message, context):
    """Alg. 7 steps 2-4: this client's descriptor (raw) under the final eta_v."""
    from flwr.app import Message, RecordDict

    from pfl_cli.interop.flower_app.node import load_node
    from pfl_cli.interop.flower_app.wire import from_record, to_record
    from pfl_cli.rng import torch_generator

    data = load_node(context)
    alg = data.algorithm
    alg.embed.load_state_dict(from_record(message.content["embedding"], alg.device))
    gen = torch_generator(alg.cfg.seed, f"evaluate-{int(message.content['config']['round'])}")
    raw = alg.raw_descriptors(np.array([data.position]), gen)
    return Message(RecordDict({"descriptor": to_record({"v": raw[0]})}), reply_to=message)


def _round_node(context, round_, embedding):
    """The node's client and algorithm with the eta_v received; its row in the cohort; the round generator."""
    import torch

    from pfl_cli.interop.flower_app.node import load_node
    from pfl_cli.interop.flower_app.wire import from_record, restore_generator

    data = load_node(context)
    alg = data.algorithm
    alg.embed.load_state_dict(from_record(embedding, alg.device))
    members = list(round_["cohort"])
    if data.position not in members:
        raise RuntimeError(f"round {round_['round']}: this node's client {data.position} is not in the cohort "
                           f"{members} it was sent.")
    cohort = torch.as_tensor(members, dtype=torch.long, device=alg.device)
    return data, alg, members.index(data.position), cohort, restore_generator(round_["generator"])


def _stored(context):
    """The node's client and algorithm with the round's eta_v restored from its run state."""
    from pfl_cli.interop.flower_app.node import load_node
    from pfl_cli.interop.flower_app.wire import from_record

    if STATE not in context.state:
        raise RuntimeError("PeFLL: a model or a descriptor gradient arrived before this round's descriptor "
                           "exchange (the node keeps no round state).")
    data = load_node(context)
    alg = data.algorithm
    alg.embed.load_state_dict(from_record(context.state[STATE + ".embedding"], alg.device))
    return data, alg, context.state[STATE]
