"""FedProto and FedNH (issue 40) against slow per-client references of their papers' Alg. 1.

Each round test runs two rounds of the real (cohort-vectorized) algorithm on overlapping cohorts, replays both
rounds' draws (same generator seeds) through a plain loop over clients written here from the paper (autograd of
one client's batch loss, ``torch.optim.SGD``, prototypes from Python loops over the client's samples), and
compares every client's model and the server's prototypes (and FedNH's global model).
"""

import dataclasses
import math

import pytest
import torch
import torch.nn.functional as F
from torch.func import functional_call

from baseline_support import TOL, assert_config_refused, assert_unknown_key, gen
from pfl_cli.fl.api import make_algorithm
from pfl_cli.fl.batches import CohortBatches
from pfl_cli.fl.prototypes import smoothed_prototypes, spread_prototypes
from pfl_cli.fl.store import ROLE_TRAIN
from pfl_cli.registry import train_config
from pflx_testing import replace, small_config

PROTO = small_config("fedproto", mlp_hidden=(16,), batch_size=8, lr=0.05, momentum=0.5, lambda_theta=1e-3,
                     client_clip=0.0, local_epochs=1, clients_per_round=4, new_client_epochs=1, fedproto_lambda=0.3)
NH = small_config("fednh", mlp_hidden=(16,), batch_size=8, lr=0.05, momentum=0.9, lambda_theta=1e-3,
                  client_clip=0.0, local_epochs=1, clients_per_round=4, fednh_rho=0.7)
COHORTS = ([0, 3, 5, 9], [3, 9, 1, 7])  # positions among the train clients; 3 and 9 train twice


def cohorts(store):
    train = store.clients(ROLE_TRAIN)
    return [torch.as_tensor(train[c]) for c in COHORTS]


def fit_data(store, client):
    fit = store.fit.index[client, :int(store.fit.length[client])]
    return store.inputs(fit), store.y[fit]


def local_reference(alg, start, pos, client, draw, trainable, loss_of):
    """One client alone: torch.optim.SGD (momentum, weight decay) over the batches ``draw`` holds for it."""
    cfg, store = alg.cfg, alg.store
    index, mask, active = draw
    p = {k: v.clone() for k, v in start.items()}
    leaves = {k: p[k].clone().requires_grad_(True) for k in trainable}
    opt = torch.optim.SGD(list(leaves.values()), lr=cfg.lr, momentum=cfg.momentum, weight_decay=2 * cfg.lambda_theta)
    for s in range(index.shape[1]):
        if active is not None and not bool(active[pos, s]):
            continue
        idx = index[pos, s][mask[pos, s] > 0]
        x, y = store.inputs(idx), store.y[idx]
        loss = loss_of({**p, **leaves}, x, y)
        opt.zero_grad()
        loss.backward()
        opt.step()
    p.update({k: t.detach() for k, t in leaves.items()})
    return p


