"""FedPAC (issue 35): the combination program against slow references, the statistics, a round against a
per-client loop, new clients, bad keys.

The round reference replays the round's random draws (same generator seed) one client at a time with
``torch.optim.SGD``, computes each client's statistics and prototypes with Python loops over its
samples, and solves every client's combination program with scipy's SLSQP.
"""

import itertools

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch.func import functional_call

from pfl_cli.algorithms.fedpac import combination_weights, feature_statistics, simplex_qp
from pfl_cli.fl.api import make_algorithm
from pfl_cli.fl.batches import CohortBatches
from pfl_cli.registry import train_config
from baseline_support import TOL, assert_config_refused, assert_unknown_key, cohort, gen
from pflx_testing import replace, small_config

BASE = small_config("fedpac", mlp_hidden=(16,), batch_size=8, lr=0.05, head_lr=0.1, momentum=0.5, lambda_theta=1e-3,
                    client_clip=0.0, head_epochs=1, body_epochs=1, clients_per_round=4, new_client_epochs=1,
                    fedpac_lambda=0.5)


# ----------------------------------------------------------------------------- the quadratic program
def _random_psd(rng, b, m, rank=None):
    a = rng.normal(size=(b, m, rank or m))
    return a @ np.swapaxes(a, 1, 2) + np.stack([np.diag(rng.uniform(0, 0.5, m)) for _ in range(b)])


def _slsqp(P):
    from scipy.optimize import minimize

    m = P.shape[0]
    best = None
    for start in [np.full(m, 1.0 / m), *np.eye(m)]:
        r = minimize(lambda a: a @ P @ a, start, jac=lambda a: 2 * P @ a, method="SLSQP", bounds=[(0, 1)] * m,
                     constraints=[{"type": "eq", "fun": lambda a: a.sum() - 1}], options={"ftol": 1e-15, "maxiter": 500})
        if best is None or r.fun < best.fun:
            best = r
    return best.x, best.fun


def test_simplex_qp_matches_a_grid_over_the_simplex():
    """m = 3: every point of a 1/300 grid of the simplex; the solver's value is never above the grid's best."""
    rng = np.random.default_rng(0)
    P = _random_psd(rng, 6, 3, rank=2)
    alpha = simplex_qp(torch.as_tensor(P)).numpy()
    k = 300
    grid = np.array([(i, j, k - i - j) for i in range(k + 1) for j in range(k + 1 - i)], dtype=float) / k
    for b in range(len(P)):
        values = np.einsum("ni,ij,nj->n", grid, P[b], grid)
        best = grid[values.argmin()]
        assert alpha[b].min() >= 0 and abs(alpha[b].sum() - 1) < 1e-12
        assert alpha[b] @ P[b] @ alpha[b] <= values.min() + 1e-12
        assert np.abs(alpha[b] - best).max() <= 2.0 / k + 1e-9  # the grid's best is within a grid step or two


def test_simplex_qp_matches_scipy_on_batches_with_sparse_solutions():
    rng = np.random.default_rng(1)
    P = np.concatenate([_random_psd(rng, 5, 6), _random_psd(rng, 5, 6, rank=2)])
    # a diagonal program: weights proportional to 1 / P_jj (inverse-variance weighting)
    P[0] = np.diag([0.01, 5, 5, 5, 5, 5])
    alpha = simplex_qp(torch.as_tensor(P)).numpy()
    for b in range(len(P)):
        ref, fun = _slsqp(P[b])
        assert alpha[b] @ P[b] @ alpha[b] <= fun + 1e-10, b
        if np.linalg.eigvalsh(P[b])[0] > 1e-6:  # strictly convex: one minimizer
            np.testing.assert_allclose(alpha[b], ref, atol=1e-5)
    np.testing.assert_allclose(alpha[0], np.array([100, 0.2, 0.2, 0.2, 0.2, 0.2]) / 101, atol=1e-12)


def test_simplex_qp_with_a_zero_cost_partner_stays_finite():
    """Clients 0 and 1 identical with no variance: client 0's program reaches 0 on their edge (P singular)."""
    h = torch.tensor([[[1.0, 0.0]], [[1.0, 0.0]], [[0.0, 1.0]]], dtype=torch.float64)
    alpha = combination_weights(h, torch.tensor([0.0, 0.0, 1.0]), torch.tensor([10.0, 10.0, 10.0]))
    assert torch.isfinite(alpha).all() and torch.allclose(alpha.sum(1), torch.ones(3, dtype=torch.float64))
    assert float(alpha[0, :2].sum()) > 1 - 1e-6 and float(alpha[1, :2].sum()) > 1 - 1e-6


