"""FedAvg and FedProx on Flower (thesis Alg. 3/4): the global model down, local SGD, the client's model up.

Server side (:func:`one_round`, :func:`evaluate`) runs in the ServerApp, node side (:func:`train_round`,
:func:`evaluate_node`) in the ClientApp. Per round, each cohort client's node gets the global
model and the round generator's state after the cohort draw (so its batch draws are the
simulation's), trains, and sends back its model; the server takes the data-size-weighted mean
and its server step, or under ``--dp`` DP-FedAvg's clipped, noised sum over the expected cohort
(:meth:`FedAvg.aggregate`), the simulation's own code.

Under ``--dp`` the realized cohort is secret (the ledger's sampling amplification rests on it), so a
node learns that it was selected and nothing about anyone else: instead of the cohort and the round
generator, it gets its own batches, drawn by the server for the whole cohort exactly as the
simulation draws them and cut to its own rows: positions in its own data, as many steps as it takes
and as wide as min(batch size, its size), which are functions of its own data and the public config
(:func:`_own_batches`).
"""

from __future__ import annotations

from logging import WARNING

import numpy as np

from pfl_cli.interop.flower_app.common import EVALUATE, ROUND


def one_round(grid, alg, meter, accepted: dict, t: int, members: list, state: bytes, timeout: float):
    """Global model and generator state down, each client's model up; the weighted mean and server step."""
    import torch
    from flwr.app import ConfigRecord, RecordDict

    from pfl_cli.algorithms.base import stack
    from pfl_cli.interop.flower_app.server import exchange
    from pfl_cli.interop.flower_app.wire import from_record, to_record

    if alg.dp is None:
        contents = {c: RecordDict({"global": to_record(alg.global_params),
                                   "round": ConfigRecord({"round": t, "cohort": members, "generator": state})})
                    for c in members}
    else:  # a node may learn only that it was selected: its own batches, no cohort, no generator
        contents = {c: RecordDict({"global": to_record(alg.global_params), "round": ConfigRecord({"round": t}),
                                   "batches": own})
                    for c, own in _own_batches(alg, members, state).items()}
    got, why = exchange(grid, meter, "train", ROUND, contents, accepted, timeout)
    kept = [c for c in members if c in got]
    if not kept and alg.dp is None:  # nobody replied: no step
        return kept, why, {}
    theta = {c: from_record(got[c]["theta"], alg.device) for c in kept}
    stacked = ({k: torch.stack([theta[c][k] for c in kept]) for k in alg.global_params} if kept
               else stack(alg.global_params, 0))  # DP: an empty cohort's step is the noise alone
    alg.aggregate(t, torch.as_tensor(kept, dtype=torch.long, device=alg.device), stacked)  # Alg. 3 line 9 / DP-FedAvg
    return kept, why, {c: float(got[c]["result"]["loss"]) for c in kept}


def _own_batches(alg, members: list, state: bytes) -> dict:
    """Each member's batches of this round as an ``ArrayRecord``: ``slots`` (steps, width), positions in
    the member's own fit data, and ``mask`` (steps, width), 1 for real samples.

    The server draws the whole cohort's batches as :meth:`Algorithm.local_batches` does (the same
    generator, the same sizes), over positions instead of dataset indices (it holds no data), then
    cuts each member's rows to what that member uses: its active steps (the inactive ones leave a
    client's model exactly as it is) and min(batch size, its size) columns (the rest is padding). What is
    left depends on the member's own size and the public config only, not on who else was drawn.
    """
    import torch
    from flwr.app import ArrayRecord

    from pfl_cli.fl.batches import draw_batches
    from pfl_cli.fl.store import Padded
    from pfl_cli.interop.flower_app.wire import restore_generator

    length = alg.store.fit.length.cpu()
    width = max(int(length.max()) if len(length) else 1, 1)
    positions = Padded(torch.arange(width).expand(len(length), width), length)
    schedule = alg.round_schedule()  # steps, or epochs (Algorithm.local_batches' two forms)
    epochs = schedule.get("epochs")
    batches = draw_batches(positions, torch.as_tensor(members, dtype=torch.long),
                           None if epochs else schedule["steps"], alg.cfg.batch_size, restore_generator(state),
                           epochs=epochs or None)
    slots, mask, active = batches.materialize()
    own = {}
    for i, c in enumerate(members):
        steps = slots.shape[1] if active is None else int(active[i].sum())
        cols = min(slots.shape[2], max(int(length[c]), 1))
        own[c] = ArrayRecord({"slots": slots[i, :steps, :cols].contiguous(),
                              "mask": mask[i, :steps, :cols].contiguous()})
    return own