# ----------------------------------------------------------------------------- FedProto
def test_fedproto_two_rounds_equal_the_per_client_reference(store):
    alg = make_algorithm(PROTO, store)
    C = store.num_classes
    models = {}                                   # client -> its own model (Alg. 1: never averaged)
    init = {k: v.clone() for k, v in alg.global_params.items()}
    glob = torch.zeros_like(alg.prototypes)
    seen = torch.zeros(C, dtype=torch.bool)
    lam = PROTO.fedproto_lambda
    for t, c in enumerate(cohorts(store)):
        draw = CohortBatches(store.fit, c, None, PROTO.batch_size, gen(t), epochs=PROTO.local_epochs).materialize()
        alg.run_round(t, c, gen(t))
        protos, counts = [], []
        for pos, client in enumerate(c.tolist()):
            def loss_of(params, x, y, g=glob.clone(), s=seen.clone()):
                f, logits = functional_call(alg.net, params, (x,), {"parts": True})
                loss = F.cross_entropy(logits, y)
                if bool(s.any()):                    # Eq. 7-8: lambda ||f(x) - C̄^(y)||^2, classes with a prototype
                    loss = loss + lam * (((f - g[y]) ** 2).sum(-1) * s[y]).mean()
                return loss
            p = local_reference(alg, models.get(client, init), pos, client, draw, list(init), loss_of)
            models[client] = p
            x, y = fit_data(store, client)
            with torch.no_grad():
                f = functional_call(alg.net, p, (x,), {"parts": True})[0].double()
            protos.append(torch.stack([f[y == k].mean(0) if (y == k).any() else torch.zeros(f.shape[1])
                                       for k in range(C)]))                                       # Eq. 3
            counts.append(torch.tensor([float((y == k).sum()) for k in range(C)], dtype=torch.float64))
        total = sum(counts)
        for k in range(C):                                                                        # Eq. 6
            if total[k] > 0:
                glob[k] = (sum(counts[i][k] * protos[i][k] for i in range(len(c))) / total[k]).float()
                seen[k] = True
        torch.testing.assert_close(alg.prototypes, glob, **TOL)
        assert torch.equal(alg.seen, seen)
        got = alg.private.gather(c)
        for pos, client in enumerate(c.tolist()):
            for k in init:
                torch.testing.assert_close(got[k][pos], models[client][k], **TOL, msg=k)
    assert bool(seen.any()) and float(glob.abs().sum()) > 0
    assert not torch.equal(models[cohorts(store)[1][0].item()]["net.fc1.weight"], init["net.fc1.weight"])


def test_fedproto_floats_are_the_prototypes_and_counts(store):
    alg = make_algorithm(PROTO, store)
    c = cohorts(store)[0]
    alg.run_round(0, c, gen(0))
    alg.traffic.close_round(len(c))
    per = alg.exchanged()
    assert per["down"] == {"prototypes": 10 * 16}
    assert per["up"] == {"prototypes": 10 * 16, "class_counts": 10}
    assert sum(per["down"].values()) + sum(per["up"].values()) == type(alg).floats_per_client_round(alg.arch)


def test_fedproto_new_client_trains_its_own_model_towards_the_global_prototypes(store):
    alg = make_algorithm(replace(PROTO, new_client_epochs=2), store)
    for t, c in enumerate(cohorts(store)):
        alg.run_round(t, c, gen(t))
    new = store.clients(1)[:2]
    params, personalized = alg.personalize(new, gen(5))
    assert personalized and alg.client_sgd_steps > 0
    # its own reference: the initial model trained 2 epochs on Eq. 7-8 with the final global prototypes
    draw = CohortBatches(store.fit, torch.as_tensor(new), None, 8, gen(5), epochs=2).materialize()
    g, s = alg.prototypes.clone(), alg.seen.clone()

    def loss_of(p, x, y):
        f, logits = functional_call(alg.net, p, (x,), {"parts": True})
        return F.cross_entropy(logits, y) + PROTO.fedproto_lambda * (((f - g[y]) ** 2).sum(-1) * s[y]).mean()
    for pos, client in enumerate(new.tolist()):
        ref = local_reference(alg, alg.global_params, pos, client, draw, list(alg.global_params), loss_of)
        for k in ref:
            torch.testing.assert_close(params[k][pos], ref[k], **TOL, msg=k)
    zero = make_algorithm(replace(PROTO, new_client_epochs=0), store)
    p0, _ = zero.personalize(new, gen())
    for k, v in zero.global_params.items():
        assert torch.equal(p0[k][1], v)


