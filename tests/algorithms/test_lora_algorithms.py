"""FedIT, FFA-LoRA and FedSA-LoRA on a built-in net (issue 46): what each trains, averages and keeps.

Each run is tiny (digits, MLP 64-16-10, 3 rounds of 3 steps). The server's state after every round is checked
against the cohort's trained adapters captured in that round: the size-weighted mean of exactly the parts the
paper averages, nothing else moved, each client's own part kept.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from pfl_cli import registry
from pfl_cli.fl.api import train_federated

SMALL = dict(rounds=3, clients_per_round=3, local_steps=3, batch_size=8, eval_every=3, mlp_hidden=(16,),
             lr=0.1, lora_rank=2)


def run(name, digits_clients, **values):
    ds, part = digits_clients
    fast = {"new_client_epochs": 0} if name == "fedsa-lora" else {}  # holdout clients scored, not trained here
    cfg = registry.train_config(name, **{**SMALL, **fast, **values})
    return train_federated(ds.x, ds.y, ds.num_classes, part, cfg, device=torch.device("cpu"))


def capture(monkeypatch, cls, method):
    """Record (cohort, theta, global params before) at every call of ``cls.method(self, t, cohort, theta)``-like
    hooks; returns the list."""
    seen = []
    real = getattr(cls, method)

    def spy(self, *args):
        before = {k: v.clone() for k, v in self.global_params.items()}
        out = real(self, *args)
        seen.append((self, args, before, {k: v.clone() for k, v in self.global_params.items()}))
        return out

    monkeypatch.setattr(cls, method, spy)
    return seen


def size_mean(store, cohort, v):
    w = store.fit.length[cohort].to(torch.float32)
    return torch.einsum("c,c...->...", w / w.sum(), v)


def test_fedit_averages_adapters_and_classifier(digits_clients, monkeypatch):
    from pfl_cli.algorithms.fedit import FedIT

    seen = capture(monkeypatch, FedIT, "aggregate")
    out = run("fedit", digits_clients)
    assert len(seen) == 3
    for alg, (t, cohort, theta), before, after in seen:
        assert set(after) == {k for k, _ in alg.net.named_parameters()}
        for k in after:
            torch.testing.assert_close(after[k], size_mean(alg.store, cohort, theta[k]), rtol=0, atol=1e-6)
    names = list(after)
    assert any(".lora_A." in k for k in names) and any(".lora_B." in k for k in names)
    assert all(not torch.equal(before[k], after[k]) for k in names)  # A, B and the head all move
    exchanged = out.algorithm.exchanged()
    assert sum(exchanged["up"].values()) == sum(v.numel() for v in after.values())


def test_fedit_averages_ia3_vectors_and_classifier(digits_clients, monkeypatch):
    """adapter=ia3: the client trains IA3's vectors (Liu et al. 2022 §3.3) and the classifier, FedAvg averages them."""
    from pfl_cli.algorithms.fedit import FedIT

    seen = capture(monkeypatch, FedIT, "aggregate")
    run("fedit", digits_clients, lora_rank=8, adapter="ia3", ia3_feedforward="fc2", mlp_hidden=(16, 12))
    alg, (t, cohort, theta), before, after = seen[-1]
    assert sorted(after) == ["model.fc1.ia3_l", "model.fc2.ia3_l", "model.fc3.bias", "model.fc3.weight"]
    assert after["model.fc1.ia3_l"].shape == (16, 1) and after["model.fc2.ia3_l"].shape == (1, 16)
    for k in after:
        torch.testing.assert_close(after[k], size_mean(alg.store, cohort, theta[k]), rtol=0, atol=1e-6)
        assert not torch.equal(before[k], after[k])


