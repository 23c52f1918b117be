"""Asynchronous aggregation (issue 47, item 2): FedBuff's buffer step and FedAsync's mixing against slow, obviously
correct references, and both end to end through the CLI.

The engine (:mod:`pfl_cli.fl.asynchronous`) trains jobs lazily, several in one batched call; the reference here is
an event-driven simulation that trains every job eagerly, at its dispatch, from the model the server holds then, on
a quadratic (client i's job: two gradient steps of size 0.3 on 1/2 ||x - c_i||^2, plus FedAsync's regularizer
rho/2 ||x - x_tau||^2 around the model x_tau it downloaded), in float64 numpy; FedBuff's server step with its
server learning rate and heavy-ball momentum by hand.
"""

from __future__ import annotations

import heapq
import json
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from pfl_cli.algorithms.fedasync import FedAsync, mixed
from pfl_cli.algorithms.fedbuff import buffered_step
from pfl_cli.fl.asynchronous import AsyncServer, staleness_weight
from pfl_cli.fl.communication import Traffic
from pfl_cli.rng import make_rng

N, DIM = 7, 3
STEP = 0.3  # the fake local solver's step size (two steps a job)
OPTIMA = np.arange(N * DIM, dtype=np.float64).reshape(N, DIM) / 10.0
SPEED = np.array([1.0, 0.3, 2.0, 0.7, 5.0, 0.25, 1.3])


class Quadratic:
    """A fake algorithm on a quadratic: a job moves x half-way to its client's optimum (no data, no draws)."""

    name = "quad"

    upload_codec = None
    job_objective = FedAsync.job_objective  # FedAsync's: rho around each job's own start model (none at rho = 0)

    def __init__(self, mixes: bool, k: int, concurrency: int, dropout: float = 0.0, deadline=None, alpha=0.6,
                 rho=0.0, server_lr=1.0, server_momentum=0.0):
        self.mixes_each_arrival = mixes
        self.cfg = SimpleNamespace(seed=3, concurrency=concurrency, dropout=dropout, round_deadline=deadline,
                                   local_steps=2, server_lr=server_lr, server_momentum=server_momentum, alpha=alpha,
                                   rho=rho)
        self.buf = {}
        self.k = k
        self.store = SimpleNamespace(labeled=np.ones(N, dtype=bool))
        self.device = torch.device("cpu")
        self.traffic = Traffic()
        self.x = {"w": torch.zeros(DIM, dtype=torch.float64)}
        self.calls = []

    def arrivals_per_round(self):
        return self.k

    def server_model(self):
        return {k: v.clone() for k, v in self.x.items()}

    def round_schedule(self):
        return {"steps": 2}

    def cohort_sgd(self, start, clients, gen, steps, prox_mu=0.0, prox_anchors=None):
        self.calls.append(len(clients))
        target = torch.as_tensor(OPTIMA[clients.numpy()])
        x = start["w"].clone()
        for _ in range(steps):
            grad = x - target
            if prox_mu:
                grad = grad + prox_mu * (x - prox_anchors["w"])
            x = x - STEP * grad
        return {"w": x}, torch.zeros(len(clients)), 0

    def uploads(self, start, theta):
        return {k: theta[k] - start[k] for k in start} if not self.mixes_each_arrival else dict(theta)

    def buffer_step(self, deltas, stale):
        self.x, self.buf = buffered_step(self.x, deltas, stale, server_lr=self.cfg.server_lr,
                                         server_momentum=self.cfg.server_momentum, buf=self.buf)

    def mix(self, model, stale):
        self.x = mixed(self.x, model, self.cfg.alpha * float(staleness_weight(np.array([stale]))[0]))