def test_combination_weights_equal_the_loop_form_of_the_program():
    """The matrix of client i's program, written as the paper's sums: sum_k <h_i[k] - h_j[k], h_i[k] - h_l[k]>
    plus V_j / n_j on the diagonal; scipy minimizes it; rows sum to one."""
    rng = np.random.default_rng(2)
    m, C, d = 5, 4, 3
    h = rng.normal(size=(m, C, d))
    v = rng.uniform(0.5, 2.0, m)
    n = rng.integers(5, 40, m).astype(float)
    alpha = combination_weights(torch.as_tensor(h), torch.as_tensor(v), torch.as_tensor(n)).numpy()
    for i in range(m):
        P = np.zeros((m, m))
        for j, l in itertools.product(range(m), range(m)):
            P[j, l] = sum(float((h[i, k] - h[j, k]) @ (h[i, k] - h[l, k])) for k in range(C))
        P += np.diag(v / n)
        ref, fun = _slsqp(P)
        np.testing.assert_allclose(alpha[i], ref, atol=1e-5)
        assert alpha[i] @ P @ alpha[i] <= fun + 1e-10
    # identical clients share everything: each row is the variance-optimal 1 / (V_j / n_j) weighting
    same = combination_weights(torch.as_tensor(np.repeat(h[:1], m, 0)), torch.as_tensor(v), torch.as_tensor(n))
    inv = n / v
    np.testing.assert_allclose(same.numpy(), np.tile(inv / inv.sum(), (m, 1)), atol=1e-9)


def test_feature_statistics_equal_their_definitions():
    from pfl_cli.fl.prototypes import ClassSums

    rng = np.random.default_rng(3)
    C, d = 3, 4
    feats = [rng.normal(size=(n, d)) for n in (7, 12)]
    labels = [rng.integers(0, 2, 7), rng.integers(0, 3, 12)]
    counts = np.stack([np.bincount(y, minlength=C) for y in labels]).astype(float)
    sums = np.stack([np.stack([f[y == k].sum(0) for k in range(C)]) for f, y in zip(feats, labels)])
    sq = np.stack([[float((f[y == k] ** 2).sum()) for k in range(C)] for f, y in zip(feats, labels)])
    h, v, n = feature_statistics(ClassSums(*(torch.as_tensor(a) for a in (counts, sums, sq))))
    for i, (f, y) in enumerate(zip(feats, labels)):
        p = counts[i] / len(y)
        mus = [f[y == k].mean(0) if (y == k).any() else np.zeros(d) for k in range(C)]
        want_v = sum(p[k] * np.trace(f[y == k].T @ f[y == k] / max((y == k).sum(), 1)) - p[k] ** 2 * mus[k] @ mus[k]
                     for k in range(C))
        np.testing.assert_allclose(h[i].numpy(), np.stack([p[k] * mus[k] for k in range(C)]), atol=1e-12)
        assert np.isclose(float(v[i]), want_v) and float(n[i]) == len(y)