def _nearest_prototype_reference(alg, params, store, clients, split="test"):
    """Per client and per sample, in Python loops: the class j with a global prototype (``seen``) nearest to the
    client's f(x) in squared L2 (FedProto's inference), and the head's argmax; each client's correct counts."""
    near, head = [], []
    for pos, client in enumerate(clients.tolist()):
        p = {k: v[pos] for k, v in params.items()}
        rows = getattr(store, split)
        idx = rows.index[client, :int(rows.length[client])]
        x, y = store.inputs(idx), store.y_eval[idx]
        right_near = right_head = 0
        for i in range(len(y)):
            if int(y[i]) < 0:
                continue
            with torch.no_grad():
                f, logits = functional_call(alg.net, p, (x[i:i + 1],), {"parts": True})
            best, label = math.inf, None
            for j in range(store.num_classes):
                if not bool(alg.seen[j]):
                    continue
                d = float(((f[0].double() - alg.prototypes[j].double()) ** 2).sum())
                if d < best:
                    best, label = d, j
            right_near += int(label == int(y[i]))
            right_head += int(int(logits[0].argmax()) == int(y[i]))
        near.append(right_near)
        head.append(right_head)
    return near, head


def test_fedproto_predicts_the_nearest_global_prototype(store):
    """FedProto's inference (default ``inference: prototype``) against a per-sample loop over the prototypes, on
    train clients (their own models) and new clients (trained towards the prototypes); ``head`` is the decision
    layer's argmax; a class without a global prototype is never predicted."""
    from pfl_cli.fl.evaluate import evaluate

    assert train_config("fedproto").inference == "prototype"
    alg = make_algorithm(replace(PROTO, lr=0.2, fedproto_lambda=1.0), store)
    for t, c in enumerate(cohorts(store)):
        alg.run_round(t, c, gen(t))
    alg.seen[int(torch.nonzero(alg.seen)[0])] = False           # one class loses its prototype: never predicted
    train = store.clients(ROLE_TRAIN)[[0, 3, 5, 9, 1, 7]]
    new = store.clients(1)[:2]
    differ = 0
    for clients in (train, new):
        params, personalized = alg.personalize(clients, gen(5))
        assert personalized
        near, head = _nearest_prototype_reference(alg, params, store, clients)
        got = evaluate(alg.predict_net, params, store, clients, "test", personalized=True)
        assert got.correct.tolist() == near
        assert int(got.predicted[:, ~alg.seen].sum()) == 0
        as_head = make_algorithm(replace(PROTO, inference="head"), store)
        assert as_head.predict_net is as_head.net
        got_head = evaluate(as_head.predict_net, params, store, clients, "test", personalized=True)
        assert got_head.correct.tolist() == head
        differ += sum(a != b for a, b in zip(near, head))
    assert differ > 0                                            # the two rules are not the same numbers here


def test_fedproto_without_a_global_prototype_scores_every_class_alike(store):
    alg = make_algorithm(PROTO, store)
    net = alg.predict_net
    x = store.inputs(store.test.index[0, :3])
    assert torch.equal(net(x), torch.zeros(3, store.num_classes))


def test_fedproto_default_lambda_is_one_over_the_feature_width(store):
    assert make_algorithm(replace(PROTO, fedproto_lambda=None), store).alignment_weight == 1 / 16


