"""Asynchronous aggregation on the simulated clock (issue 47, item 2): FedBuff's and FedAsync's server.

``concurrency`` clients train at once. Each starts from the model version it downloaded; its job lasts
``T_i = (B_down + B_up) / net_i + tau_i / speed_i`` simulated seconds (the federation conditions' per-client speeds,
:mod:`pfl_cli.fl.conditions.rounds`), and the server, at each arrival, takes the update and at once sends the model
it holds then to a new client drawn uniformly from the idle train clients, so that ``concurrency`` jobs are always
in flight (Nguyen et al., AISTATS 2022, Alg. 1; Xie et al. 2019, Alg. 1: "the scheduler triggers new workers").

A pflx "round" is ``clients_per_round`` arrivals. An algorithm that mixes every arrival into the model at once
(``mixes_each_arrival``: FedAsync) takes a server step per arrival; otherwise (FedBuff) the round's arrivals are its
buffer and the round ends with one server step on them. The simulated clock advances to each arrival; the round's
``round_sim_seconds`` is the time between its first and last event.

Training is batched: a job's update depends only on its client, its start model and its batches, so jobs are
trained lazily, all untrained jobs in one cohort call (:meth:`Algorithm.cohort_sgd` over their stacked start
models), when an arriving update is needed (FedAsync) and at the end of every round (every run does the same, so a
resumed run draws what the uninterrupted one drew). FedBuff's jobs of a round all start from the round's model:
one batched call a round, like a synchronous round of FedAvg.

Conditions: ``dropout`` (a job whose client leaves never answers: the server notices at its would-be arrival and
dispatches another client) and ``round_deadline`` (a job's timeout: a job longer than D is abandoned D seconds after
its dispatch). Availability and over-selection are round concepts; an asynchronous algorithm refuses them
(:func:`pfl_cli.fl.conditions.settings.check_conditions`).

Every draw comes from the run's seeded streams: a round's dispatches and dropouts from ``async-{t}`` (numpy), its
batches from the round's generator. The in-flight jobs (client, start version, finish time, outcome, pending
update) are in the checkpoint (:meth:`AsyncServer.state`), so ``--resume`` after a kill gives the bytes of the
uninterrupted run.
"""

from __future__ import annotations

import numpy as np

from pfl_cli.errors import RunError
from pfl_cli.fl.global_model import OneGlobalModel
from pfl_cli.rng import make_rng

ARRIVES, LEFT, LATE = 0, 1, 2
STALENESS = ("constant", "polynomial", "hinge")


class GlobalModelOnTheClock(OneGlobalModel):
    """What FedBuff and FedAsync share beside :class:`AsyncServer`: one global model that every job downloads
    (``server_model``), ``clients_per_round`` arrivals a pflx round, and FedAvg's new-client protocol
    (:class:`~pfl_cli.fl.global_model.OneGlobalModel`: the global model, or it fine-tuned ``finetune_steps`` local
    steps). The server rule stays each method's."""

    def arrivals_per_round(self) -> int:
        return int(self.cfg.clients_per_round)

    def server_model(self) -> dict:
        """A copy of the model a client downloads now."""
        return {k: v.detach().clone() for k, v in self.global_params.items()}

    def job_objective(self, start: dict) -> dict:
        """Extra arguments of the jobs' local SGD, given their stacked start models (none: plain local SGD)."""
        return {}


def staleness_weight(tau, kind: str = "polynomial", a: float = 0.5, b: float = 0.0):
    """s(tau) of updates ``tau`` (array) versions stale.

    constant: 1; polynomial: (1 + tau)^-a (FedBuff §3: a = 1/2, s = 1/sqrt(1 + tau); FedAsync §5.2 Eq. s_a);
    hinge: 1 when tau <= b, else 1 / (a (tau - b) + 1) (FedAsync §5.2, s_{a,b}).

    >>> staleness_weight(np.array([0, 3]))
    array([1. , 0.5])
    >>> staleness_weight(np.array([2, 6]), "hinge", a=10, b=4)
    array([1.        , 0.04761905])
    """
    tau = np.asarray(tau, dtype=np.float64)
    if kind == "constant":
        return np.ones_like(tau)
    if kind == "polynomial":
        return (1.0 + tau) ** (-float(a))
    if kind == "hinge":
        return np.where(tau <= b, 1.0, 1.0 / (float(a) * (tau - b) + 1.0))
    raise ValueError(f"staleness must be one of {', '.join(STALENESS)}; got {kind!r}")


