"""FedCP (issue 35): its MMD and policy against slow references, a round against the per-client loop,
new clients, traffic and bad keys.

The round's reference replays the round's draws (batches and Gumbel noise from the same generator
seed) one client at a time with plain torch: hand-written CPN, heads and MMD, ``torch.optim.SGD``.
"""

import math

import pytest
import torch
import torch.nn.functional as F
from torch.func import functional_call

from pfl_cli.algorithms.fedcp import conditional_policy, gumbel_noise
from pfl_cli.fl.mmd import FEDCP_BANDWIDTHS, mmd2
from pfl_cli.fl.store import ROLE_HOLDOUT
from pfl_cli.registry import train_config
from baseline_support import alg_factory, assert_config_refused, assert_unknown_key, close, cohort, gen
from pflx_testing import small_config

BASE = small_config(algorithm="fedcp", mlp_hidden=(16,), local_steps=4, batch_size=8, lr=0.05, clients_per_round=4,
                    new_client_epochs=1)
alg_for = alg_factory(BASE)


# ----------------------------------------------------------------------------- numeric pieces
def _mmd2_reference(x, y, bandwidths):
    """MMD^2 from its definition, one pair of samples at a time."""
    def k(u, v):
        d2 = sum((float(a) - float(b)) ** 2 for a, b in zip(u, v))
        return sum(math.exp(-d2 / (2 * a)) for a in bandwidths)

    n = len(x)
    xx = sum(k(x[i], x[j]) for i in range(n) for j in range(n)) / n ** 2
    yy = sum(k(y[i], y[j]) for i in range(n) for j in range(n)) / n ** 2
    xy = sum(k(x[i], y[j]) for i in range(n) for j in range(n)) / n ** 2
    return xx + yy - 2 * xy


def test_mmd2_equals_the_pairwise_definition_over_the_real_samples():
    g = torch.Generator().manual_seed(0)
    x, y = torch.randn(3, 6, 4, generator=g, dtype=torch.float64) * 3, torch.randn(3, 6, 4, generator=g,
                                                                                   dtype=torch.float64) * 3 + 1
    mask = torch.tensor([[1, 1, 1, 1, 1, 1], [1, 1, 1, 0, 0, 0], [1, 0, 0, 0, 0, 0]], dtype=torch.float64)
    got = mmd2(x, y, mask)
    for i in range(3):
        real = mask[i] > 0
        want = _mmd2_reference(x[i][real].tolist(), y[i][real].tolist(), FEDCP_BANDWIDTHS)
        assert got[i].item() == pytest.approx(want, rel=1e-10, abs=1e-12)
    assert mmd2(x, x, mask).abs().max() < 1e-10            # identical samples: no discrepancy
    assert got[0] > 0 and torch.all(got >= -1e-12)


def test_policy_is_a_per_feature_softmax_of_the_two_scores_plus_gumbel_noise():
    g = torch.Generator().manual_seed(1)
    d, tau = 5, 0.7
    scores = torch.randn(4, 2 * d, generator=g, dtype=torch.float64)
    noise = torch.randn(4, 2, d, generator=g, dtype=torch.float64)
    r, s = conditional_policy(scores, tau, noise)
    for b in range(4):
        for j in range(d):
            a = (scores[b, j] + noise[b, 0, j]) / tau          # the personalized score: the first d outputs
            c = (scores[b, d + j] + noise[b, 1, j]) / tau
            want = math.exp(a) / (math.exp(a) + math.exp(c))
            assert r[b, j].item() == pytest.approx(want, rel=1e-12) and s[b, j].item() == pytest.approx(1 - want)
    r0, _ = conditional_policy(scores, tau)                    # prediction: the noise-free policy
    torch.testing.assert_close(r0, torch.sigmoid((scores[:, :d] - scores[:, d:]) / tau))


def test_gumbel_draws_are_standard_gumbel():
    z = gumbel_noise(8, torch.ones(200, 10), torch.Generator().manual_seed(2))
    assert z.shape == (200, 10, 2, 8)
    assert z.mean().item() == pytest.approx(0.5772, abs=0.02) and z.var().item() == pytest.approx(math.pi ** 2 / 6,
                                                                                                   rel=0.05)


