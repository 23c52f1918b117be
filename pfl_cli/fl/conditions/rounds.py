"""A round under federation conditions: who is online, who leaves, who is late, how long the round takes.

Every draw comes from the run's seeded streams: each client's speeds once from ``conditions-clients``, each
round's availability and dropouts from ``conditions-{t}`` (numpy), the cohort from the round's own generator as
in a plain round. A round's conditions thus depend only on the seed and the round number, and a run resumed from
a checkpoint draws what the uninterrupted run drew.

The simulated clock (in simulated seconds): client i of a round downloads the model, takes its local steps at
``compute_speed`` steps a second, and uploads its delta, both at ``network_speed`` megabytes a second:
``T_i = B_down / net_i + tau_i / speed_i + B_up / net_i``. Without a deadline the round lasts until its last
answering client has answered. With ``round_deadline`` D, a client with ``T_i > D`` is a straggler: an algorithm
that keeps partial work (``partial_work``: FedProx, Li et al. 2020 §3 Def. 2 and §5.2; FedNova, Wang et al. 2020
§4) gets the steps it finished by D, ``floor((D - B_down / net_i - B_up / net_i) speed_i)``; every other
algorithm drops it (FedAvg's rule in Li et al. 2020 §5.2, "drop the stragglers"), and the round lasts D whenever
a selected client did not answer. Over-selection (Bonawitz et al., "Towards federated learning at scale",
MLSys 2019, §2.2: select more devices than needed and close the round when enough have reported) selects
``ceil((1 + over_selection) K)`` clients and keeps the K that answer first; the round then ends at the K-th
answer. A client that leaves (``dropout``) or is dropped does not answer: it is out of the round's aggregation,
and an algorithm's per-client state of it stays as it was.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from pfl_cli.errors import InputError
from pfl_cli.fl.conditions.settings import CONDITION_DEFAULTS, parse_speed
from pfl_cli.rng import make_rng

MEGABYTE = 1e6
FLOAT_BYTES = 4


def cap_steps(batches, budget) -> None:
    """Let client i of ``batches`` (a :class:`pfl_cli.fl.batches.CohortBatches`) take at most ``budget[i]`` steps:
    it takes its first ``budget[i]`` batches and sits out the rest (the ``active`` mask of the cohort call)."""
    import torch

    budget = budget.to(device=batches.length.device, dtype=torch.int64)
    steps = batches.client_steps if batches.client_steps is not None else \
        torch.full_like(budget, int(batches.steps))
    batches.client_steps = torch.minimum(steps, budget)
    batches.steps = min(int(batches.steps), int(batches.client_steps.max()) if len(budget) else 0)


def client_values(spec: str, n: int, rng, name: str) -> np.ndarray:
    """Each of ``n`` clients' value of ``spec`` (:func:`parse_speed`), drawn from ``rng`` in client order."""
    form = parse_speed(spec, name)
    if form[0] == "const":
        return np.full(n, form[1])
    if form[0] == "uniform":
        return rng.uniform(form[1], form[2], n)
    if form[0] == "lognormal":
        return form[1] * np.exp(form[2] * rng.standard_normal(n))
    values = _read_numbers(form[1], name)
    if values.ndim != 1 or len(values) != n or not np.all(values > 0):
        raise InputError(f"{name}: {form[1]!r} must hold one number > 0 per client of the partition ({n}); got "
                         f"{values.size} values{'' if np.all(values > 0) else ', some <= 0'}.")
    return values


def read_trace(path: str, n: int) -> np.ndarray | None:
    """The availability trace: bool (n, slots); ``path`` "" -> None."""
    if not path:
        return None
    trace = _read_numbers(path, "availability_trace")
    trace = trace.reshape(len(trace), -1) if trace.ndim == 1 else trace
    if trace.shape[0] != n or not np.isin(trace, (0, 1)).all():
        raise InputError(f"availability_trace: {path!r} must hold 0/1 with one row per client of the partition ({n}) "
                         f"and one column per time slot; got shape {trace.shape}"
                         f"{'' if np.isin(trace, (0, 1)).all() else ' with values other than 0 and 1'}.")
    return trace.astype(bool)


