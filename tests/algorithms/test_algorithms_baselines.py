"""The personalized baselines against slow per-client references of their papers' update rules.

Each test runs one batched round of the real algorithm, then replays the round's random
draws (same generator seed) through an obviously-correct loop over clients
(``local_sgd_reference``: ``torch.optim.SGD`` one client at a time, or a hand-written loop
for APFL), and compares the global model and the private per-client state.
"""


import numpy as np
import pytest
import torch
from torch.func import functional_call

from pfl_cli.registry import entries
REGISTRY = {n: e.algorithm for n, e in entries().items()}
from pfl_cli.errors import InputError
from pfl_cli.fl.api import make_algorithm
from pfl_cli.fl.batches import sample_batches
from pfl_cli.fl.cohort import local_sgd, local_sgd_reference
from baseline_support import TOL, alg_factory, close, cohort, gen
from pflx_testing import replace, small_config
from pfl_cli.fl.split import split_names
from pfl_cli.models import num_parameters

BASE = small_config(mlp_hidden=(16,), local_steps=4, batch_size=8, lr=0.05, clients_per_round=4, new_client_epochs=1,
                   head_epochs=1, body_epochs=1)
alg_for = alg_factory(BASE)
NEW = ("fedprox", "fedper", "fedrep", "lg-fedavg", "ditto", "apfl", "perfedavg", "pfedme", "knnper")


def stacked(params, c):
    return {k: v.unsqueeze(0).repeat(c, *([1] * v.dim())).clone() for k, v in params.items()}


def draws(alg, clients, g, *, steps=None, epochs=None):
    """The batches (and active steps) ``cohort_sgd`` draws next from ``g``."""
    if epochs is not None:
        total, active = alg.epoch_steps(clients, epochs)
    else:
        total, active = steps, None
    index, mask = sample_batches(alg.store.fit, clients, total, alg.cfg.batch_size, g)
    return index, mask, active


def ref_sgd(alg, start, clients, g, *, steps=None, epochs=None, trainable=None, sgd=None, **objective):
    index, mask, active = draws(alg, clients, g, steps=steps, epochs=epochs)
    moving = {k: v for k, v in start.items() if trainable is None or k in trainable}
    fixed = {k: v for k, v in start.items() if k not in moving}
    theta = local_sgd_reference(alg.net, moving, alg.store, index, mask, active=active, fixed=fixed,
                                **{**alg.sgd_options(), **(sgd or {})}, **objective)[0]
    return {**start, **theta}


PLAIN_SGD = {"momentum": 0.0, "clip": 0.0}


def mean(store, clients, theta, by_size=True):
    w = store.fit.length[clients].double() if by_size else torch.ones(len(clients), dtype=torch.float64)
    w = w / w.sum()
    return {k: sum(float(w[i]) * v[i] for i in range(len(clients))) for k, v in theta.items()}


# ----------------------------------------------------------------------------- building blocks
def test_local_sgd_on_a_subset_with_a_proximal_term_equals_the_optimizer_loop(store):
    alg = alg_for(store, algorithm="fedavg", client_clip=0.5)
    clients = cohort(store)
    index, mask, _ = draws(alg, clients, gen(), steps=6)
    start = stacked(alg.global_params, len(clients))
    start = {k: v + 0.01 * torch.randn(v.shape, generator=gen(1)) for k, v in start.items()}
    anchor = stacked(alg.global_params, len(clients))
    head = {k: v for k, v in start.items() if k.startswith("fc2.")}
    body = {k: v for k, v in start.items() if k.startswith("fc1.")}
    opts = dict(lr=0.05, momentum=0.9, weight_decay=1e-3, clip=0.5, fixed=body, prox_mu=0.7, prox_anchor=anchor)
    fast, _ = local_sgd(alg.net, head, store, index, mask, **opts)
    slow, _ = local_sgd_reference(alg.net, head, store, index, mask, **opts)
    close(fast, slow)
    assert set(fast) == set(head) and not torch.allclose(fast["fc2.weight"], start["fc2.weight"])
    # the frozen body matters: another body gives another head
    other, _ = local_sgd(alg.net, head, store, index, mask, **{**opts, "fixed": {k: 2 * v for k, v in body.items()}})
    assert not torch.allclose(other["fc2.weight"], fast["fc2.weight"])