@pytest.mark.parametrize("name, values, message", [
    ("ffa-lora", {"adapter": "ia3"},
     "adapter must be lora for ffa-lora; got 'ia3' \\(its method is defined on LoRA's A"),
    ("fedsa-lora", {"adapter": "ia3"}, "adapter must be lora for fedsa-lora"),
    ("flexlora", {"adapter": "ia3"}, "adapter must be lora for flexlora"),
    ("fedit", {"adapter": "ia3", "lora_alpha": 4.0}, "lora_alpha has no effect beside adapter=ia3"),
    ("fedit", {"ia3_feedforward": "fc1"}, "ia3_feedforward has no effect without adapter=ia3"),
])
def test_ia3_refusals(name, values, message):
    from pfl_cli.errors import ConfigError

    with pytest.raises(ConfigError, match=message):
        registry.train_config(name, **values)


def test_ffa_lora_freezes_a_and_averages_b(digits_clients, monkeypatch):
    from pfl_cli.algorithms.ffa_lora import FFALoRA

    seen = capture(monkeypatch, FFALoRA, "aggregate")
    out = run("ffa-lora", digits_clients)
    first = seen[0][2]
    for alg, (t, cohort, theta), before, after in seen:
        for k in after:
            if ".lora_A." in k:
                assert torch.equal(after[k], first[k]) and torch.equal(theta[k], first[k].expand_as(theta[k]))
            else:
                torch.testing.assert_close(after[k], size_mean(alg.store, cohort, theta[k]), rtol=0, atol=1e-6)
    b = [k for k in after if ".lora_B." in k]
    assert b and all(after[k].abs().sum() > 0 for k in b)  # B left zero
    up = out.algorithm.exchanged()["up"]
    assert up and not any(".lora_A." in k for k in up)  # A never travels


def test_fedsa_lora_averages_a_and_keeps_b_and_classifier(digits_clients, monkeypatch):
    from pfl_cli.algorithms.partial import PartialSharing

    seen = []
    real = PartialSharing.local_update

    def spy(self, start, cohort, gen):
        theta, loss = real(self, start, cohort, gen)
        seen.append((self, cohort.clone(), {k: v.clone() for k, v in theta.items()}))
        return theta, loss

    monkeypatch.setattr(PartialSharing, "local_update", spy)
    out = run("fedsa-lora", digits_clients)
    alg = out.algorithm
    assert len(seen) == 3
    a = [k for k in alg.global_params if ".lora_A." in k]
    personal = [k for k in alg.global_params if k not in a]
    assert a and set(alg.shared) == set(a) and set(alg.private_names) == set(personal)
    _, cohort, theta = seen[-1]
    for k in a:  # the last round's global A: the size-weighted mean of its cohort's A
        torch.testing.assert_close(alg.global_params[k], size_mean(alg.store, cohort, theta[k]), rtol=0, atol=1e-6)
    mine = alg.private.gather(cohort)
    for k in personal:  # each cohort client keeps its own B and classifier, and they differ between clients
        assert torch.equal(mine[k], theta[k])
        assert not torch.equal(theta[k][0], theta[k][1])
    up = alg.exchanged()["up"]
    assert set(up) == set(a)


@pytest.mark.parametrize("name, values", [("fedsa-lora", {}),
                                          ("fedit", {"adapter": "ia3", "lora_rank": 8, "ia3_feedforward": "fc1"})])
def test_vmap_and_loop_give_the_same_adapters(digits_clients, name, values):
    got = [run(name, digits_clients, cohort_exec=how, **values).algorithm for how in ("vmap", "loop")]
    for k, v in got[0].global_params.items():
        torch.testing.assert_close(v, got[1].global_params[k], rtol=1e-5, atol=1e-6)


def test_dropout_is_drawn_from_the_seed(digits_clients):
    a, b = (run("fedit", digits_clients, lora_dropout=0.3).algorithm for _ in range(2))
    c = run("fedit", digits_clients).algorithm
    assert all(torch.equal(v, b.global_params[k]) for k, v in a.global_params.items())
    assert not all(torch.equal(v, c.global_params[k]) for k, v in a.global_params.items())


