"""Federation conditions (issue 47): the round planner against a per-client reference, partial work through the
cohort's step mask, the compressors and their error feedback, bytes as sent, the DP denominator, the refusals."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from pflx_testing import small_config

from pfl_cli import registry
from pfl_cli.errors import ConfigError, PflxError
from pfl_cli.fl.compression import UploadCodec, compress, topk_count, wire_bytes
from pfl_cli.fl.conditions.rounds import Conditions, cap_steps
from pfl_cli.rng import make_rng

BASE = dict(mlp_hidden=(8,), batch_size=8, rounds=2, eval_every=1, local_steps=6, clients_per_round=6)


@pytest.fixture(scope="module")
def store(digits_clients):
    from pfl_cli.fl.store import build_store

    ds, part = digits_clients
    return build_store(ds.x, ds.y, ds.num_classes, part, val_fraction=0.0, rng=make_rng(0, "validation-split"),
                       device="cpu")


def algorithm(store, name, **keys):
    from pfl_cli.fl.api import make_algorithm

    cfg = small_config(algorithm=name, **{**BASE, **keys})
    cfg.validate()
    return make_algorithm(cfg, store), cfg


def reference_plan(cond, cfg, t, cohort_ids, pool_size, size, partial):
    """The round's decisions one client at a time, from the same stream (its draws in the planner's order)."""
    rng = make_rng(cfg.seed, f"conditions-{t}")
    rng.random(pool_size)  # the availability draws
    out = []
    for i, cid in enumerate(cohort_ids):
        leaves = rng.random() < cfg.dropout
        transfer = (cond.down_bytes + cond.up_bytes) / 1e6 / cond.network[cid]
        full = transfer + cfg.local_steps / cond.compute[cid]
        steps, finish = cfg.local_steps, full
        if cfg.round_deadline is not None and full > cfg.round_deadline:
            if partial:
                steps = min(cfg.local_steps, int(math.floor((cfg.round_deadline - transfer) * cond.compute[cid])))
                finish = cfg.round_deadline
            else:
                steps = 0
        out.append({"answers": not leaves and steps > 0, "steps": steps, "finish": finish})
    answering = [i for i, o in enumerate(out) if o["answers"]]
    if cfg.over_selection and len(answering) > size:
        answering = sorted(sorted(answering, key=lambda i: (out[i]["finish"], i))[:size])
    return answering, [out[i]["steps"] for i in answering], out


@pytest.mark.parametrize("name, partial", [("fedavg", False), ("fedprox", True)])
@pytest.mark.parametrize("over", [0.0, 0.5])
def test_the_plan_is_the_per_client_reference(store, tmp_path, name, partial, over):
    speeds = tmp_path / "speeds.csv"
    speeds.write_text("\n".join(str(v) for v in np.linspace(1.0, 6.0, store.num_clients)))
    alg, cfg = algorithm(store, name, dropout=0.25, compute_speed=f"file:{speeds}", network_speed="uniform:0.5:2",
                         round_deadline=2.0, over_selection=over, clients_per_round=4)
    cond = Conditions(alg, cfg)
    assert alg.partial_work is partial
    train = torch.as_tensor(store.clients(0))
    for t in range(4):
        plan = cond.plan_round(alg, t, train, torch.Generator().manual_seed(t), cfg.rounds)
        ids = plan.cohort.numpy()
        assert len(ids) == math.ceil(4 * (1 + over))
        answering, steps, out = reference_plan(cond, cfg, t, ids, len(train), 4, partial)
        assert np.flatnonzero(plan.kept).tolist() == answering
        assert plan.done_steps[plan.kept].tolist() == steps
        if over and len(answering) == 4:
            assert plan.duration == max(out[i]["finish"] for i in answering)
        elif len(answering) < len(ids):
            assert plan.duration == 2.0  # someone never answered: the server waits for the deadline


def test_a_trace_says_who_is_online(store, tmp_path):
    n = store.num_clients
    trace = np.zeros((n, 2), dtype=int)
    trace[:6, 0] = 1
    trace[6:, 1] = 1
    path = tmp_path / "trace.csv"
    np.savetxt(path, trace, fmt="%d", delimiter=",")
    alg, cfg = algorithm(store, "fedavg", availability_trace=str(path), clients_per_round=3)
    cond = Conditions(alg, cfg)
    train = torch.as_tensor(store.clients(0))
    for t in range(4):
        plan = cond.plan_round(alg, t, train, torch.Generator().manual_seed(t), cfg.rounds)
        assert all(trace[i, t % 2] for i in plan.cohort.tolist()), (t, plan.cohort)
    # a column per simulated second: the clock at the round's start picks it (a diurnal trace of hours)
    alg, cfg = algorithm(store, "fedavg", availability_trace=str(path), trace_slot_seconds=1.0, clients_per_round=3)
    cond = Conditions(alg, cfg)
    for clock, column in ((0.0, 0), (1.5, 1), (2.2, 0), (0.99, 0)):
        cond.clock = clock
        plan = cond.plan_round(alg, 0, train, torch.Generator().manual_seed(0), cfg.rounds)
        assert all(trace[i, column] for i in plan.cohort.tolist()), (clock, plan.cohort)
    np.savetxt(path, trace[:-1], fmt="%d", delimiter=",")
    with pytest.raises(PflxError, match="one row per client of the partition"):
        Conditions(alg, cfg)


def test_partial_work_is_the_first_steps_through_the_step_mask(store):
    """A capped client takes exactly its budget's first steps of the cohort's one batched call (the reference: the
    real optimizer, one client at a time, skipping the masked steps)."""
    from pfl_cli.fl.batches import CohortBatches
    from pfl_cli.fl.cohort import local_sgd, local_sgd_reference

    alg, cfg = algorithm(store, "fedprox")
    clients = torch.as_tensor(store.clients(0)[:4])
    budget = torch.tensor([6, 2, 0, 5])
    batches = CohortBatches(store.fit, clients, 6, 8, torch.Generator().manual_seed(0))
    whole = CohortBatches(store.fit, clients, 6, 8, torch.Generator().manual_seed(0)).materialize()
    cap_steps(batches, budget)
    index, _, active = batches.materialize()
    assert active.sum(1).tolist() == budget.tolist() and bool((active[:, :1] | (budget[:, None] == 0)).all())
    assert torch.equal(index[0], whole[0][0]) and torch.equal(index[1, :2], whole[0][1, :2])
    start = {k: v.detach().clone().expand(4, *v.shape).clone() for k, v in alg.net.named_parameters()}
    opts = dict(lr=0.1, momentum=0.9, weight_decay=0.0, clip=0.0)
    got, _ = local_sgd(alg.net, start, store, batches, **opts)
    ref, _ = local_sgd_reference(alg.net, start, store, batches, **opts)
    for k in got:
        torch.testing.assert_close(got[k], ref[k], rtol=1e-5, atol=1e-6)
        assert torch.equal(got[k][2], start[k][2])  # no step: the model it started from


def test_fednova_normalizes_a_straggler_by_the_steps_it_took(store):
    """Under a budget, FedNova's ||a_i||_1 is that of the steps taken: its move equals the reference computed from
    the capped local models with tau_i = min(planned, budget) (Wang et al. 2020, Eq. 6-8)."""
    from pfl_cli.fl.nova import normalized_delta, solver_norm
    from pfl_cli.fl.params import broadcast

    alg, cfg = algorithm(store, "fednova", local_epochs=None, local_steps=6)
    cohort = torch.as_tensor(store.clients(0)[:3])
    budget = torch.tensor([6, 2, 4])
    start = {k: v.clone() for k, v in alg.global_params.items()}
    alg.round_budget = budget
    theta, _, taken = alg.cohort_sgd(broadcast(start, 3), cohort, torch.Generator().manual_seed(1), steps=6)
    assert taken == 12
    alg.run_round(0, cohort, torch.Generator().manual_seed(1))
    alg.round_budget = None
    size = store.fit.length[cohort].double()
    move = normalized_delta(start, theta, size / size.sum(), solver_norm(budget, cfg.momentum))
    for k in start:
        torch.testing.assert_close(alg.global_params[k], start[k] + move[k])


def test_topk_sign_and_qsgd_are_their_definitions():
    gen = torch.Generator().manual_seed(0)
    p = torch.randn(3, 50, generator=gen)
    sent = compress("topk", p, density=0.1)
    for row, orig in zip(sent, p):  # the 5 largest magnitudes, kept exactly; the rest zero
        keep = np.argsort(-orig.abs().numpy(), kind="stable")[:5]
        assert set(np.flatnonzero(row.numpy())) == set(keep) and torch.equal(row[keep], orig[keep])
    s = compress("sign", p)
    torch.testing.assert_close(s, p.abs().mean(1, keepdim=True) * torch.where(p >= 0, 1.0, -1.0))
    draws = compress("qsgd", p.repeat(4000, 1), levels=4, gen=gen).view(4000, 3, 50)
    norm = p.norm(dim=1, keepdim=True)
    levels = draws.abs() / norm * 4
    assert torch.allclose(levels, levels.round(), atol=1e-4) and float(levels.max()) <= 4 + 1e-4
    torch.testing.assert_close(draws.mean(0), p, atol=0.05, rtol=0)  # unbiased (Alistarh et al. 2017, Lemma 3.1)
    assert wire_bytes("topk", 50, density=0.1) == topk_count(50, 0.1) * 8 == 40


def test_error_feedback_sends_every_delta_eventually():
    """sum of what was sent + what is kept = sum of the deltas (Stich et al. 2018: nothing is lost, only delayed);
    the memory is per client: a client that does not upload keeps its own."""
    from pfl_cli.fl.communication import Traffic

    class Alg:
        traffic = Traffic()

    codec = UploadCodec("topk", density=0.2, levels=16, error_feedback=True, num_clients=5, seed=0)
    gen = torch.Generator().manual_seed(0)
    zero = {"w": torch.zeros(4, 5)}
    total_delta, total_sent = torch.zeros(5, 20), torch.zeros(5, 20)
    for t in range(6):
        cohort = torch.tensor([0, 1, 3]) if t % 2 else torch.tensor([0, 2])
        theta = {"w": torch.randn(len(cohort), 4, 5, generator=gen)}
        before = codec.memory[4].clone() if codec.memory is not None else None
        codec.begin_round(t)
        got = codec.compress_models(Alg, cohort, zero, theta)
        total_delta[cohort] += theta["w"].reshape(len(cohort), -1)
        total_sent[cohort] += got["w"].reshape(len(cohort), -1)
        assert int((got["w"].reshape(len(cohort), -1) != 0).sum(1).max()) <= 4
        if before is not None:
            assert torch.equal(codec.memory[4], before)
    torch.testing.assert_close(total_sent + codec.memory, total_delta)
    up = Alg.traffic.summary()
    assert Alg.traffic.up_bytes == {"delta (topk)": 15 * 4 * 8}  # 15 uploads of 4 values + 4 indices
    assert up["total_bytes"] == 15 * 32 + 4 * 15 * 20  # the model down as float32, the compressed deltas up


def test_compressed_run_counts_bytes_and_resumes_the_memory(digits_clients):
    from pfl_cli.fl import train_federated

    ds, part = digits_clients
    cfg = small_config(algorithm="fedavg", compression="sign", dropout=0.3, rounds=4, eval_every=2,
                       **{k: v for k, v in BASE.items() if k not in ("rounds", "eval_every")})
    saved = []
    whole = train_federated(ds.x, ds.y, ds.num_classes, part, cfg, device="cpu", on_checkpoint=saved.append)
    comm = whole.algorithm.traffic.summary()
    d = sum(v.numel() for v in whole.algorithm.global_params.values())
    assert comm["bytes_up_per_client_round"] == math.ceil(d / 8) + 4
    again = train_federated(ds.x, ds.y, ds.num_classes, part, cfg, device="cpu", resume=saved[0])
    assert again.outcome.history == whole.outcome.history
    assert torch.equal(again.algorithm.upload_codec.memory, whole.algorithm.upload_codec.memory)
    for k, v in whole.model["weights"]["client"].items():
        assert torch.equal(again.model["weights"]["client"][k], v)


def test_dp_fedavg_divides_by_the_expected_answering_cohort(store):
    import dataclasses

    from pfl_cli.fl.dp import ClientLevelDP

    alg, cfg = algorithm(store, "fedavg", dropout=0.5, availability=0.8)
    alg.dp = ClientLevelDP(4.0, 1e-6, 1.0, 0.05, 100, 2, 1.3, denominator=5.0)  # as calibrate_client_dp makes it
    Conditions(alg, cfg)
    assert alg.dp.answer_rate == pytest.approx(0.4)
    assert "expected answer rate 0.4" in alg.dp.note()
    assert alg.dp.info()["answering_denominator"] == pytest.approx(2.0)
    assert alg.dp.info()["noise_std_on_mean"] == pytest.approx(1.3 / 2.0)
    mech = dataclasses.replace(ClientLevelDP(1.0, 1e-6, 10.0, 0.1, 100, 1, 0.0, denominator=10.0), answer_rate=0.5)
    out = mech.private_mean({"u": torch.ones(3, 2)}, torch.Generator().manual_seed(0))
    torch.testing.assert_close(out["u"], torch.full((2,), 3 / 5))
    # the accounting keeps q: the same event as without dropouts
    assert alg.dp.event() == dataclasses.replace(alg.dp, answer_rate=1.0).event()


@pytest.mark.parametrize("keys, words", [
    ({"algorithm": "fedavg", "round_deadline": 1.0, "dp_epsilon": 4.0, "dp_clip": 1.0, "dp_population": 100,
      "normalize": False}, "under --dp"),
    ({"algorithm": "ditto", "compression": "topk"}, "does not upload a model delta"),
    ({"algorithm": "local", "dropout": 0.2}, "cannot run under federation conditions"),
    ({"algorithm": "fedavg", "over_selection": 0.5, "clients_per_round": None}, "Set clients_per_round"),
    ({"algorithm": "fedavg", "availability": 0.0}, "availability must be in (0, 1]"),
    ({"algorithm": "fedavg", "compute_speed": "gamma:1:2"}, "compute_speed must be NUMBER"),
    ({"algorithm": "fedavg", "compression_density": 0.5}, "compression_density has no effect without"),
])
def test_impossible_conditions_are_refused_in_one_line(keys, words):
    with pytest.raises(ConfigError) as err:
        registry.train_config(**keys)
    assert words in str(err.value) and "\n" not in str(err.value)


def test_conditions_do_not_stack():
    from pfl_cli.fl.stack import check_stackable

    with pytest.raises(ConfigError, match="federation conditions"):
        check_stackable(registry.train_config("fedavg", dropout=0.1))


def test_conditions_run_in_one_process_and_not_on_flower():
    from pfl_cli.fl.distributed import check_world_size
    from pfl_cli.interop.flower_app import check_deployable

    cfg = registry.train_config("fedavg", dropout=0.1, clients_per_round=4)
    with pytest.raises(PflxError, match=r"runs in one process only: federation conditions \(dropout\)"):
        check_world_size(cfg, 2, torch.device("cpu"))
    with pytest.raises(ConfigError, match="federation conditions .dropout. are simulated by pflx train only"):
        check_deployable(registry.train_config("fedavg", dropout=0.1, val_fraction=0.0))


@pytest.mark.parametrize("key,value,named", [
    pytest.param("availability_trace", "trace.csv", "trace.csv", marks=pytest.mark.slow),
    ("compute_speed", "file:speeds.csv", "speeds.csv")])
def test_condition_files_are_manifest_inputs_and_a_changed_one_is_refused(tmp_path, monkeypatch, capsys, key, value,
                                                                          named):
    """An availability trace or a per-client speed file is recorded like any input file (stage "file", its sha256);
    predict and train --resume refuse it changed, in one line, and write nothing."""
    import json

    from pfl_cli import formats
    from pfl_cli.cli.app import main

    monkeypatch.chdir(tmp_path)
    assert main(["partition", "--dataset", "builtin:digits", "--classes-per-client", "2", "--num-clients", "6",
                 "--holdout-clients", "2", "--out", "part", "--format", "quiet"]) == 0
    (tmp_path / "trace.csv").write_text("1,0\n1,1\n0,1\n1,1\n1,1\n1,1\n")
    (tmp_path / "speeds.csv").write_text("1\n2\n3\n4\n5\n6\n")
    train = ["train", "--partition", "part", "--algorithm", "fedavg", "--rounds", "4", "--eval-every", "2",
             "--local-steps", "2", "--clients-per-round", "2", "--set", "mlp_hidden=[8]", "--set", f"{key}={value}",
             "--format", "quiet"]
    assert main([*train, "--out", "run"]) == 0
    ref = [r for r in json.loads((tmp_path / "run" / "manifest.json").read_text())["inputs"] if r["stage"] == "file"]
    assert [(r["key"], r["path"]) for r in ref] == [(key, named)]
    assert ref[0]["sha256"] == formats.sha256_file(tmp_path / named)
    real = formats.write_atomic

    def write_then_die(path, data_):
        real(path, data_)
        if "checkpoint" in str(path):
            raise KeyboardInterrupt

    monkeypatch.setattr(formats, "write_atomic", write_then_die)
    assert main([*train, "--out", "killed"]) == 130
    monkeypatch.setattr(formats, "write_atomic", real)
    (tmp_path / named).write_text((tmp_path / named).read_text().replace("1", "2", 1))
    capsys.readouterr()
    for args, words in ((["predict", "--model", "run", "--partition", "part", "--out", "pred", "--format", "quiet"],
                         f"{named}: changed since run was made"),
                        ([*train, "--out", "killed", "--resume"], "different inputs")):
        code = main(args)
        err = capsys.readouterr().err
        assert code == 2 and words in err and len(err.strip().splitlines()) == 1, (args, err)
    assert not (tmp_path / "pred").exists() and not (tmp_path / "killed" / "manifest.json").exists()