# ----------------------------------------------------------------------------- a round
def _client_reference(alg, start, client, batches, prototypes, seen):
    """One client: statistics of the received body, head epoch(s) with torch.optim.SGD at head_lr, body epoch(s)
    on CE + lambda ||f - c_y||^2, then its prototypes."""
    cfg, store = alg.cfg, alg.store
    p = {k: v.clone() for k, v in start.items()}
    fit = store.fit.index[client, :int(store.fit.length[client])]
    x_all, y_all = store.inputs(fit), store.y[fit]

    def feats(params):
        with torch.no_grad():
            return functional_call(alg.net, params, (x_all,), {"parts": True})[0].double()

    def stats(f):
        n = len(y_all)
        h = torch.zeros(store.num_classes, f.shape[1], dtype=torch.float64)
        v = 0.0
        for k in range(store.num_classes):
            fk = f[y_all == k]
            if len(fk):
                pk, mu = len(fk) / n, fk.mean(0)
                h[k] = pk * mu
                v += pk * float(torch.trace(fk.T @ fk / len(fk))) - pk ** 2 * float(mu @ mu)
        return h, v, n

    h, v, n = stats(feats(p))
    for part, (index, mask, active) in zip(("head", "body"), batches):
        names = alg.head if part == "head" else alg.body
        leaves = {k: p[k].clone().requires_grad_(True) for k in names}
        opt = torch.optim.SGD(list(leaves.values()), lr=cfg.head_lr if part == "head" else cfg.lr,
                              momentum=cfg.momentum, weight_decay=2 * cfg.lambda_theta)
        for s in range(index.shape[1]):
            if active is not None and not bool(active[client_pos(batches, client), s]):
                continue
            real = mask[client_pos(batches, client), s] > 0
            idx = index[client_pos(batches, client), s][real]
            x, y = store.inputs(idx), store.y[idx]
            f, logits = functional_call(alg.net, {**p, **leaves}, (x,), {"parts": True})
            loss = F.cross_entropy(logits, y)
            if part == "body" and prototypes is not None:
                loss = loss + cfg.fedpac_lambda * (((f - prototypes[y]) ** 2).sum(-1) * seen[y]).mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
        p.update({k: t.detach() for k, t in leaves.items()})
    f = feats(p)
    protos = torch.stack([f[y_all == k].mean(0) if (y_all == k).any() else torch.zeros(f.shape[1], dtype=f.dtype)
                          for k in range(store.num_classes)])
    counts = torch.bincount(y_all, minlength=store.num_classes).double()
    return p, (h, v, n), protos, counts


_POS = {}


def client_pos(batches, client):
    return _POS[client]


def _round_reference(alg, c, g):
    cfg, store = alg.cfg, alg.store
    start_body = {k: alg.global_params[k].clone() for k in alg.body}
    heads = alg.private.gather(c)
    draws = [CohortBatches(store.fit, c, None, cfg.batch_size, g, epochs=e).materialize()
             for e in (cfg.head_epochs, cfg.body_epochs)]
    prototypes = alg.prototypes.clone() if bool(alg.seen.any()) else None
    seen = alg.seen.float()
    out = []
    for i, client in enumerate(c.tolist()):
        _POS[client] = i
        start = {**start_body, **{k: v[i] for k, v in heads.items()}}
        out.append(_client_reference(alg, start, client, draws, prototypes, seen))
    size = store.fit.length[c].double()
    body = {k: sum(float(size[i] / size.sum()) * out[i][0][k] for i in range(len(c))) for k in alg.body}
    counts = torch.stack([o[3] for o in out])
    pooled = sum(o[2] * o[3][:, None] for o in out) / counts.sum(0).clamp_min(1)[:, None]
    new_protos = torch.where((counts.sum(0) > 0)[:, None], pooled.float(), alg.prototypes)
    m = len(c)
    H = [o[1][0] for o in out]
    alphas = []
    for i in range(m):
        P = np.array([[float(((H[i] - H[j]) * (H[i] - H[l])).sum()) for l in range(m)] for j in range(m)])
        P += np.diag([out[j][1][1] / out[j][1][2] for j in range(m)])
        alphas.append(_slsqp(P)[0])
    new_heads = {k: torch.stack([sum(float(alphas[i][j]) * out[j][0][k] for j in range(m)) for i in range(m)])
                 for k in alg.head}
    return body, new_protos, new_heads, np.array(alphas)


@pytest.mark.parametrize("rounds_before", [0, 1])
def test_round_equals_the_per_client_loop(store, rounds_before):
    """Round 0 (no prototypes yet: cross-entropy only) and round 1 (the alignment to the round-0 prototypes)."""
    alg = make_algorithm(BASE, store)
    c = cohort(store)
    for t in range(rounds_before):
        alg.run_round(t, c, gen(t))
    body, protos, heads, alphas = _round_reference(alg, c, gen(10))
    alg.run_round(rounds_before, c, gen(10))
    for k in alg.body:
        torch.testing.assert_close(alg.global_params[k], body[k], **TOL, msg=k)
    torch.testing.assert_close(alg.prototypes, protos, **TOL)
    assert bool(alg.seen.any())
    np.testing.assert_allclose(alg.last_alpha.numpy(), alphas, atol=2e-4)
    got = alg.private.gather(c)
    for k in alg.head:
        torch.testing.assert_close(got[k], heads[k], atol=1e-4, rtol=1e-3, msg=k)
    # the personalized prediction of a train client: the global body with its combined head
    own = alg.own_models(c[:1])
    for k in alg.body:
        assert torch.equal(own[k][0], alg.global_params[k])
    for k in alg.head:
        assert torch.equal(own[k][0], got[k][0])