def test_head_split_of_lenet_and_mlp_and_refusal_without_a_body(store):
    from pfl_cli.models import build, client_spec

    lenet = client_spec("lenet", (3, 32, 32), 10)
    body, head = split_names(build(lenet), "fedrep")
    assert head == ["fc3.weight", "fc3.bias"] and body[0] == "conv1.weight" and len(body) == 8
    mlp = client_spec("mlp", (64,), 10, (32, 16))
    assert split_names(build(mlp), "fedrep")[1] == ["fc3.weight", "fc3.bias"]
    with pytest.raises(InputError, match="has no body"):
        alg_for(store, algorithm="fedrep", mlp_hidden=())


def test_floats_per_client_round_count_what_each_algorithm_exchanges(store):
    arch = alg_for(store, algorithm="fedavg").arch
    d = num_parameters(arch["client"])
    head = 16 * 10 + 10
    expected = {"fedprox": 2 * d, "ditto": 2 * d, "apfl": 2 * d, "perfedavg": 2 * d, "pfedme": 2 * d,
                "knnper": 2 * d, "fedper": 2 * (d - head),
                "fedrep": 2 * (d - head), "lg-fedavg": 2 * head}
    assert {a: REGISTRY[a].floats_per_client_round(arch) for a in expected} == expected


# ----------------------------------------------------------------------------- FedProx
def test_fedprox_with_mu_zero_is_fedavg(store):
    a, b = alg_for(store, algorithm="fedavg"), alg_for(store, algorithm="fedprox", mu=0.0)
    for t in range(3):
        a.run_round(t, cohort(store), gen(t))
        b.run_round(t, cohort(store), gen(t))
    for k in a.global_params:
        assert torch.equal(a.global_params[k], b.global_params[k]), k


def test_fedprox_round_equals_the_proximal_per_client_loop(store):
    alg = alg_for(store, algorithm="fedprox", mu=0.5)
    c = cohort(store)
    w = {k: v.clone() for k, v in alg.global_params.items()}
    alg.run_round(0, c, gen())
    theta = ref_sgd(alg, stacked(w, len(c)), c, gen(), steps=4, prox_mu=0.5, prox_anchor=stacked(w, len(c)))
    close(alg.global_params, mean(store, c, theta))
    plain = alg_for(store, algorithm="fedavg")
    plain.run_round(0, c, gen())
    assert not torch.allclose(plain.global_params["fc1.weight"], alg.global_params["fc1.weight"], atol=1e-6)


# ----------------------------------------------------------------------------- FedRep, FedPer, LG-FedAvg
def test_fedrep_round_trains_heads_then_bodies_and_averages_bodies_uniformly(store):
    alg = alg_for(store, algorithm="fedrep", head_epochs=2, body_epochs=1)
    c = cohort(store)
    start = stacked(alg.global_params, len(c))
    alg.run_round(0, c, gen())
    g = gen()
    theta = ref_sgd(alg, start, c, g, epochs=2, trainable=alg.head)
    theta = ref_sgd(alg, theta, c, g, epochs=1, trainable=alg.body)
    close(alg.global_params, {**mean(store, c, {k: theta[k] for k in alg.body}, by_size=False)})
    close(alg.private.gather(c), {k: theta[k] for k in alg.head})
    assert alg.private.has[c].all() and alg.private.has.sum() == len(c)