# ----------------------------------------------------------------------------- FedNH
def test_fednh_two_rounds_equal_the_per_client_reference(store):
    alg = make_algorithm(NH, store)
    rho = NH.fednh_rho
    C = store.num_classes
    glob = {k: v.clone() for k, v in alg.global_params.items()}
    personal = {}
    body = [k for k in glob if k not in ("prototypes", "scale")]
    assert "scale" in glob and body and all(k.startswith("net.fc1") for k in body)
    for t, c in enumerate(cohorts(store)):
        draw = CohortBatches(store.fit, c, None, NH.batch_size, gen(t), epochs=NH.local_epochs).materialize()
        alg.run_round(t, c, gen(t))
        W = glob["prototypes"]

        def loss_of(p, x, y):  # cosine classifier, prototypes fixed: s <f / ||f||, w_k / ||w_k||>
            f = _features(p, x)
            logits = p["scale"] * (f / f.norm(dim=1, keepdim=True)) @ (W / W.norm(dim=1, keepdim=True)).T
            return F.cross_entropy(logits, y)
        trained, means, counts = [], [], []
        for pos, client in enumerate(c.tolist()):
            p = local_reference(alg, glob, pos, client, draw, [*body, "scale"], loss_of)
            personal[client] = p
            trained.append(p)
            x, y = fit_data(store, client)
            with torch.no_grad():
                f = _features(p, x).double()
            u = f / f.norm(dim=1, keepdim=True)
            mu = torch.stack([u[y == k].sum(0) for k in range(C)])
            means.append(mu / mu.norm(dim=1, keepdim=True).clamp_min(1e-12))
            counts.append(torch.tensor([float((y == k).sum()) for k in range(C)], dtype=torch.float64))
        new = {k: sum(p[k] for p in trained) / len(trained) for k in [*body, "scale"]}     # uniform mean
        total = sum(counts)
        rows = []
        for k in range(C):
            agg = sum(counts[i][k] * means[i][k] for i in range(len(c))) / max(float(total[k]), 1e-12)
            agg = agg / agg.norm().clamp_min(1e-12)
            w = rho * W[k].double() + (1 - rho) * agg
            rows.append((w / w.norm()).float())
        glob = {**new, "prototypes": torch.stack(rows)}
        for k, v in glob.items():
            torch.testing.assert_close(alg.global_params[k], v, **TOL, msg=k)
        got = alg.private.gather(c)
        for pos, client in enumerate(c.tolist()):
            for k in personal[client]:
                torch.testing.assert_close(got[k][pos], personal[client][k], **TOL, msg=k)
    assert float(glob["scale"]) != 1.0  # the scale learned
    assert float((glob["prototypes"] - alg.private.gather(cohorts(store)[0][:1])["prototypes"][0]).abs().max()) > 0


def _features(p, x):
    """The one-hidden-layer MLP's representation, written out: relu(W1 x + b1)."""
    return torch.relu(x.flatten(1) @ p["net.fc1.weight"].T + p["net.fc1.bias"])


def test_fednh_new_client_gets_the_global_model_or_it_trained(store):
    alg = make_algorithm(NH, store)
    alg.run_round(0, cohorts(store)[0], gen(0))
    new = store.clients(1)[:2]
    params, personalized = alg.personalize(new, gen(1))
    assert personalized and alg.client_sgd_steps == 0
    for k, v in alg.global_params.items():
        assert torch.equal(params[k][0], v) and torch.equal(params[k][1], v)
    trained = make_algorithm(replace(NH, new_client_epochs=1), store)
    trained.run_round(0, cohorts(store)[0], gen(0))
    p1, _ = trained.personalize(new, gen(1))
    assert trained.client_sgd_steps > 0
    assert torch.equal(p1["prototypes"][0], trained.global_params["prototypes"])  # fixed while it trains
    assert not torch.equal(p1["net.fc1.weight"][0], trained.global_params["net.fc1.weight"])


def test_fednh_floats_are_body_scale_prototypes_means_and_counts(store):
    alg = make_algorithm(NH, store)
    c = cohorts(store)[0]
    alg.run_round(0, c, gen(0))
    alg.traffic.close_round(len(c))
    per = alg.exchanged()
    body = 64 * 16 + 16
    assert per["down"] == {"model": body + 1, "prototypes": 10 * 16}
    assert per["up"] == {"model": body + 1, "scaled_class_means": 10 * 16, "class_counts": 10}
    assert sum(per["down"].values()) + sum(per["up"].values()) == type(alg).floats_per_client_round(alg.arch)


