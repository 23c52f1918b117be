"""FedAvg and FedProx on Flower under ``--secagg``: every round through Flower's SecAgg+ protocol.

The server side runs Flower's own ``SecAggPlusWorkflow`` (flwr.server.workflow) for each round, and the
generated ClientApp wraps its training handler in Flower's ``secaggplus_mod``: SecAgg+ (Bell et al., CCS
2020, "Secure Single-Server Aggregation with (Poly)Logarithmic Overhead"; the masking of Bonawitz et al.,
CCS 2017, §4) with every cohort client a neighbour of every other. Each node masks its row with pairwise
and private masks (mod 2^32) before it leaves the node, so the ServerApp receives masked vectors and key
shares, and unmasks only their sum; :func:`one_round` hands that sum to the algorithm's own server half
(``aggregate_secure``, the simulation's code, :mod:`pfl_cli.fl.secagg`).

What a node's row is (its one vector, ``num_examples`` 1 and no metrics, so nothing else reaches the server):

* without DP, ``(w_i Delta_i, w_i)`` with ``w_i = n_i / n_max`` (its fit size over the largest, a public
  fact of the handshake) and Delta_i its model's change: the sums give McMahan et al. 2017 Alg. 1's
  weighted mean, sum(n_i theta_i) / sum(n_i), as the simulation's ``secure_contributions``. Flower
  quantizes each coordinate stochastically to 2^22 levels over [-8, 8] (``quantization_range``,
  ``clipping_range``), the tolerance of the deployment against the simulation; a node whose row leaves
  that range fails its round with a message rather than being clipped silently;
* with ``dp_mechanism=ddg``, the distributed discrete Gaussian's encoding
  (:meth:`pfl_cli.privacy.distributed.DistributedDiscreteGaussian.client_rows`: clipped, scaled, rounded,
  its own noise share added on the node, mod 2^b). An integer vector passes Flower's quantizer exactly:
  the node sends ``z - 2^(b-1)`` with ``clipping_range = 2^(b-1)`` and ``quantization_range = 2^b``, so the
  quantizer's grid is the integers and its stochastic rounding has nothing to round; the server inverts
  Flower's dequantization and keeps the sum mod 2^b (2^b divides 2^32, Flower's modulus).

The loss of a node is not sent: under secure aggregation the server learns sums only, and the round's log
line says so.
"""

from __future__ import annotations

import json
from logging import WARNING

import numpy as np

CLIP_RANGE = 8.0          # Flower's default clipping_range: the float rows' coordinates lie in [-8, 8]
QUANT_RANGE = 2 ** 22     # Flower's default quantization_range
MOD_RANGE = 2 ** 32       # Flower's largest modulus_range
THRESHOLD = 2 / 3         # reconstruction_threshold: the share of a cohort's key shares needed to unmask
SECURE_TRAIN = "train"    # secaggplus_mod acts on messages of type "train" only (the default action)


def max_bits(cohort: int) -> int:
    """The largest ``dp_bits`` the deployment takes: integers below 2^b pass Flower's int32 quantizer, and the
    cohort's sum of values below 2^b stays below Flower's modulus 2^32."""
    return min(30, 32 - int(np.ceil(np.log2(max(cohort, 2)))) - 1)


def _names(alg) -> list[str]:
    return sorted(alg.global_params)


# ---------------------------------------------------------------------------------------------- server side
class _Proxy:
    """The one field of Flower's ``ClientProxy`` the SecAgg+ workflow reads: the node id."""

    def __init__(self, node_id: int) -> None:
        self.node_id = node_id
        self.cid = str(node_id)


class _Round:
    """The strategy the SecAgg+ workflow asks for a round's instructions and hands the unmasked aggregate to."""

    def __init__(self, fitins: dict) -> None:
        self.fitins, self.aggregate, self.nodes = fitins, None, []

    def configure_fit(self, server_round, parameters, client_manager):
        return [(_Proxy(node), ins) for node, ins in self.fitins.items()]

    def aggregate_fit(self, server_round, results, failures):
        from flwr.common import parameters_to_ndarrays

        self.nodes = [proxy.node_id for proxy, _ in results]
        if results:
            self.aggregate = parameters_to_ndarrays(results[0][1].parameters)
        return None, {}


class _MeteredGrid:
    """The grid the workflow talks to, counting the bytes of every message it sends and receives (arrays and
    the bytes in config records: SecAgg+'s keys, shares and masked vectors travel there)."""

    def __init__(self, grid, meter, kind: str) -> None:
        self.grid, self.meter, self.kind = grid, meter, kind

    def __getattr__(self, name):
        return getattr(self.grid, name)

    def send_and_receive(self, messages, *, timeout=None):
        messages = list(messages)
        for m in messages:
            self.meter.down[self.kind] = self.meter.down.get(self.kind, 0) + _bytes(m.content)
        replies = list(self.grid.send_and_receive(messages, timeout=timeout))
        for r in replies:
            if not r.has_error():
                self.meter.up[self.kind] = self.meter.up.get(self.kind, 0) + _bytes(r.content)
        return replies