@pytest.mark.parametrize("name,shared", [("fedper", "body"), ("lg-fedavg", "head")])
def test_fedper_and_lg_fedavg_rounds_share_one_part_and_keep_the_other(store, name, shared):
    alg = alg_for(store, algorithm=name)
    c = cohort(store)
    alg.run_round(0, c, gen(0))  # a first round so the private rows differ from the init
    c2 = cohort(store, 3)
    start = stacked(alg.global_params, len(c2))
    start.update(alg.private.gather(c2))
    alg.run_round(1, c2, gen(1))
    theta = ref_sgd(alg, start, c2, gen(1), steps=4)
    shared_names = alg.body if shared == "body" else alg.head
    private_names = alg.head if shared == "body" else alg.body
    close({k: alg.global_params[k] for k in shared_names}, mean(store, c2, {k: theta[k] for k in shared_names}))
    close(alg.private.gather(c2), {k: theta[k] for k in private_names})


def test_new_clients_of_fedrep_get_a_fresh_head_trained_on_the_frozen_body(store):
    alg = alg_for(store, algorithm="fedrep", new_client_epochs=2)
    alg.run_round(0, cohort(store), gen())
    holdout = np.flatnonzero(store.role == 1)
    params, personalized = alg.personalize(holdout, gen(3))
    start = {**alg.global_params, **alg.init_private}
    ref = ref_sgd(alg, stacked(start, len(holdout)), torch.as_tensor(holdout), gen(3), epochs=2, trainable=alg.head)
    assert personalized
    close(params, ref)
    for k in alg.body:
        assert torch.equal(params[k], stacked(alg.global_params, len(holdout))[k])
    assert alg.client_sgd_steps > 0


# ----------------------------------------------------------------------------- Ditto
def test_ditto_round_equals_fedavg_plus_proximal_personal_steps(store):
    alg = alg_for(store, algorithm="ditto", lam=0.3)
    c = cohort(store)
    w = {k: v.clone() for k, v in alg.global_params.items()}
    v0 = alg.private.gather(c)
    alg.run_round(0, c, gen())
    g = gen()
    theta = ref_sgd(alg, stacked(w, len(c)), c, g, steps=4)
    # Alg. 1 lines 5 and 7: v_k steps like w (the client optimizer's momentum 0.9), without clip
    assert alg.sgd_options()["momentum"] == 0.9 and alg.cfg.personal_momentum is None and alg.cfg.personal_clip == 0
    personal = ref_sgd(alg, v0, c, g, steps=4, prox_mu=0.3, prox_anchor=stacked(w, len(c)), sgd={"clip": 0.0})
    close(alg.global_params, mean(store, c, theta))
    close(alg.private.gather(c), personal)


def test_ditto_with_lambda_zero_personal_models_are_local_training(store):
    """lambda = 0: the personal models never see the global model, however it moves."""
    runs = [alg_for(store, algorithm="ditto", lam=0.0, server_lr=lr) for lr in (1.0, 0.3)]
    rows = []
    for alg in runs:
        for t in range(3):
            alg.run_round(t, cohort(store), gen(t))
        rows.append(alg.private.gather(cohort(store)))
    assert not torch.equal(runs[0].global_params["fc1.weight"], runs[1].global_params["fc1.weight"])
    for k in rows[0]:
        assert torch.equal(rows[0][k], rows[1][k]), k
    # and they are local SGD from the shared initialization (= Local's): replay the three rounds
    local = make_algorithm(replace(BASE, algorithm="local"), store)
    v = stacked(local.init_params, 4)
    c = cohort(store)
    for t in range(3):
        g = gen(t)
        draws(runs[0], c, g, steps=4)  # the global model's batches come first
        v = ref_sgd(runs[0], v, c, g, steps=4, sgd={"clip": 0.0})  # w's optimizer (momentum 0.9)
    close(rows[0], v)