def _read_numbers(path: str, name: str) -> np.ndarray:
    from pathlib import Path

    if not Path(path).is_file():
        raise InputError(f"{name}: file {path!r} does not exist; give a CSV of numbers (speeds: one per client of "
                         "the partition; a trace: a row of 0/1 per client, a column per time slot).")
    try:
        values = np.loadtxt(path, delimiter=",", ndmin=1, dtype=np.float64)
    except (OSError, ValueError) as err:
        raise InputError(f"{name}: cannot read {path!r} as a CSV of numbers ({err}).") from None
    if not np.all(np.isfinite(values)):
        raise InputError(f"{name}: {path!r} holds values that are not finite numbers.")
    return values


class Conditions:
    """A run's federation conditions: plans and runs each round, keeps the simulated clock and the codec."""

    def __init__(self, alg, cfg) -> None:
        from pfl_cli.fl.compression import UploadCodec

        store = alg.store
        n = store.num_clients
        self.cfg = cfg
        rng = make_rng(cfg.seed, "conditions-clients")
        self.compute = client_values(cfg.compute_speed, n, rng, "compute_speed")
        self.network = client_values(cfg.network_speed, n, rng, "network_speed")
        self.trace = read_trace(cfg.availability_trace, n)
        # the user's files the conditions read, by digest (the config names them by path only)
        self.files = {p: _sha256(p) for p in _condition_files(cfg)}
        self.partial = bool(alg.partial_work)
        self.private = alg.dp is not None
        self.codec = None
        if cfg.compression != "none":
            self.codec = UploadCodec(cfg.compression, density=cfg.compression_density, levels=cfg.qsgd_levels,
                                     error_feedback=cfg.error_feedback, num_clients=n, seed=cfg.seed)
            alg.upload_codec = self.codec
        floats = _model_floats(alg)
        self.model_floats = floats
        if self.codec is not None and cfg.error_feedback:  # one error memory row per client, before any round
            from pfl_cli.errors import check_memory

            check_memory(f"error feedback for {n} clients x {floats} model floats", 4.0 * n * floats,
                         fix="Set --set error_feedback=false, or use fewer clients or a smaller model.")
        self.down_bytes = FLOAT_BYTES * floats
        self.up_bytes = self.codec.wire_bytes(floats) if self.codec is not None else FLOAT_BYTES * floats
        self.clock = 0.0
        # an asynchronous algorithm's server (FedBuff, FedAsync): its rounds are arrivals on this clock
        self.server = None
        if getattr(alg, "asynchronous", False):
            from pfl_cli.fl.asynchronous import AsyncServer

            self.server = AsyncServer(alg, self)
        self.totals = {"selected": 0, "answered": 0, "left": 0, "late_dropped": 0, "partial": 0}
        if self.private and hasattr(alg.dp, "answer_rate"):  # the DP-FedAvg estimator's expected answering cohort
            import dataclasses

            alg.dp = dataclasses.replace(alg.dp, answer_rate=self.answer_rate())

    # ---------------------------------------------------------------- public expectations
    def answer_rate(self) -> float:
        """The expected share of sampled clients that answer, from public inputs only: availability (or the mean
        of the user's trace) times 1 - dropout (the deadline's stragglers depend on the data and are not in it)."""
        online = float(self.trace.mean()) if self.trace is not None else float(self.cfg.availability)
        return online * (1.0 - float(self.cfg.dropout))

    # ---------------------------------------------------------------- one round
    def plan_round(self, alg, t: int, train_clients, gen, total: int) -> "RoundPlan":
        """Who is online, who is selected, who answers with how many steps, and how long round ``t`` lasts."""
        import torch

        cfg = self.cfg
        rng = make_rng(cfg.seed, f"conditions-{t}")
        pool = train_clients
        online = self._online(t, rng, pool.cpu().numpy())
        pool = pool[torch.as_tensor(online, device=pool.device)]
        size = alg.cohort_size(t, total, len(train_clients))
        count = min(len(pool), math.ceil(size * (1.0 + cfg.over_selection)) if cfg.over_selection else size)
        cohort = alg.sample_cohort(pool, count, gen)
        ids = cohort.cpu().numpy()
        c = len(ids)
        left = rng.random(c) < cfg.dropout
        steps = _planned_steps(alg, cohort)
        transfer = (self.down_bytes + self.up_bytes) / MEGABYTE / self.network[ids]
        full = transfer + steps / self.compute[ids]
        done_steps, finish = steps.copy(), full.copy()
        late = np.zeros(c, dtype=bool)
        deadline = cfg.round_deadline
        if deadline is not None:
            late = full > deadline
            if self.partial:
                can = np.floor(np.maximum(deadline - transfer, 0.0) * self.compute[ids]).astype(np.int64)
                done_steps = np.where(late, np.minimum(can, steps), steps)
                finish = np.where(late, deadline, full)
                answered = ~left & (done_steps > 0)
            else:
                answered = ~left & ~late
        else:
            answered = ~left
        keep = np.flatnonzero(answered)
        if cfg.over_selection and len(keep) > size:  # the first `size` answers close the round
            keep = np.sort(keep[np.argsort(finish[keep], kind="stable")[:size]])
        kept = np.zeros(c, dtype=bool)
        kept[keep] = True
        if cfg.over_selection and len(keep) == size and size > 0:
            duration = float(finish[keep].max())
        elif deadline is not None and (~kept).any():
            duration = float(deadline)
        else:
            duration = float(finish[keep].max()) if len(keep) else 0.0
        return RoundPlan(cohort=cohort, kept=kept, left=left, late=late, steps=steps, done_steps=done_steps,
                         duration=duration)

    def run_round(self, alg, t: int, train_clients, gen, total: int):
        """Plan and run round ``t``: returns (the answering cohort, their losses, metrics rows)."""
        import torch

        if self.codec is not None:
            self.codec.begin_round(t)
        if self.server is not None:
            return self.server.run_round(alg, t, train_clients, gen)
        plan = self.plan_round(alg, t, train_clients, gen, total)
        cohort, kept = plan.cohort, plan.kept
        answering = cohort[torch.as_tensor(kept, device=cohort.device)]
        partial = kept & (plan.done_steps < plan.steps)
        if self.partial and partial.any():
            alg.round_budget = torch.as_tensor(plan.done_steps[kept], device=alg.device)
        try:
            if len(answering) or self.private:  # (under --dp the mechanism runs even on an empty cohort)
                loss = alg.run_round(t, answering, gen)
            else:  # nobody answered: the server has nothing to aggregate
                loss = torch.zeros(0)
        finally:
            alg.round_budget = None
        missing = len(cohort) - len(answering)
        if missing:  # the model went down to clients that never answered: bytes sent all the same
            alg.traffic.send("global model to clients that did not answer", _Floats(self.model_floats),
                             copies=missing)
        alg.traffic.close_round(len(answering))
        self.clock += plan.duration
        dropped = plan.late & ~plan.left & ~kept if not self.partial else np.zeros(len(kept), dtype=bool)
        for k, v in (("selected", len(cohort)), ("answered", len(answering)), ("left", int(plan.left.sum())),
                     ("late_dropped", int(dropped.sum())), ("partial", int(partial.sum()))):
            self.totals[k] += int(v)
        rows = [] if self.private else [[t + 1, "train", "round_sim_seconds", plan.duration],
                                        [t + 1, "train", "clients_answered", len(answering)]]
        return answering, loss, rows

    def job_seconds(self, alg, clients: np.ndarray) -> np.ndarray:
        """Simulated seconds of one job (download, tau_i local steps, upload) of each of ``clients``: an
        asynchronous server's client durations (:mod:`pfl_cli.fl.asynchronous`)."""
        import torch

        steps = _planned_steps(alg, torch.as_tensor(clients, device=alg.device))
        return (self.down_bytes + self.up_bytes) / MEGABYTE / self.network[clients] + steps / self.compute[clients]

    def sent_unanswered(self, alg, copies: int) -> None:
        """The model went down to ``copies`` clients that never answered: bytes sent all the same."""
        alg.traffic.send("global model to clients that did not answer", _Floats(self.model_floats), copies=copies)

    def _online(self, t: int, rng, ids: np.ndarray) -> np.ndarray:
        """Which of the clients ``ids`` are online in round ``t``: the trace's column t mod slots (or, with
        ``trace_slot_seconds``, the column of the simulated clock at the round's start: a diurnal trace of hours),
        or each with probability ``availability`` (one draw per train client, every round, so the stream is the
        same whoever is asked)."""
        draws = rng.random(len(ids))  # drawn in every case: the round's later draws do not depend on the mode
        if self.trace is not None:
            slot_seconds = self.cfg.trace_slot_seconds
            slot = t if slot_seconds is None else int(math.floor(self.clock / slot_seconds))
            return self.trace[ids, slot % self.trace.shape[1]]
        return draws < self.cfg.availability

    def evaluation_rows(self, done: int) -> list[list]:
        """The simulated clock at an evaluation: accuracy against simulated time (time-to-accuracy)."""
        return [] if self.private else [[done, "train", "sim_seconds", self.clock]]

    def summary(self) -> dict:
        """``metrics.json``'s ``conditions`` object."""
        cfg = self.cfg
        out = {"settings": {k: getattr(cfg, k) for k in CONDITION_DEFAULTS}, "files": self.files,
               "late_work": "kept (partial steps)" if self.partial else "dropped",
               **({} if self.server is None else {"asynchronous": True}),
               "expected_answer_rate": self.answer_rate()}
        if self.codec is not None:
            out["compression"] = {"kind": self.codec.kind, "error_feedback": self.codec.error_feedback,
                                  "bytes_up_per_client": self.up_bytes, "bytes_up_uncompressed": self.down_bytes}
        if not self.private:
            out.update({"simulated_seconds": self.clock, **{f"clients_{k}": v for k, v in self.totals.items()}})
        return out

    def state(self) -> dict:
        return {"clock": self.clock, "totals": dict(self.totals),
                "codec": None if self.codec is None else self.codec.state(),
                **({} if self.server is None else {"asynchronous": self.server.state()})}

    def load_state(self, state: dict, device) -> None:
        self.clock = float(state["clock"])
        self.totals = {k: int(v) for k, v in state["totals"].items()}
        if self.codec is not None:
            self.codec.load_state(state["codec"] or {}, device)
        if self.server is not None:
            self.server.load_state(state["asynchronous"], device)