# ----------------------------------------------------------------------------- the round
def _reference_round(alg, start, clients, steps_list, lam, tau):
    """One client at a time: CE(h^p(h r) + h^g(h s)) + lam MMD^2(f(x), f_global(x)), torch.optim.SGD."""
    store, cfg, d = alg.store, alg.cfg, alg.net.dim
    head_w = alg.weight_key
    head_b = head_w[:-len("weight")] + "bias"
    feats = [k for k in start if k.startswith("net.") and k not in (head_w, head_b)]
    out = {k: [] for k in start}
    for i, client in enumerate(clients.tolist()):
        p = {k: v[i].clone().requires_grad_(k in feats or k.startswith("cpn.") or k in (head_w, head_b))
             for k, v in start.items()}
        glob = {k: start[k][i].clone() for k in feats}
        v = start[head_w][i].sum(0)
        v = v / v.norm()
        opt = torch.optim.SGD([t for t in p.values() if t.requires_grad], lr=cfg.lr)

        for idx, m, _, noise in steps_list:
            real = m[i] > 0
            x, y = store.inputs(idx[i][real]), store.y[idx[i][real]]
            h = _mlp_features(p, x)
            z = F.relu(F.layer_norm(F.linear(h * v, p["cpn.0.weight"], p["cpn.0.bias"]), (2 * d,),
                                    p["cpn.1.weight"], p["cpn.1.bias"]))
            w = torch.softmax((z.view(-1, 2, d) + noise[i][real]) / tau, dim=1)
            logits = F.linear(h * w[:, 0], p[head_w], p[head_b]) + F.linear(h * w[:, 1], p["head_g.weight"],
                                                                              p["head_g.bias"])
            hg = _mlp_features(glob, x).detach()
            d2 = lambda a, b: torch.cdist(a, b) ** 2  # noqa: E731
            kern = lambda a, b: sum(torch.exp(-d2(a, b) / (2 * s)) for s in FEDCP_BANDWIDTHS)  # noqa: E731
            mmd = kern(h, h).mean() + kern(hg, hg).mean() - 2 * kern(h, hg).mean()
            loss = F.cross_entropy(logits, y) + lam * mmd
            opt.zero_grad()
            loss.backward()
            opt.step()
        for k in out:
            out[k].append(p[k].detach())
    return {k: torch.stack(v) for k, v in out.items()}


def _mlp_features(params, x):
    """The MLP 64-16-10's features: ReLU(fc1(x))."""
    return F.relu(F.linear(torch.flatten(x, 1), params["net.fc1.weight"], params["net.fc1.bias"]))


def test_fedcp_round_equals_the_per_client_loop(store):
    alg = alg_for(store, momentum=0.0, client_clip=0.0, fedcp_lambda=2.0, fedcp_tau=0.5)
    c = cohort(store)
    # a trained-looking start: distinct personalized heads, a global head unlike them
    g0 = torch.Generator().manual_seed(3)
    heads = {k: v + 0.3 * torch.randn(v.shape, generator=g0) for k, v in alg.private.gather(c).items()}
    alg.private.scatter(c, heads)
    start = {**{k: v.unsqueeze(0).repeat(len(c), *([1] * v.dim())) for k, v in alg.global_params.items()},
             **alg.private.gather(c)}
    # the draws as the round makes them: batches from the generator, then the noise generator's seed from it
    g = gen()
    steps, _ = alg.draw_batches(c, g, steps=alg.cfg.local_steps)
    steps = steps.with_draws((lambda m, gg: gumbel_noise(alg.net.dim, m, gg), g))
    ref = _reference_round(alg, start, c, list(steps), 2.0, 0.5)
    alg.run_round(0, c, gen())
    w = store.fit.length[c].double()
    w = w / w.sum()
    mean = {k: sum(float(w[i]) * v[i] for i in range(len(c))) for k, v in ref.items()}
    close(alg.global_params, {k: mean[k] for k in alg.extractor + alg.cpn})
    # h^g: the mean of 0.5 h^p + 0.5 h^g (the authors' clientcp.py generate_upload_head)
    close(alg.global_params, {g_: 0.5 * mean[p] + 0.5 * start[g_][0] for g_, p in alg.pairs.items()})
    close(alg.private.gather(c), {k: ref[k] for k in alg.head})