# ----------------------------------------------------------------------------- APFL
def _apfl_reference(alg, w0, v0, a0, c, g, steps, lr, alpha_lr):
    """Alg. 1 one client at a time, gradients by plain autograd on the client's own model."""
    index, mask, _ = draws(alg, c, g, steps=steps)
    ws, vs, alphas = [], [], []
    for i in range(len(c)):
        w = {k: v[i].clone() for k, v in w0.items()}
        v = {k: t[i].clone() for k, t in v0.items()}
        a = a0[i].clone()
        for s in range(steps):
            idx, m = index[i, s], mask[i, s]
            x, y = alg.store.inputs(idx), alg.store.y[idx]

            def loss_of(p):
                ce = torch.nn.functional.cross_entropy(functional_call(alg.net, p, (x,)), y, reduction="none")
                return (ce * m).sum() / m.sum()

            wl = {k: t.clone().requires_grad_(True) for k, t in w.items()}
            gw = torch.autograd.grad(loss_of(wl), list(wl.values()))
            vl = {k: t.clone().requires_grad_(True) for k, t in v.items()}
            al = a.clone().requires_grad_(True)
            gm = torch.autograd.grad(loss_of({k: al * vl[k] + (1 - al) * w[k] for k in w}), list(vl.values()) + [al])
            w = {k: w[k] - lr * gk for k, gk in zip(w, gw)}
            v = {k: v[k] - lr * gk for k, gk in zip(v, gm[:-1])}
            a = (a - alpha_lr * gm[-1]).clamp(0, 1)
        ws.append(w), vs.append(v), alphas.append(a)
    return ({k: torch.stack([w[k] for w in ws]) for k in w0}, {k: torch.stack([v[k] for v in vs]) for k in v0},
            torch.stack(alphas))


def test_apfl_round_equals_the_per_client_loop(store):
    alg = alg_for(store, algorithm="apfl", alpha=0.4, alpha_lr=0.2)
    c = cohort(store)
    w0 = stacked(alg.global_params, len(c))
    row = alg.private.gather(c)
    a0 = row.pop("alpha")
    alg.run_round(0, c, gen())
    w, v, a = _apfl_reference(alg, w0, row, a0, c, gen(), 4, 0.05, 0.2)
    close(alg.global_params, mean(store, c, w))
    got = alg.private.gather(c)
    torch.testing.assert_close(got.pop("alpha"), a, **TOL)
    close(got, v)
    assert not torch.allclose(a, a0)


def test_apfl_with_alpha_one_is_local_training(store):
    alg = alg_for(store, algorithm="apfl", alpha=1.0, alpha_lr=0.0)  # its steps are plain SGD (momentum refused)
    c = cohort(store)
    v0 = alg.private.gather(c)
    v0.pop("alpha")
    alg.run_round(0, c, gen())
    local = ref_sgd(alg, v0, c, gen(), steps=4, sgd=PLAIN_SGD)
    models, _ = alg.personalize(c.numpy(), gen())
    close(models, local)
    assert torch.equal(alg.private.values["alpha"], torch.ones(store.num_clients))


# ----------------------------------------------------------------------------- shared behaviour
@pytest.mark.parametrize("name", NEW)
def test_resumed_training_is_identical(store, name):
    whole, first = alg_for(store, algorithm=name), alg_for(store, algorithm=name)
    for t in range(4):
        whole.run_round(t, cohort(store), gen(t))
    for t in range(2):
        first.run_round(t, cohort(store), gen(t))
    second = alg_for(store, algorithm=name)
    second.load_state(first.state())
    for t in range(2, 4):
        second.run_round(t, cohort(store), gen(t))
    a, b = whole.state(), second.state()

    def flat(tree, prefix=""):
        for k, v in tree.items():
            yield from flat(v, f"{prefix}{k}/") if isinstance(v, dict) else [(prefix + k, v)]

    fa, fb = dict(flat(a)), dict(flat(b))
    assert fa.keys() == fb.keys()
    for k in fa:
        assert torch.equal(fa[k], fb[k]), k