def evaluate(grid, alg, cfg, accepted: dict, part, meter, timeout: float):
    """The last round's model on every accepted client's test samples -> an ``Evaluation`` by group."""
    from flwr.app import ConfigRecord, RecordDict

    from pfl_cli.interop.flower_app.server import evaluation_of, exchange, log
    from pfl_cli.interop.flower_app.wire import to_record

    contents = {c: RecordDict({"global": to_record(alg.global_params), "config": ConfigRecord({"round": cfg.rounds})})
                for c in accepted}
    got, why = exchange(grid, meter, "evaluate", EVALUATE, contents, accepted, timeout)
    for c, reason in why.items():
        log(WARNING, f"node {accepted[c]}: no evaluation: {reason}")
    return evaluation_of({c: got[c]["result"] for c in got}, part, cfg.rounds)


# ---------------------------------------------------------------------------------------------- node side
def train_round(message, context):
    """FedAvg's client step (thesis Alg. 3 lines 4-7): local SGD from the global model; the new model goes up.

    The round's generator arrives in the state the server's cohort draw left it in, so the batch
    draws of the whole cohort, and this client's rows of them, are the simulation's. Under ``--dp`` the
    message holds this client's own batches instead (drawn by the server, :func:`_own_batches`).
    """
    from flwr.app import Message, MetricRecord, RecordDict

    from pfl_cli.interop.flower_app.node import load_node
    from pfl_cli.interop.flower_app.wire import from_record, to_record

    data = load_node(context)
    alg = data.algorithm
    glob = from_record(message.content["global"], alg.device)
    if "batches" in message.content:  # --dp: this client's own batches, drawn by the server
        theta, loss = local_model(data, glob, own=from_record(message.content["batches"], alg.device))
    else:
        round_ = message.content["round"]
        theta, loss = local_model(data, glob, round_no=int(round_["round"]), cohort=list(round_["cohort"]),
                                  generator=round_["generator"])
    content = RecordDict({"theta": to_record(theta),
                          "result": MetricRecord({"loss": loss, "partition-id": data.position})})
    return Message(content, reply_to=message)


def local_model(data, glob: dict, *, round_no: int | None = None, cohort: list | None = None,
                generator: bytes | None = None, own: dict | None = None) -> tuple[dict, float]:
    """The node's client trained from the global model ``glob``: on its rows of the cohort's batches (``cohort``
    and the round ``generator``'s state, as the simulation draws them), or on ``own`` batches (``slots``,
    ``mask``: positions in its own fit data, under ``--dp``). Returns its model and its mean loss."""
    import torch

    from pfl_cli.algorithms.base import stack
    from pfl_cli.fl.cohort import local_sgd, local_sgd_held
    from pfl_cli.interop.flower_app.wire import restore_generator

    alg = data.algorithm
    alg.load_weights({"client": glob})
    objective = alg.local_objective()  # FedProx: its proximal term around the global model
    anchor = objective.get("prox_anchor")
    if own is not None:
        row, _ = data.store.fit.rows(torch.as_tensor([data.position], dtype=torch.long, device=alg.device))
        slots = own["slots"].long().to(alg.device)
        index = row[0][slots.clamp_max(row.shape[1] - 1)]  # positions in this client's data -> dataset indices
        theta, loss = local_sgd(alg.net, stack(alg.global_params, 1), data.store, index[None],
                                own["mask"].float().to(alg.device)[None], prox_mu=objective.get("prox_mu", 0.0),
                                prox_anchor=None if anchor is None else stack(anchor, 1), **alg.sgd_options())
        return {k: v[0] for k, v in theta.items()}, float(loss[0])
    gen = restore_generator(generator)
    members = torch.as_tensor(cohort, dtype=torch.long, device=alg.device)
    batches = alg.local_batches(members, gen, **alg.round_schedule())
    rows, theta, loss = local_sgd_held(alg.net, stack(alg.global_params, len(members)), data.store, batches,
                                       prox_mu=objective.get("prox_mu", 0.0),
                                       prox_anchor=None if anchor is None else stack(anchor, len(members)),
                                       **alg.sgd_options())
    if int(rows.sum()) != 1:
        raise RuntimeError(f"round {round_no}: this node's client {data.position} is not in the cohort "
                           f"{cohort} it was sent.")
    return {k: v[0] for k, v in theta.items()}, float(loss[0])


def evaluate_node(message, context):
    """The client's model from the global weights (``personalize``) evaluated on its test samples."""
    from flwr.app import Message, RecordDict

    from pfl_cli.fl.evaluate import personalize_and_evaluate
    from pfl_cli.interop.flower_app.node import load_node, test_counts
    from pfl_cli.interop.flower_app.wire import from_record
    from pfl_cli.rng import torch_generator

    data = load_node(context)
    alg = data.algorithm
    alg.load_weights({"client": from_record(message.content["global"], alg.device)})
    round_ = int(message.content["config"]["round"])
    evals, _, _ = personalize_and_evaluate(alg, np.array([data.position]), ("test",),
                                           torch_generator(alg.cfg.seed, f"evaluate-{round_}"))
    return Message(RecordDict({"result": test_counts(data.position, evals["test"])}), reply_to=message)