def engine_run(alg, rounds: int):
    cond = SimpleNamespace(clock=0.0, totals={"selected": 0, "answered": 0, "left": 0, "late_dropped": 0},
                           job_seconds=lambda alg, clients: alg.cfg.local_steps / SPEED[clients],
                           sent_unanswered=lambda alg, copies: None)
    server = AsyncServer(alg, cond)
    clock = []
    for t in range(rounds):
        server.run_round(alg, t, torch.arange(N), torch.Generator().manual_seed(t))
        clock.append(cond.clock)
    return alg.x["w"].numpy(), clock, server, cond


def local_job(x_tau, c, rho):
    """A job's two local steps on 1/2 ||x - c||^2 + rho/2 ||x - x_tau||^2 from x_tau (Xie et al. 2019, Alg. 1)."""
    x = x_tau.copy()
    for _ in range(2):
        x = x - STEP * ((x - c) + rho * (x - x_tau))
    return x


def reference_run(mixes: bool, k: int, concurrency: int, rounds: int, dropout=0.0, deadline=None, alpha=0.6,
                  rho=0.0, server_lr=1.0, server_momentum=0.0, compress=None):
    """The slow reference: a heap of (finish, seq) events; each job trained at its dispatch; s(tau) by hand;
    ``compress``: what the server decodes of a job's delta from the model it downloaded."""
    x, version, seq, now = np.zeros(DIM), 0, 0, 0.0
    m = np.zeros(DIM)                                                  # FedBuff's server momentum
    heap, busy, clock = [], set(), []

    def dispatch(rng, count):
        nonlocal seq
        idle = np.array([c for c in range(N) if c not in busy], dtype=np.int64)
        count = min(count, len(idle))
        chosen = idle[rng.permutation(len(idle))[:count]]
        left = rng.random(count) < dropout
        for i, c in enumerate(chosen):
            duration = 2 / SPEED[c]
            late = deadline is not None and duration > deadline
            finish = now + (deadline if (late and not left[i]) else duration)
            trained = local_job(x, OPTIMA[c], rho)                   # the job, trained from the model it downloaded
            if compress is not None:
                trained = x + compress(trained - x)
            heapq.heappush(heap, (finish, seq, int(c), version, "left" if left[i] else "late" if late else "ok",
                                  trained - x if not mixes else trained))
            busy.add(int(c))
            seq += 1

    for t in range(rounds):
        rng = make_rng(3, f"async-{t}")
        if t == 0:
            dispatch(rng, concurrency)
        buffer, got = np.zeros(DIM), 0
        while got < k:
            finish, _, c, start_version, outcome, update = heapq.heappop(heap)
            now = max(now, finish)
            busy.discard(c)
            if outcome == "ok":
                got += 1
                stale = version - start_version
                if mixes:                                             # Xie et al. Alg. 1, polynomial a = 0.5
                    a_t = alpha * (stale + 1) ** -0.5
                    x = (1 - a_t) * x + a_t * update
                    version += 1
                else:                                                 # Nguyen et al. Alg. 1, s = 1/sqrt(1 + tau)
                    buffer += update / np.sqrt(1 + stale)
            dispatch(rng, 1)
        if not mixes:                                                 # Alg. 1's server step: SGD, heavy ball
            m = server_momentum * m + buffer / k
            x = x + server_lr * m
            version += 1
        clock.append(now)
    return x, clock


@pytest.mark.parametrize("k,concurrency,dropout,deadline", [(3, 5, 0.0, None), (2, 7, 0.3, None),
                                                            (4, 3, 0.2, 5.0)])