@pytest.mark.parametrize("name", ["fedrep", "ditto", "apfl", "lg-fedavg", "pfedme"])
def test_private_state_serves_train_clients_and_only_on_its_partition(store, name):
    alg = alg_for(store, algorithm=name)
    c = cohort(store)
    alg.run_round(0, c, gen())
    before = alg.client_sgd_steps
    params, _ = alg.personalize(c.numpy(), gen())
    assert alg.client_sgd_steps == before  # no training: their private state
    close(params, alg.own_models(c))
    # the same positions on another partition are new clients
    alg.store = replace(store, partition_sha=b"other")
    alg.personalize(c.numpy(), gen())
    assert alg.client_sgd_steps > before
    alg.store = store


@pytest.mark.parametrize("opts,message", [
    ({"algorithm": "fedprox", "mu": -0.1}, "mu must be a finite number >= 0"),
    ({"algorithm": "ditto", "lam": -1.0}, "lam must be a finite number >= 0"),
    ({"algorithm": "apfl", "alpha": 1.5}, "alpha must be a fraction in [0, 1]; got 1.5"),
    ({"algorithm": "fedrep", "head_epochs": 0, "body_epochs": 0}, "head_epochs must be >= 1 for fedrep"),
    ({"algorithm": "perfedavg", "variant": "so"}, "variant must be one of fo, hf; got 'so'"),
    ({"algorithm": "perfedavg", "beta": 0.0}, "beta must be a finite number > 0"),
    ({"algorithm": "pfedme", "K": 0}, "K must be an integer >= 1"),
    ({"algorithm": "knnper", "interpolation": 1.5}, "interpolation must be a fraction in [0, 1]"),
])
def test_bad_baseline_options(opts, message):
    """Each algorithm's config checks its own keys (on construction through the registry, or validate())."""
    import dataclasses

    from pfl_cli.fl.api import validate_train_config

    with pytest.raises(InputError) as err:
        alg = opts["algorithm"]
        validate_train_config(dataclasses.replace(replace(BASE, algorithm=alg), **opts))
    assert message in str(err.value)
    with pytest.raises(InputError) as err:  # through the registry (flags, files, --set) the value never gets in
        replace(BASE, **opts)
    assert message in str(err.value)


# ----------------------------------------------------------------------------- Per-FedAvg
def _loss_of(alg, params, idx, m):
    x, y = alg.store.inputs(idx), alg.store.y[idx]
    ce = torch.nn.functional.cross_entropy(functional_call(alg.net, params, (x,)), y, reduction="none")
    return (ce * m).sum() / m.sum()


def _grad(alg, params, idx, m, create_graph=False):
    leaves = {k: v.clone().requires_grad_(True) for k, v in params.items()}
    g = torch.autograd.grad(_loss_of(alg, leaves, idx, m), list(leaves.values()), create_graph=create_graph)
    return leaves, dict(zip(leaves, g))


@pytest.mark.parametrize("variant", ["fo", "hf"])
def test_perfedavg_round_equals_the_per_client_maml_loop(store, variant):
    # softmax regression: smooth, so finite differences of gradients are an exact-enough Hessian-vector product
    alg = alg_for(store, algorithm="perfedavg", variant=variant, beta=0.03, local_steps=3, mlp_hidden=())
    c = cohort(store)
    w0 = {k: v.clone() for k, v in alg.global_params.items()}
    alg.run_round(0, c, gen())
    k = 3 if variant == "hf" else 2
    index, mask, _ = draws(alg, c, gen(), steps=3 * k)
    ws = []
    for i in range(len(c)):
        w = dict(w0)
        for s in range(3):
            b = [(index[i, s * k + j], mask[i, s * k + j]) for j in range(k)]
            _, g1 = _grad(alg, w, *b[0])
            temp = {n: w[n] - 0.05 * g1[n] for n in w}
            _, g2 = _grad(alg, temp, *b[1])
            step = g2
            if variant == "hf":  # Hessian-vector product by finite differences of gradients: independent of autograd
                eps = 1e-3
                _, gp = _grad(alg, {n: w[n] + eps * g2[n] for n in w}, *b[2])
                _, gm = _grad(alg, {n: w[n] - eps * g2[n] for n in w}, *b[2])
                step = {n: g2[n] - 0.05 * (gp[n] - gm[n]) / (2 * eps) for n in w}
            w = {n: w[n] - 0.03 * step[n] for n in w}
        ws.append(w)
    ref = mean(store, c, {n: torch.stack([w[n] for w in ws]) for n in w0})
    for n in ref:
        torch.testing.assert_close(alg.global_params[n], ref[n], atol=1e-4, rtol=1e-3, msg=n)