@pytest.mark.parametrize("key, value, message", [
    ("lora_rank", 0, "lora_rank must be an integer >= 1"),
    ("lora_alpha", -1.0, "lora_alpha must be a finite number > 0"),
    ("lora_dropout", 1.0, r"lora_dropout must be in \[0, 1\)"),
    ("backbone", "resnet-micro", "backbone has no effect on algorithm 'fedit'"),
    ("flex_ranks", "2,9", r"flex_ranks must list integer ranks in \[1, lora_rank=8\]"),
    ("flex_ranks", "two", r"flex_ranks must list integer ranks"),
])
def test_bad_keys_are_refused(key, value, message):
    from pfl_cli.errors import ConfigError

    with pytest.raises(ConfigError, match=message):
        registry.train_config("flexlora" if key == "flex_ranks" else "fedit", **{key: value})


def test_cli_train_and_predict_new_clients(tmp_path, cli):
    part = tmp_path / "part"
    assert cli("partition", "--dataset", "builtin:digits", "--classes-per-client", "2", "--num-clients", "6",
               "--holdout-clients", "2", "--out", part, "--format", "quiet").code == 0
    model = tmp_path / "fedsa"
    run_ = cli("train", "--partition", part, "--algorithm", "fedsa-lora", "--rounds", "2", "--clients-per-round", "2",
               "--set", "local_steps=2", "--set", "new_client_epochs=1", "--set", "lora_targets=fc*",
               "--out", model, "--format", "quiet")
    assert run_.code == 0, run_.err
    pred = cli("predict", "--model", model, "--partition", part, "--clients", "holdout", "--out", tmp_path / "pred",
               "--format", "json")
    assert pred.code == 0, pred.err
    import json

    metrics = json.loads((tmp_path / "pred" / "metrics.json").read_text())
    assert metrics["new_clients"] == 2 and 0.0 <= metrics["mean_accuracy"] <= 1.0
    bad = cli("train", "--partition", part, "--algorithm", "fedit", "--rounds", "1", "--set", "lora_targets=conv*",
              "--out", tmp_path / "bad", "--format", "quiet")
    assert bad.code == 2 and "matches none" in bad.err and len(bad.err.strip().splitlines()) == 1
    assert not (tmp_path / "bad").exists()


def test_flexlora_averages_full_updates_and_cuts_them_to_each_clients_rank(digits_clients, monkeypatch):
    """Bai et al. 2024 §3: the server's update is the size-weighted mean of the clients' B_i A_i; a client of rank r
    starts from its best rank-r approximation (truncated SVD) and its components past r are zero."""
    from pfl_cli.algorithms.flexlora import FlexLoRA

    seen = []
    real = FlexLoRA.run_round

    def spy(self, t, cohort, gen):
        starts = {}
        real_sgd = self.cohort_sgd

        def sgd(start, clients, gen_, **kw):
            out = real_sgd(start, clients, gen_, **kw)
            starts["start"], starts["theta"] = start, out[0]
            return out

        self.cohort_sgd = sgd
        loss = real(self, t, cohort, gen)
        del self.cohort_sgd
        seen.append((cohort.clone(), starts["start"], starts["theta"], {k: v.clone() for k, v in self.delta.items()}))
        return loss

    monkeypatch.setattr(FlexLoRA, "run_round", spy)
    alg = run("flexlora", digits_clients, flex_ranks="1,2", lora_rank=2).algorithm
    layer = alg.layers[0]
    for cohort, start, theta, delta in seen:
        b, a = theta[f"{layer}.lora_B.weight"], theta[f"{layer}.lora_A.weight"]
        want = size_mean(alg.store, cohort, torch.bmm(b, a))
        torch.testing.assert_close(delta[layer], want, rtol=0, atol=1e-6)
    cohort, start, _, _ = seen[-1]
    before = seen[-2][3][layer]
    u, s, vh = torch.linalg.svd(before, full_matrices=False)
    for i, c in enumerate(cohort.tolist()):
        rank = 1 + c % 2
        product = start[f"{layer}.lora_B.weight"][i] @ start[f"{layer}.lora_A.weight"][i]
        torch.testing.assert_close(product, (u[:, :rank] * s[:rank]) @ vh[:rank], rtol=1e-4, atol=1e-5)
        assert not start[f"{layer}.lora_A.weight"][i, rank:].any()
    assert alg.personalized