def test_fedbuff_buffer_steps_match_the_event_driven_reference(k, concurrency, dropout, deadline):
    x, clock, _, cond = engine_run(Quadratic(False, k, concurrency, dropout, deadline), rounds=6)
    want, want_clock = reference_run(False, k, concurrency, 6, dropout, deadline)
    np.testing.assert_allclose(x, want, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(clock, want_clock, rtol=1e-12)
    assert cond.totals["answered"] == 6 * k
    if dropout:
        assert cond.totals["left"] > 0


@pytest.mark.parametrize("server_lr,server_momentum", [(0.7, 0.9), (2.0, 0.5)])
def test_fedbuff_server_lr_and_momentum_match_the_event_driven_reference(server_lr, server_momentum):
    alg = Quadratic(False, 3, 5, 0.2, server_lr=server_lr, server_momentum=server_momentum)
    x, _, _, _ = engine_run(alg, rounds=6)
    want, _ = reference_run(False, 3, 5, 6, 0.2, server_lr=server_lr, server_momentum=server_momentum)
    np.testing.assert_allclose(x, want, rtol=1e-12, atol=1e-12)
    plain, _ = reference_run(False, 3, 5, 6, 0.2, server_lr=server_lr)
    assert np.abs(want - plain).max() > 1e-3  # the momentum moves the weights the test watches


@pytest.mark.parametrize("k,concurrency,dropout,rho", [(1, 4, 0.0, 0.0), (3, 6, 0.25, 0.0), (1, 4, 0.0, 2.0),
                                                       (3, 6, 0.25, 0.7)])
def test_fedasync_mixing_matches_the_event_driven_reference(k, concurrency, dropout, rho):
    alg = Quadratic(True, k, concurrency, dropout, rho=rho)
    x, clock, _, _ = engine_run(alg, rounds=8)
    want, want_clock = reference_run(True, k, concurrency, 8, dropout, rho=rho)
    np.testing.assert_allclose(x, want, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(clock, want_clock, rtol=1e-12)
    if rho:  # the regularizer moves the weights the test watches
        assert np.abs(want - reference_run(True, k, concurrency, 8, dropout)[0]).max() > 1e-3


def test_per_job_anchors_equal_one_run_per_job(store):
    """cohort_sgd's ``prox_anchors`` (one anchor a row, FedAsync's jobs) equals each client run alone around its own
    anchor (FedProx's single ``prox_anchor``), on the digits net: the rows' anchors are not mixed, nor moved by the
    steps (they alias the start models in the engine)."""
    from baseline_support import alg_factory
    from pflx_testing import small_config

    # batches of a whole client (full-batch steps): a client's steps do not depend on the draws of the cohort
    alg = alg_factory(small_config(algorithm="fedasync", mlp_hidden=(8,), local_steps=3, batch_size=4096, lr=0.1,
                                   clients_per_round=2, rho=0.5))(store)
    g = torch.Generator().manual_seed(0)
    start = {k: v.unsqueeze(0) + 0.3 * torch.randn(3, *v.shape, generator=g) for k, v in alg.global_params.items()}
    clients = torch.as_tensor(store.clients(0)[:3])
    both, _, _ = alg.cohort_sgd(start, clients, torch.Generator().manual_seed(5), steps=3,
                                **alg.job_objective(start))
    plain, _, _ = alg.cohort_sgd(start, clients, torch.Generator().manual_seed(5), steps=3)
    for r in range(3):
        one = {k: v[r:r + 1].clone() for k, v in start.items()}
        alone, _, _ = alg.cohort_sgd(one, clients[r:r + 1], torch.Generator().manual_seed(5), steps=3,
                                     prox_mu=0.5, prox_anchor={k: v[0] for k, v in one.items()})
        for k in start:
            torch.testing.assert_close(both[k][r], alone[k][0], rtol=1e-5, atol=1e-6)
    assert max(float((both[k] - plain[k]).abs().max()) for k in start) > 1e-4


def test_fedbuff_trains_a_rounds_jobs_in_one_batched_call():
    """FedBuff's jobs of a round start from one model: the first round trains concurrency + K jobs at once, each
    later round the K that replaced the arrivals, one call each."""
    alg = Quadratic(False, 3, 5)
    engine_run(alg, rounds=4)
    assert alg.calls == [5 + 3, 3, 3, 3]


def test_staleness_weights_and_the_two_server_rules_by_hand():
    assert staleness_weight(np.array([0, 3, 8])).tolist() == [1.0, 0.5, 1 / 3]
    assert staleness_weight(np.array([3]), "constant").tolist() == [1.0]
    assert staleness_weight(np.array([4, 5, 9]), "hinge", a=10, b=4).tolist() == [1.0, 1 / 11, 1 / 51]
    x = {"w": torch.tensor([1.0, 2.0])}
    # FedBuff: x + eta_g / K (s(0) d1 + s(3) d2) = [1, 2] + 2 / 2 ([1, 1] + 0.5 [2, -4])
    deltas = [{"w": torch.tensor([1.0, 1.0])}, {"w": torch.tensor([2.0, -4.0])}]
    step, buf = buffered_step(x, deltas, np.array([0, 3]), server_lr=2.0)
    assert step["w"].tolist() == [3.0, 1.0]
    # Dbar = (1/2) ([1, 1] + 0.5 [2, -4]) = [1, -0.5]; with momentum 0.5 and an earlier m = [1, -1]:
    # m = 0.5 m + Dbar = [1.5, -1], x + 2 m = [4, 0]
    step, buf = buffered_step(x, deltas, np.array([0, 3]), server_lr=2.0, server_momentum=0.5,
                              buf={"w": torch.tensor([1.0, -1.0])})
    assert buf["w"].tolist() == [1.5, -1.0] and step["w"].tolist() == [4.0, 0.0]
    # FedAsync: alpha_t = 0.6 s(3) = 0.3: 0.7 x + 0.3 x_new
    assert torch.allclose(mixed(x, {"w": torch.tensor([3.0, 0.0])}, 0.6 * 0.5)["w"], torch.tensor([1.6, 1.4]))


def test_the_checkpoint_holds_every_in_flight_job():
    """After a round the in-flight jobs are in the state: a server restored from it continues as the first."""
    alg = Quadratic(False, 2, 5, 0.2)
    _, _, server, cond = engine_run(alg, rounds=3)
    state = server.state()
    assert len(state["jobs"]) == 5 and all(j["upload"] is not None or j["outcome"] != 0 for j in state["jobs"])
    clone = AsyncServer(alg, cond)
    clone.load_state(state, torch.device("cpu"))
    for a, b in zip(clone.jobs, server.jobs):
        assert {k: v for k, v in a.items() if k not in ("upload", "start")} == \
               {k: v for k, v in b.items() if k not in ("upload", "start")}


@pytest.fixture(scope="module")
def part(tmp_path_factory):
    from pfl_cli.cli.app import main

    root = tmp_path_factory.mktemp("async")
    assert main(["partition", "--dataset", "builtin:digits", "--dirichlet", "0.5", "--num-clients", "8",
                 "--holdout-clients", "2", "--out", str(root / "part"), "--format", "quiet"]) == 0
    return root / "part"


@pytest.mark.parametrize("name", ["fedbuff", "fedasync"])
def test_train_and_predict_end_to_end(part, name, cli, tmp_path):
    run = cli("train", "--partition", part, "--algorithm", name, "--rounds", "4", "--eval-every", "2",
              "--local-steps", "3", "--clients-per-round", "2", "--set", "concurrency=4", "--set", "mlp_hidden=[8]",
              "--set", "compute_speed=lognormal:1:1.5", "--dropout", "0.2", "--out", tmp_path / "run",
              "--format", "quiet")
    assert run.code == 0, run.err
    metrics = json.loads((tmp_path / "run" / "metrics.json").read_text())
    assert metrics["conditions"]["asynchronous"] is True and metrics["conditions"]["clients_answered"] == 8
    rows = (tmp_path / "run" / "metrics.csv").read_text().splitlines()
    clock = [float(r.split(",")[-1]) for r in rows if ",sim_seconds," in r]
    assert len(clock) == 2 and 0 < clock[0] < clock[1]
    pred = cli("predict", "--model", tmp_path / "run", "--partition", part, "--clients", "holdout",
               "--out", tmp_path / "pred", "--format", "quiet")
    assert pred.code == 0, pred.err
    assert 0 <= json.loads((tmp_path / "pred" / "metrics.json").read_text())["mean_accuracy"] <= 1


@pytest.mark.parametrize("args,words", [
    (["--algorithm", "fedbuff", "--set", "concurrency=0"], "concurrency must be an integer >= 1"),
    (["--algorithm", "fedbuff", "--set", "over_selection=0.5"], "aggregates updates as they arrive"),
    (["--algorithm", "fedasync", "--set", "alpha=0"], "alpha must be"),
    (["--algorithm", "fedasync", "--set", "staleness=linear"], "staleness must be one of"),
    (["--algorithm", "fedasync", "--set", "staleness=constant", "--set", "staleness_a=2"], "no effect"),
])
def test_bad_input_one_line_exit_2(part, cli, tmp_path, args, words):
    run = cli("train", "--partition", part, *args, "--rounds", "2", "--out", tmp_path / "bad")
    assert run.code == 2 and words in run.err and len(run.err.strip().splitlines()) == 1, (run.code, run.err)
    assert not (tmp_path / "bad").exists()


def test_resume_after_a_kill_is_byte_identical(part, monkeypatch, tmp_path):
    """Killed right after its first checkpoint, with jobs in flight (some stale, some leaving), a FedBuff run resumed
    from it writes the bytes of the uninterrupted run."""
    from pfl_cli import formats
    from pfl_cli.cli.app import main

    def train(out, *extra):
        return main(["train", "--partition", str(part), "--algorithm", "fedbuff", "--rounds", "4", "--eval-every", "2",
                     "--local-steps", "3", "--clients-per-round", "2", "--set", "concurrency=5", "--set",
                     "mlp_hidden=[8]", "--set", "compute_speed=lognormal:1:1.5", "--dropout", "0.2", "--out", str(out),
                     "--format", "quiet", *extra])

    assert train(tmp_path / "whole") == 0
    real, rounds = formats.write_atomic, []

    def write_then_die(path, data_):
        real(path, data_)
        if "checkpoint" in str(path):
            rounds.append(int(torch.load(path, weights_only=True)["round"]))
            raise KeyboardInterrupt

    monkeypatch.setattr(formats, "write_atomic", write_then_die)
    code = train(tmp_path / "killed")
    monkeypatch.setattr(formats, "write_atomic", real)
    assert code == 130 and rounds == [2]
    assert train(tmp_path / "killed", "--resume") == 0
    for file in ("model.pt", "metrics.json", "metrics.csv", "clients.csv"):
        if (tmp_path / "whole" / file).is_file():
            assert (tmp_path / "killed" / file).read_bytes() == (tmp_path / "whole" / file).read_bytes(), file


def topk_rows(u: np.ndarray, k: int) -> np.ndarray:
    """Each row's k largest-magnitude coordinates kept, the rest zero: a plain per-row sort."""
    out = np.zeros_like(u)
    for r, row in enumerate(u):
        keep = sorted(range(len(row)), key=lambda j: -abs(row[j]))[:k]
        out[r, keep] = row[keep]
    return out


@pytest.mark.parametrize("mixes", [False, True])
def test_compressed_uploads_are_each_jobs_delta_from_its_own_download(mixes):
    """Top-k of each job's delta from the model it downloaded (jobs start from different versions): FedBuff's buffer
    and FedAsync's mixing of the decoded uploads against the reference with the top-k taken by hand."""
    from pfl_cli.fl.compression import UploadCodec

    alg = Quadratic(mixes, 3, 5, 0.2)
    alg.upload_codec = UploadCodec("topk", density=0.5, levels=16, error_feedback=False, num_clients=N, seed=3)
    x, _, _, _ = engine_run(alg, rounds=6)
    want, _ = reference_run(mixes, 3, 5, 6, 0.2, compress=lambda u: topk_rows(u[None], 2)[0])
    np.testing.assert_allclose(x, want, rtol=1e-12, atol=1e-12)
    assert np.abs(want - reference_run(mixes, 3, 5, 6, 0.2)[0]).max() > 1e-3