def test_exchange_is_extractor_cpn_and_a_head_each_way(store):
    alg = alg_for(store)
    c = cohort(store)
    alg.run_round(0, c, gen())
    alg.traffic.close_round(len(c))
    ex = alg.exchanged()
    total = sum(ex["down"].values()) + sum(ex["up"].values())
    assert total == alg.floats_per_client_round(alg.arch)
    cpn = 16 * 32 + 32 + 2 * 32
    assert total == 2 * ((64 * 16 + 16 + 16 * 10 + 10) + cpn)


def test_train_clients_use_their_head_and_new_clients_train_one_from_the_global_head(store):
    alg = alg_for(store, new_client_epochs=2)
    c = cohort(store)
    alg.run_round(0, c, gen())
    own, personalized = alg.personalize(c.numpy(), gen(1))
    assert personalized and alg.client_sgd_steps == 0
    close({k: own[k] for k in alg.head}, alg.private.gather(c))
    v = own[alg.weight_key].sum(1)
    torch.testing.assert_close(own["context"], v / v.norm(dim=1, keepdim=True))
    holdout = store.clients(ROLE_HOLDOUT)[:3]
    new, _ = alg.personalize(holdout, gen(2))
    assert alg.client_sgd_steps > 0
    for k in alg.extractor + alg.cpn:  # frozen: the global parts as they are
        torch.testing.assert_close(new[k], alg.global_params[k].expand_as(new[k]))
    for g_, p in alg.pairs.items():   # the personalized head moved away from the global head it started from
        assert not torch.allclose(new[p][0], alg.global_params[g_])
    again, _ = alg.personalize(holdout, gen(2))  # a deterministic protocol and a noise-free prediction
    close(again, new)
    x = store.inputs(store.test.index[int(c[0]), :4])
    one = {k: t[0] for k, t in own.items()}
    torch.testing.assert_close(functional_call(alg.net, one, (x,)), functional_call(alg.net, one, (x,)))
    zero = alg_for(store, new_client_epochs=0)
    served, _ = zero.personalize(holdout, gen())
    for g_, p in zero.pairs.items():
        torch.testing.assert_close(served[p][0], zero.global_params[g_])


def test_state_round_trips(store):
    alg = alg_for(store)
    alg.run_round(0, cohort(store), gen())
    other = alg_for(store)
    other.load_state(alg.state())
    close(other.global_params, alg.global_params)
    close(other.private.gather(cohort(store)), alg.private.gather(cohort(store)))


@pytest.mark.parametrize("opts,message", [
    ({"fedcp_lambda": -1.0}, "fedcp_lambda must be a finite number >= 0 for fedcp; got -1.0"),
    ({"fedcp_lambda": float("nan")}, "fedcp_lambda must be a finite number"),
    ({"fedcp_tau": 0.0}, "fedcp_tau must be a finite number > 0 for fedcp; got 0.0"),
    ({"fedcp_tau": True}, "fedcp_tau must be a number; got true"),
    ({"new_client_epochs": -1}, "new_client_epochs must be an integer >= 0; got -1"),
])
def test_bad_values_are_refused_naming_the_key(opts, message):
    assert_config_refused("fedcp", opts, message)


def test_a_key_of_another_algorithm_is_refused_with_did_you_mean():
    assert_unknown_key("fedcp", "fedcp_lamda", ".*did you mean 'fedcp_lambda'")
    assert_unknown_key("fedcp", "gpfl_lambda")


def test_defaults_are_the_papers():
    cfg = train_config("fedcp")
    assert cfg.fedcp_lambda == 5.0 and cfg.fedcp_tau == 1.0 and cfg.new_client_epochs == 20