def test_perfedavg_variants_differ_and_personalization_is_alpha_steps(store):
    fo, hf = alg_for(store, algorithm="perfedavg", variant="fo"), alg_for(store, algorithm="perfedavg", variant="hf")
    fo.run_round(0, cohort(store), gen())
    hf.run_round(0, cohort(store), gen())
    assert not torch.allclose(fo.global_params["fc1.weight"], hf.global_params["fc1.weight"])
    holdout = np.flatnonzero(store.role == 1)
    params, personalized = fo.personalize(holdout, gen(2))
    index, mask, _ = draws(fo, torch.as_tensor(holdout), gen(2), steps=1)
    ref = local_sgd_reference(fo.net, stacked(fo.global_params, len(holdout)), store, index, mask, lr=0.05)[0]
    assert personalized and fo.client_sgd_steps == len(holdout)
    close(params, ref)


# ----------------------------------------------------------------------------- pFedMe
def test_pfedme_inner_solution_satisfies_its_optimality_condition(store):
    """theta~ = argmin f(theta; D) + lambda/2 ||theta - w||^2  <=>  grad f(theta~; D) + lambda (theta~ - w) = 0."""
    from torch.func import vmap

    from pfl_cli.algorithms.pfedme import inner_solution

    # softmax regression: the inner problem is smooth and strongly convex (with ReLU layers plain gradient
    # steps stall at kinks, where only a subgradient vanishes)
    alg = alg_for(store, algorithm="pfedme", mlp_hidden=())
    c = cohort(store)
    index, mask, _ = draws(alg, c, gen(), steps=1)
    w = stacked(alg.global_params, len(c))
    forward = vmap(lambda p, x: functional_call(alg.net, p, (x,)))

    def residual(theta):
        out = []
        for i in range(len(c)):
            _, g = _grad(alg, {k: v[i] for k, v in theta.items()}, index[i, 0], mask[i, 0])
            out.append(torch.sqrt(sum(((g[k] + 15.0 * (theta[k][i] - w[k][i])) ** 2).sum() for k in g)))
        return torch.stack(out)

    _, g0 = None, residual(w)
    theta, _ = inner_solution(forward, w, w, store, index[:, 0], mask[:, 0], lam=15.0, personal_lr=0.02, K=300)
    r = residual(theta)
    assert (r < 1e-4 * g0.clamp_min(1.0)).all() and (g0 > 1e-2).all(), (r, g0)
    few, _ = inner_solution(forward, w, w, store, index[:, 0], mask[:, 0], lam=15.0, personal_lr=0.02, K=3)
    assert (residual(few) > 10 * r).all()