def _bytes(content) -> int:
    arrays = sum(len(a.data) for rec in content.array_records.values() for a in rec.values())
    extra = 0
    for rec in content.config_records.values():
        for v in rec.values():
            for item in (v if isinstance(v, list) else [v]):
                extra += len(item) if isinstance(item, bytes) else 0
    return arrays + extra


def one_round(grid, alg, meter, accepted: dict, t: int, members: list, state: bytes, timeout: float):
    """One round of FedAvg / FedProx through Flower's SecAgg+: instructions down, masked rows up, the unmasked
    sum into the algorithm's ``aggregate_secure``. Returns (clients kept, why others were not, {}: no losses)."""
    from flwr.app import ArrayRecord, ConfigRecord, Context, RecordDict
    from flwr.common import FitIns, ndarrays_to_parameters
    from flwr.server.compat.legacy_context import LegacyContext
    from flwr.server.workflow import SecAggPlusWorkflow
    from flwr.server.workflow.constant import MAIN_CONFIGS_RECORD, MAIN_PARAMS_RECORD
    from flwr.server.workflow.constant import Key as WorkflowKey

    from pfl_cli.algorithms.base import stack
    from pfl_cli.fl.secagg import WEIGHT, SecureSum

    names = _names(alg)
    model = ndarrays_to_parameters([alg.global_params[k].detach().cpu().numpy() for k in names])
    if alg.dp is None:
        sizes = [int(alg.store.fit.length[c]) for c in accepted]
        config = {"round": t, "cohort": json.dumps(members), "generator": state, "n-max": max(sizes + [1])}
        fitins = {accepted[c]: FitIns(model, dict(config)) for c in members}
        clip, quant = CLIP_RANGE, QUANT_RANGE
    else:  # a node learns that it was selected and gets its own batches (as the --dp rounds of averaging.py)
        from pfl_cli.interop.flower_app.averaging import _own_batches

        mech = json.dumps({f: getattr(alg.dp, f) for f in alg.dp.__dataclass_fields__})
        fitins = {}
        for c, own in _own_batches(alg, members, state).items():
            slots, mask = own["slots"].numpy(), own["mask"].numpy()
            fitins[accepted[c]] = FitIns(model, {"round": t, "mechanism": mech,
                                                 "slots": slots.astype(np.int64).tobytes(),
                                                 "mask": mask.astype(np.float32).tobytes(),
                                                 "shape": json.dumps(list(slots.shape))})
        half = 2 ** (alg.dp.bits - 1)
        clip, quant = float(half), 2 * half
    strategy = _Round(fitins)
    context = LegacyContext(Context(run_id=0, node_id=0, node_config={}, state=RecordDict(), run_config={}),
                            strategy=strategy)
    context.state.config_records[MAIN_CONFIGS_RECORD] = ConfigRecord({WorkflowKey.CURRENT_ROUND: t + 1})
    context.state.array_records[MAIN_PARAMS_RECORD] = ArrayRecord()
    workflow = SecAggPlusWorkflow(num_shares=1.0, reconstruction_threshold=THRESHOLD, max_weight=1.0,
                                  clipping_range=clip, quantization_range=quant, modulus_range=MOD_RANGE,
                                  timeout=timeout)
    metered = _MeteredGrid(grid, meter, "train.secaggplus")
    workflow(metered, context)
    node_to_client = {accepted[c]: c for c in members}
    kept = sorted(node_to_client[node] for node in strategy.nodes)
    n = len(kept)
    if strategy.aggregate is None or n == 0:  # the protocol halted (too few nodes): no released sum, no step
        from pfl_cli.interop.flower_app.server import log

        log(WARNING, f"round {t + 1}: secure aggregation halted (too few nodes replied); no step")
        return [], {c: "secure aggregation halted" for c in members}, {}
    total = _sums(alg, strategy.aggregate, n, names, clip, quant)
    alg.record_exchange(alg.global_params, stack(alg.global_params, n), n)  # the ledger: as the simulation's
    if alg.dp is None:
        weight = total.pop(WEIGHT)
        theta_sum = {k: total[k] + alg.global_params[k] * weight for k in names}  # sum w_i Delta_i + sum w_i g
        alg.aggregate_secure(t, SecureSum({**theta_sum, WEIGHT: weight}, n))
    else:
        alg.aggregate_secure(t, SecureSum(total, n, alg.dp.modulus))
    why = {c: "dropped out of secure aggregation" for c in members if c not in kept}
    return kept, why, {}