@dataclass(frozen=True)
class RoundPlan:
    """A round's conditions over its selected ``cohort`` (c,): ``kept`` the clients the server aggregates,
    ``left`` those that left mid-round, ``late`` those past the deadline, ``steps`` their planned local steps and
    ``done_steps`` the steps each finished, and the round's simulated ``duration``."""

    cohort: Any
    kept: np.ndarray
    left: np.ndarray
    late: np.ndarray
    steps: np.ndarray
    done_steps: np.ndarray
    duration: float


class _Floats:
    def __init__(self, n: int) -> None:
        self.n = int(n)

    def numel(self) -> int:
        return self.n


def _condition_files(cfg) -> list[str]:
    files = [cfg.availability_trace] if cfg.availability_trace else []
    return files + [parse_speed(spec, name)[1] for name, spec in (("compute_speed", cfg.compute_speed),
                                                                  ("network_speed", cfg.network_speed))
                    if parse_speed(spec, name)[0] == "file"]


def _sha256(path: str) -> str:
    import hashlib
    from pathlib import Path

    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def _model_floats(alg) -> int:
    """Floats of one model upload (half of what a client exchanges a round, ``floats_per_client_round``)."""
    return max(int(alg.floats_per_client_round(alg.arch)) // 2, 1)


def _planned_steps(alg, cohort) -> np.ndarray:
    """tau_i: the local steps each cohort client would take this round (the round's schedule: ``local_epochs``
    epochs of its data, else ``local_steps``; 1 for an algorithm whose config counts neither)."""
    cfg = alg.cfg
    epochs = getattr(cfg, "local_epochs", None)
    if epochs:
        return alg.epoch_steps(cohort, int(epochs))[1].sum(1).cpu().numpy().astype(np.int64)
    return np.full(len(cohort), int(getattr(cfg, "local_steps", 1)), dtype=np.int64)
