"""FedAvg and FedProx on Flower (thesis Alg. 3/4): the global model down, local SGD, the client's model up.

Server side (:func:`one_round`, :func:`evaluate`) runs in the ServerApp, node side (:func:`train_round`,
:func:`evaluate_node`) in the ClientApp. Per round, each cohort client's node gets the global
model and the round generator's state after the cohort draw (so its batch draws are the
simulation's), trains, and sends back its model; the server takes the data-size-weighted mean
and its server step, or under ``--dp`` DP-FedAvg's clipped, noised sum over the expected cohort
(:meth:`FedAvg.aggregate`), the simulation's own code.
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

    contents = {c: RecordDict({"global": to_record(alg.global_params),
                               "round": ConfigRecord({"round": t, "cohort": members, "generator": state})})
                for c in members}
    got, why = exchange(grid, meter, "train", ROUND, contents, accepted, timeout)
    kept = [c for c in members if c in got]
    if not kept and alg.dp is None:  # nobody replied: no step
        return kept, why, {}
    theta = {c: from_record(got[c]["theta"], alg.device) for c in kept}
    stacked = ({k: torch.stack([theta[c][k] for c in kept]) for k in alg.global_params} if kept
               else stack(alg.global_params, 0))  # DP: an empty cohort's step is the noise alone
    alg.aggregate(t, torch.as_tensor(kept, dtype=torch.long, device=alg.device), stacked)  # Alg. 3 line 9 / DP-FedAvg
    return kept, why, {c: float(got[c]["result"]["loss"]) for c in kept}


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
    draws of the whole cohort, and this client's rows of them, are the simulation's.
    """
    import torch
    from flwr.app import Message, MetricRecord, RecordDict

    from pfl_cli.algorithms.base import stack
    from pfl_cli.fl.cohort import local_sgd_held
    from pfl_cli.interop.flower_app.node import load_node
    from pfl_cli.interop.flower_app.wire import from_record, restore_generator, to_record

    data = load_node(context)
    alg = data.algorithm
    round_ = message.content["round"]
    alg.load_weights({"client": from_record(message.content["global"], alg.device)})
    gen = restore_generator(round_["generator"])
    cohort = torch.as_tensor(list(round_["cohort"]), dtype=torch.long, device=alg.device)
    start = stack(alg.global_params, len(cohort))
    batches = alg.local_batches(cohort, gen, **alg.round_schedule())
    objective = alg.local_objective()  # FedProx: its proximal term around the global model
    anchor = objective.get("prox_anchor")
    rows, theta, loss = local_sgd_held(alg.net, start, data.store, batches,
                                       prox_mu=objective.get("prox_mu", 0.0),
                                       prox_anchor=None if anchor is None else stack(anchor, len(cohort)),
                                       **alg.sgd_options())
    if int(rows.sum()) != 1:
        raise RuntimeError(f"round {round_['round']}: this node's client {data.position} is not in the cohort "
                           f"{list(round_['cohort'])} it was sent.")
    content = RecordDict({"theta": to_record({k: v[0] for k, v in theta.items()}),
                          "result": MetricRecord({"loss": float(loss[0]), "partition-id": data.position})})
    return Message(content, reply_to=message)


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