def _sums(alg, aggregate: list, n: int, names: list, clip: float, quant: int) -> dict:
    """The workflow's aggregate (the mean of the rows, Flower's dequantized average) -> the rows' sums: floats
    (no DP), or integers mod 2^b (ddg), recovered exactly from Flower's float64 arithmetic."""
    import torch

    device = alg.global_params[names[0]].device
    if alg.dp is None:
        sums = [torch.as_tensor(a * n, dtype=torch.float32, device=device) for a in aggregate]
        from pfl_cli.fl.secagg import WEIGHT

        out = {k: s.view(alg.global_params[k].shape) for k, s in zip(names, sums)}
        out[WEIGHT] = sums[-1].reshape(())
        return out
    # Flower: aggregate = (S - n c) * quant / (n quant mod 2^32), S the sum of the node's quantized values mod
    # 2^32 (flwr secaggplus_workflow.unmask_stage); n quant < 2^32 here (max_bits), so the factor is 1 / n.
    q_total = (n * quant) % MOD_RANGE
    out = {}
    for k, a in zip(names, aggregate):
        s = np.rint(np.asarray(a, dtype=np.float64) * q_total / quant + n * clip).astype(np.int64)
        out[k] = torch.as_tensor(np.mod(s, alg.dp.modulus), device=device).view(alg.global_params[k].shape)
    return out


# ---------------------------------------------------------------------------------------------- node side
def train_node(message, context):
    """The node's half of SecAgg+'s stage 2 (``secaggplus_mod`` calls it, then masks what it returns): local SGD
    of the node's client from the global model, and its row (see the module docstring) as a ``FitRes``."""
    import torch
    from flwr.app import Message
    from flwr.common import Code, FitRes, Status, ndarrays_to_parameters, parameters_to_ndarrays
    from flwr.compat.common import recorddict_compat as compat

    from pfl_cli.interop.flower_app.averaging import local_model
    from pfl_cli.interop.flower_app.node import load_node

    data = load_node(context)
    alg = data.algorithm
    ins = compat.recorddict_to_fitins(message.content, keep_input=True)
    names = _names(alg)
    glob = {k: torch.as_tensor(a).to(alg.device) for k, a in zip(names, parameters_to_ndarrays(ins.parameters))}
    cfg = ins.config
    t = int(cfg["round"])
    if "mechanism" in cfg:
        shape = json.loads(str(cfg["shape"]))
        own = {"slots": torch.from_numpy(np.frombuffer(cfg["slots"], dtype=np.int64).reshape(shape).copy()),
               "mask": torch.from_numpy(np.frombuffer(cfg["mask"], dtype=np.float32).reshape(shape).copy())}
        theta, _ = local_model(data, glob, own=own)
        rows = ddg_row(alg.cfg, json.loads(str(cfg["mechanism"])), {k: theta[k] - glob[k] for k in names}, t,
                       data.position)
    else:
        theta, _ = local_model(data, glob, round_no=t, cohort=json.loads(str(cfg["cohort"])),
                               generator=cfg["generator"])
        rows = plain_row({k: theta[k] - glob[k] for k in names}, int(data.store.fit.length[data.position]),
                         int(cfg["n-max"]))
    arrays = [rows[k] for k in names] + ([rows["__weight__"]] if "__weight__" in rows else [])
    res = FitRes(Status(Code.OK, ""), ndarrays_to_parameters(arrays), 1, {})  # num_examples 1: no size revealed
    return Message(compat.fitres_to_recorddict(res, keep_input=True), reply_to=message)


def plain_row(delta: dict, n: int, n_max: int) -> dict:
    """``(w Delta, w)``, w = n / n_max, as float64 arrays inside Flower's clipping range (else a clear error)."""
    w = n / max(n_max, 1)
    rows = {k: (v.detach().cpu().double() * w).numpy() for k, v in delta.items()}
    rows["__weight__"] = np.array([w], dtype=np.float64)
    worst = max(float(np.abs(a).max()) for a in rows.values())
    if worst > CLIP_RANGE:
        raise ValueError(f"secure aggregation: a coordinate of this client's weighted update is {worst:.3g}, outside "
                         f"Flower SecAgg+'s clipping range [-{CLIP_RANGE:g}, {CLIP_RANGE:g}]; lower lr or local_steps.")
    return rows


def ddg_row(cfg, fields: dict, delta: dict, t: int, position: int) -> dict:
    """The distributed discrete Gaussian's encoding of this client's delta (its noise share added here, on the
    node, from OS entropy unless noise=seeded), shifted by -2^(b-1) for Flower's quantizer (module docstring)."""
    from pfl_cli.privacy.distributed import DistributedDiscreteGaussian
    from pfl_cli.privacy.randomness import mechanism_generator

    mech = DistributedDiscreteGaussian(**fields)
    gen = mechanism_generator(cfg, f"dp-client-noise-{t}-client-{position}")
    encoded = mech.client_rows({k: v[None] for k, v in delta.items()}, gen)
    half = 2 ** (mech.bits - 1)
    return {k: (v[0].cpu().numpy().astype(np.int64) - half).astype(np.float64) for k, v in encoded.items()}