DP = dict(dp_epsilon=8.0, dp_delta=1e-5, dp_clip=0.3, dp_population=40, dp_sampling_rate=0.3, dp_noise="seeded",
          normalize=False)
RELEASED = {"fedit": ("lora_A", "lora_B", "head"), "ffa-lora": ("lora_B", "head"), "fedsa-lora": ("lora_A",)}


@pytest.mark.parametrize("name", [n if n == "fedsa-lora" else pytest.param(n, marks=pytest.mark.slow)
                                  for n in sorted(RELEASED)])
def test_client_level_dp_noises_exactly_what_travels(name, digits_clients, monkeypatch):
    """Under --dp each round's mechanism gets each cohort client's delta of the parts the method uploads, and the
    global model moves by the mechanism's output there and nowhere else; fedsa-lora's B and classifier stay with
    the clients (in its state, not in model.pt)."""
    from pfl_cli.fl.dp import ClientLevelDP

    calls = []
    real = ClientLevelDP.private_mean

    def spy(self, contributions, gen):
        out = real(self, contributions, gen)
        calls.append(({k: v.clone() for k, v in contributions.items()}, {k: v.clone() for k, v in out.items()}))
        return out

    monkeypatch.setattr(ClientLevelDP, "private_mean", spy)
    seen = capture(monkeypatch, registry.get(name).algorithm, "run_round" if name == "fedsa-lora" else "aggregate")
    ds, part = digits_clients
    small = {k: v for k, v in SMALL.items() if k != "clients_per_round"}  # the cohorts are drawn at rate q
    cfg = registry.train_config(name, **{**small, "rounds": 2, **DP,
                                         **({"new_client_epochs": 0} if name == "fedsa-lora" else {})})
    out = train_federated(ds.x, ds.y, ds.num_classes, part, cfg, device=torch.device("cpu"))
    alg = out.algorithm
    assert out.dp is not None and len(calls) == len(seen) == 2
    head = [k for k, _ in alg.net.named_parameters() if ".lora_" not in k]
    released = {k for k in alg.global_params if any(p in k for p in RELEASED[name] if p != "head")}
    released |= set(head) if "head" in RELEASED[name] else set()
    for (deltas, noisy), (_, _, before, after) in zip(calls, seen):
        assert set(deltas) == released
        for k in after:
            if k in released:
                torch.testing.assert_close(after[k], before[k] + noisy[k], rtol=0, atol=1e-6)
            else:
                assert torch.equal(after[k], before[k])
    if name == "fedsa-lora":
        assert "private" not in alg.weights() and set(alg.weights()) == {"client"}
        assert "private" in alg.state()  # client-held in a checkpoint (pfl_cli.fl.dp.private_snapshot)
        assert bool(alg.private.has.any())


def test_flexlora_refuses_dp_with_its_reason(tmp_path, cli):
    part = tmp_path / "part"
    assert cli("partition", "--dataset", "builtin:digits", "--num-clients", "6", "--out", part,
               "--format", "quiet").code == 0
    got = cli("train", "--partition", part, "--algorithm", "flexlora", "--dp", "eps=4,clip=1,population=100",
              "--out", tmp_path / "flex", "--format", "quiet")
    assert got.code == 2 and len(got.err.strip().splitlines()) == 1
    assert "--dp is not supported by algorithm 'flexlora': each client's upload is its full-size update B A" in got.err
    assert not (tmp_path / "flex").exists()