class AsyncServer:
    """The in-flight jobs and the server's version counter of an asynchronous run, driven by its
    :class:`~pfl_cli.fl.conditions.rounds.Conditions` (its clock, speeds and totals)."""

    def __init__(self, alg, conditions) -> None:
        self.cond = conditions
        self.version = 0       # server steps taken
        self.dispatched = 0    # jobs dispatched so far (their order breaks ties in finish time)
        self.started = False
        self.jobs: list[dict] = []  # in flight: client, version, finish, outcome, seq, start (untrained) / upload

    # ---------------------------------------------------------------- one round
    def run_round(self, alg, t: int, train_clients, gen):
        """``clients_per_round`` arrivals (and the server steps they make): returns the answering clients (in
        arrival order), the losses of the jobs trained this round, and the round's metrics rows."""
        import torch

        cond = self.cond
        rng = make_rng(alg.cfg.seed, f"async-{t}")
        pool = train_clients[torch.as_tensor(alg.store.labeled, device=train_clients.device)[train_clients]]
        pool = pool.cpu().numpy()
        concurrency = min(int(alg.cfg.concurrency), len(pool))
        begin = cond.clock
        counts = {"selected": 0, "answered": 0, "left": 0, "late_dropped": 0}
        losses: list = []
        if not self.started:
            counts["selected"] += self._dispatch(alg, rng, pool, concurrency)
            self.started = True
        wanted = int(alg.arrivals_per_round())
        arrived: list[dict] = []
        events, limit = 0, 1000 * (wanted + concurrency)
        while len(arrived) < wanted:
            events += 1
            if events > limit:
                raise RunError(f"asynchronous {alg.name}: {limit} jobs in a row answered nothing (dropout "
                               f"{alg.cfg.dropout}, round_deadline {alg.cfg.round_deadline}); lower dropout or raise "
                               "round_deadline.")
            job = min(self.jobs, key=lambda j: (j["finish"], j["seq"]))
            if alg.mixes_each_arrival and job["outcome"] == ARRIVES and job["upload"] is None:
                losses.append(self._train(alg, gen))  # its update is needed now: train every waiting job
            self.jobs.remove(job)
            cond.clock = max(cond.clock, job["finish"])
            if job["outcome"] == LEFT:
                counts["left"] += 1
            elif job["outcome"] == LATE:
                counts["late_dropped"] += 1
            else:
                counts["answered"] += 1
                arrived.append(job)
                if alg.mixes_each_arrival:
                    alg.mix(job["upload"], int(self.version - job["version"]))
                    self.version += 1
            counts["selected"] += self._dispatch(alg, rng, pool, 1)
        # every job dispatched this round, trained now: the checkpoint holds updates only
        losses.append(self._train(alg, gen, arrived))
        self._received(alg, arrived)
        if not alg.mixes_each_arrival:
            alg.buffer_step([j["upload"] for j in arrived],
                            np.array([self.version - j["version"] for j in arrived], dtype=np.int64))
            self.version += 1
        for k, v in counts.items():
            cond.totals[k] += v
        not_answered = counts["left"] + counts["late_dropped"]
        if not_answered:
            cond.sent_unanswered(alg, not_answered)
        alg.traffic.close_round(len(arrived))
        duration = cond.clock - begin
        answering = torch.as_tensor([j["client"] for j in arrived], dtype=torch.int64, device=alg.device)
        loss = torch.cat([v for v in losses if v is not None]) if any(v is not None for v in losses) \
            else torch.zeros(0)
        rows = [[t + 1, "train", "round_sim_seconds", duration], [t + 1, "train", "clients_answered", len(arrived)]]
        return answering, loss, rows

    @staticmethod
    def _received(alg, arrived: list) -> None:
        """The round's arrived updates on the wire: each job's upload, counted in the round it reached the server
        (a job trained early, in flight at a round's end, is counted when it arrives)."""
        if not arrived:
            return
        codec = alg.upload_codec
        if codec is not None:
            codec.receive(alg, sum(v.numel() for v in arrived[0]["upload"].values()), len(arrived))
            return
        for j in arrived:
            for k, v in j["upload"].items():
                alg.traffic.receive(k, v)

    def _dispatch(self, alg, rng, pool: np.ndarray, count: int) -> int:
        """Send the server's current model to ``count`` idle clients drawn uniformly (one job each)."""
        busy = {j["client"] for j in self.jobs}
        idle = np.array([c for c in pool if int(c) not in busy], dtype=np.int64)
        count = min(count, len(idle))
        if count == 0:
            return 0
        clients = idle[rng.permutation(len(idle))[:count]]
        left = rng.random(count) < float(alg.cfg.dropout)
        cond = self.cond
        duration = cond.job_seconds(alg, clients)
        deadline = alg.cfg.round_deadline
        start = alg.server_model()
        for i, c in enumerate(clients):
            late = deadline is not None and duration[i] > deadline
            outcome = LEFT if left[i] else LATE if late else ARRIVES
            finish = cond.clock + (float(deadline) if outcome == LATE else float(duration[i]))
            self.jobs.append({"client": int(c), "version": int(self.version), "finish": finish, "outcome": outcome,
                              "seq": self.dispatched, "upload": None,
                              "start": start if outcome == ARRIVES else None})
            self.dispatched += 1
        return count

    def _train(self, alg, gen, also=()):
        """Train every untrained job in one cohort call from its start model; returns their losses (or None)."""
        import torch

        todo = [j for j in [*also, *self.jobs] if j["outcome"] == ARRIVES and j["upload"] is None]
        if not todo:
            return None
        clients = torch.as_tensor([j["client"] for j in todo], dtype=torch.int64, device=alg.device)
        start = {k: torch.stack([j["start"][k] for j in todo]) for k in todo[0]["start"]}
        theta, loss, _ = alg.cohort_sgd(start, clients, gen, **alg.round_schedule(), **alg.job_objective(start))
        if alg.upload_codec is not None:  # each job's delta from its own download, compressed (pfl_cli.fl.compression)
            theta = alg.upload_codec.compress_models(alg, clients, start, theta, stacked=True, record=False)
        for k, v in start.items():
            alg.traffic.send(k, v[0], copies=len(todo))     # the model each job downloaded
        uploads = alg.uploads(start, theta)                 # received when each job arrives (_received)
        for i, j in enumerate(todo):
            j["upload"] = {k: v[i].clone() for k, v in uploads.items()}
            j["start"] = None
        return loss

    # ---------------------------------------------------------------- checkpoint
    def state(self) -> dict:
        return {"version": self.version, "dispatched": self.dispatched, "started": self.started,
                "jobs": [{k: (None if v is None else {n: t.detach().clone() for n, t in v.items()})
                          if k in ("upload", "start") else v for k, v in j.items()} for j in self.jobs]}

    def load_state(self, state: dict, device) -> None:
        self.version, self.dispatched = int(state["version"]), int(state["dispatched"])
        self.started = bool(state["started"])
        self.jobs = [{k: (None if v is None else {n: t.to(device) for n, t in v.items()})
                      if k in ("upload", "start") else v for k, v in j.items()} for j in state["jobs"]]
        for j in self.jobs:
            j["client"], j["version"], j["seq"], j["outcome"] = (int(j["client"]), int(j["version"]), int(j["seq"]),
                                                                  int(j["outcome"]))
            j["finish"] = float(j["finish"])