def test_spread_prototypes_are_unit_and_spread():
    g = torch.Generator().manual_seed(0)
    w = spread_prototypes(10, 16, g)                      # C <= d: orthonormal rows (cosine 0)
    torch.testing.assert_close(w @ w.T, torch.eye(10), atol=1e-6, rtol=0)
    w = spread_prototypes(10, 2, g)                       # C > d on the circle: the regular 10-gon's max cos(36°)
    cos = w @ w.T
    off = cos[~torch.eye(10, dtype=torch.bool)]
    torch.testing.assert_close(w.norm(dim=1), torch.ones(10))
    assert float(off.max()) <= math.cos(2 * math.pi / 10) + 0.01, float(off.max())
    w3 = spread_prototypes(12, 3, g)                      # 12 on S^2: the icosahedron's max cosine 1 / sqrt(5)
    off3 = (w3 @ w3.T)[~torch.eye(12, dtype=torch.bool)]
    assert float(off3.max()) <= 1 / math.sqrt(5) + 0.02, float(off3.max())


def test_smoothed_prototypes_keep_a_class_no_client_holds():
    prev = F.normalize(torch.tensor([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0]]), dim=1)
    means = torch.tensor([[[0.0, 1.0], [0.0, 0.0], [0.0, 0.0]], [[1.0, 0.0], [0.0, 0.0], [0.0, 0.0]]])
    counts = torch.tensor([[3.0, 0.0, 0.0], [1.0, 0.0, 0.0]])
    new = smoothed_prototypes(prev, means, counts, 0.5)
    mu = F.normalize(torch.tensor([1.0, 3.0]), dim=0)
    torch.testing.assert_close(new[0], F.normalize(0.5 * prev[0] + 0.5 * mu, dim=0))
    torch.testing.assert_close(new[1:], prev[1:])


# ----------------------------------------------------------------------------- configs
@pytest.mark.parametrize("name,opts,message", [
    ("fedproto", {"fedproto_lambda": -1.0}, "fedproto_lambda must be a finite number >= 0 for fedproto; got -1.0"),
    ("fedproto", {"fedproto_lambda": float("inf")}, "fedproto_lambda must be a finite number; got inf"),
    ("fedproto", {"local_epochs": 0}, "local_epochs must be an integer >= 1; got 0"),
    ("fedproto", {"new_client_epochs": -1}, "new_client_epochs must be an integer >= 0"),
    ("fednh", {"fednh_rho": 1.0}, "fednh_rho must be a number in [0, 1) for fednh"),
    ("fednh", {"fednh_rho": -0.1}, "fednh_rho must be a number in [0, 1)"),
    ("fednh", {"local_epochs": 0}, "local_epochs must be an integer >= 1; got 0"),
    ("fednh", {"new_client_epochs": -3}, "new_client_epochs must be an integer >= 0; got -3"),
    ("fedproto", {"inference": "nearest"}, "inference must be one of prototype, head"),
])
def test_bad_values_are_refused_naming_the_key(name, opts, message):
    assert_config_refused(name, opts, message)


def test_another_algorithms_key_gets_did_you_mean():
    assert_unknown_key("fedproto", "fedpac_lambda", ".*fedpac")
    assert_unknown_key("fednh", "fedproto_lambda", ".*fedproto")
    assert_unknown_key("fednh", "fednh_rh", ".*did you mean 'fednh_rho'")


@pytest.mark.parametrize("name,expected", [
    ("fedproto", {"lr": 0.01, "momentum": 0.5, "batch_size": 8, "local_epochs": 1, "fedproto_lambda": None,
                  "inference": "prototype"}),
    ("fednh", {"lr": 0.01, "momentum": 0.9, "lambda_theta": 5e-6, "client_clip": 10.0, "local_epochs": 5,
               "fednh_rho": 0.9, "new_client_epochs": 0}),
])
def test_config_defaults_and_sources(name, expected):
    cfg = train_config(name)
    with pytest.raises(dataclasses.FrozenInstanceError):
        cfg.lr = 1.0
    own = {f.name: f for f in dataclasses.fields(cfg)}
    for k, v in expected.items():
        assert getattr(cfg, k) == v, k
        assert own[k].metadata["source"], k