def test_prototypes_of_classes_no_cohort_client_holds_are_kept(store):
    from pfl_cli.fl.prototypes import merge_prototypes

    prev = torch.arange(6.0).reshape(3, 2)
    seen = torch.tensor([True, False, False])
    protos = torch.tensor([[[1.0, 1.0], [0.0, 0.0], [2.0, 2.0]], [[3.0, 3.0], [0.0, 0.0], [0.0, 0.0]]])
    counts = torch.tensor([[1.0, 0.0, 2.0], [3.0, 0.0, 0.0]])
    new, now = merge_prototypes(prev, seen, protos, counts)
    torch.testing.assert_close(new, torch.tensor([[2.5, 2.5], [2.0, 3.0], [2.0, 2.0]]))
    assert now.tolist() == [True, False, True]


def test_new_clients_train_a_head_from_the_initial_one_on_the_frozen_body(store):
    alg = make_algorithm(replace(BASE, new_client_epochs=2), store)
    init = {k: v.clone() for k, v in alg.init_head.items()}
    alg.run_round(0, cohort(store), gen())
    new = store.clients(1)[:2]
    params, personalized = alg.personalize(new, gen(1))
    assert personalized and alg.client_sgd_steps > 0
    for k in alg.body:
        assert torch.equal(params[k][0], alg.global_params[k]), k
    assert any(not torch.equal(params[k][0], init[k]) for k in alg.head)
    zero = make_algorithm(replace(BASE, new_client_epochs=0), store)
    p0, _ = zero.personalize(new, gen())
    for k in alg.head:
        assert torch.equal(p0[k][1], init[k])


def test_floats_per_client_round_counts_body_head_prototypes_and_statistics(store):
    alg = make_algorithm(BASE, store)
    alg.run_round(0, cohort(store), gen())
    alg.traffic.close_round(4)
    per = alg.exchanged()
    body, head = 64 * 16 + 16, 16 * 10 + 10
    assert per["down"] == {"body": body, "prototypes": 10 * 16, "personalized_head": head}
    assert per["up"] == {"body": body, "head": head, "prototypes": 160, "class_counts": 10, "statistics_h": 160,
                         "statistics_v": 1}
    total = sum(per["down"].values()) + sum(per["up"].values())
    assert total == type(alg).floats_per_client_round(alg.arch)


@pytest.mark.parametrize("opts,message", [
    ({"fedpac_lambda": -1.0}, "fedpac_lambda must be a finite number >= 0 for fedpac; got -1.0"),
    ({"fedpac_lambda": float("nan")}, "fedpac_lambda must be a finite number"),
    ({"fedpac_lambda": True}, "fedpac_lambda must be a number; got true"),
    ({"head_lr": 0.0}, "head_lr must be a finite number > 0"),
    ({"head_epochs": -1}, "head_epochs must be an integer >= 0"),
    ({"body_epochs": 1.5}, "body_epochs must be an integer; got 1.5"),
    ({"new_client_epochs": -2}, "new_client_epochs must be an integer >= 0"),
    ({"head_epochs": 0, "body_epochs": 0}, "fedpac needs local training; got 0 epochs on both"),
])
def test_bad_values_are_refused_naming_the_key(opts, message):
    assert_config_refused("fedpac", opts, message)


def test_a_key_of_another_algorithm_is_refused_with_did_you_mean():
    assert_unknown_key("fedpac", "fedpac_lambd", ".*did you mean 'fedpac_lambda'")
    assert_unknown_key("fedpac", "gpfl_lambda", ".*gpfl")


def test_the_default_alignment_weight_is_one_over_the_feature_width(store):
    assert make_algorithm(replace(BASE, fedpac_lambda=None), store).alignment_weight == 1 / 16
    assert make_algorithm(BASE, store).alignment_weight == 0.5


def test_config_defaults_and_sources():
    import dataclasses

    cfg = train_config("fedpac")
    with pytest.raises(dataclasses.FrozenInstanceError):
        cfg.lr = 1.0
    assert (cfg.fedpac_lambda, cfg.head_epochs, cfg.body_epochs, cfg.head_lr, cfg.batch_size) == (None, 1, 5, 0.1, 50)
    own = {f.name: f for f in dataclasses.fields(cfg)}
    for name in ("fedpac_lambda", "head_epochs", "body_epochs", "head_lr", "lr", "momentum", "batch_size"):
        assert own[name].metadata["source"], name