def test_pfedme_round_equals_the_per_client_loop(store):
    alg = alg_for(store, algorithm="pfedme", lam=5.0, K=2, personal_lr=0.03, beta=0.7, local_steps=3)
    c = cohort(store)
    w0 = {k: v.clone() for k, v in alg.global_params.items()}
    alg.run_round(0, c, gen())
    index, mask, _ = draws(alg, c, gen(), steps=3)
    ws, thetas = [], []
    for i in range(len(c)):
        w, theta = dict(w0), dict(w0)
        for s in range(3):
            for _ in range(2):
                _, g = _grad(alg, theta, index[i, s], mask[i, s])
                theta = {k: theta[k] - 0.03 * (g[k] + 5.0 * (theta[k] - w[k])) for k in w}
            w = {k: w[k] - 0.05 * 5.0 * (w[k] - theta[k]) for k in w}
        ws.append(w), thetas.append(theta)
    # Alg. 1 line 11: w <- (1 - beta) w + beta (1/S) sum_i w_i, the uniform mean over the cohort (not by size)
    avg = mean(store, c, {k: torch.stack([w[k] for w in ws]) for k in w0}, by_size=False)
    assert len(set(store.fit.length[c].tolist())) > 1  # the clients' sizes differ, so a size-weighted mean would not pass
    close(alg.global_params, {k: 0.3 * w0[k] + 0.7 * avg[k] for k in w0})
    close(alg.private.gather(c), {k: torch.stack([t[k] for t in thetas]) for k in w0})


# ----------------------------------------------------------------------------- kNN-Per
def test_knnper_with_interpolation_zero_is_the_global_model(store):
    from pfl_cli.fl.evaluate import evaluate

    knn, fedavg = alg_for(store, algorithm="knnper", interpolation=0.0), alg_for(store, algorithm="fedavg")
    for alg in (knn, fedavg):
        alg.run_round(0, cohort(store), gen())
    clients = np.arange(store.num_clients)
    params, _ = knn.personalize(clients, gen())
    a = evaluate(knn.predict_net, params, store, clients, personalized=True)
    b = evaluate(fedavg.net, fedavg.global_params, store, clients, personalized=False)
    assert np.array_equal(a.correct, b.correct) and np.array_equal(a.correct_lm, b.correct_lm)
    np.testing.assert_allclose(a.loss, b.loss, rtol=1e-4)


def test_knnper_batched_search_equals_a_loop_over_queries(store):
    alg = alg_for(store, algorithm="knnper", interpolation=0.7, knn_k=5, knn_scale=2.0)
    alg.run_round(0, cohort(store), gen())
    clients = np.flatnonzero(store.role == 1)
    params, _ = alg.personalize(clients, gen())
    from torch.func import vmap

    index, length = store.test.rows(torch.as_tensor(clients))
    logp = vmap(lambda p, x: functional_call(alg.predict_net, p, (x,)))(params, store.inputs(index))
    net = alg.net
    for i, c in enumerate(clients):
        fit = store.fit.index[c, :store.fit.length[c]]
        with torch.no_grad():
            g = {k: v for k, v in alg.global_params.items()}
            mem = functional_call(alg.feature_net, {"net." + k: v for k, v in g.items()}, (store.inputs(fit),))
            for j in range(int(length[i])):
                x = store.inputs(index[i, j:j + 1])
                h = functional_call(alg.feature_net, {"net." + k: v for k, v in g.items()}, (x,))[0]
                d = torch.sqrt(((mem - h) ** 2).sum(1))
                order = torch.argsort(d)[:5]
                p_knn = torch.zeros(10)
                for q in order:
                    p_knn[store.y[fit[q]]] += torch.exp(-d[q] / 2.0)
                p_knn /= p_knn.sum()
                p_model = torch.softmax(functional_call(net, g, (x,))[0], -1)
                ref = torch.log(0.7 * p_knn + 0.3 * p_model)
                torch.testing.assert_close(logp[i, j], ref, atol=1e-4, rtol=1e-4)
    assert alg.client_sgd_steps == 0


@pytest.mark.parametrize("name", NEW + ("fedavg", "pefll"))
def test_recorded_traffic_equals_the_floats_each_algorithm_reports(store, name):
    alg = alg_for(store, algorithm=name)
    for t in range(2):
        c = cohort(store, 3 + t)
        alg.run_round(t, c, gen(t))
        alg.traffic.close_round(len(c))
    s = alg.traffic.summary()
    assert s["floats_down_per_client_round"] + s["floats_up_per_client_round"] == \
        REGISTRY[name].floats_per_client_round(alg.arch)
    assert s["client_rounds"] == 7
