"""APPLE against a slow per-client reference of its §3: the personalized model sum_j p_ij theta_j, the core model
and the DR vector trained together with the proximal term lambda(r) ||p_i - p^0||^2.

Two rounds of the real (cohort-vectorized) algorithm; the reference replays each round's batches (the same
generator seed) one client at a time: the mixture built term by term from the core models stored at the start of
the round, autograd of one batch loss with respect to the client's own core model and its DR vector, the clipped
momentum steps by hand. The second round's cohort overlaps the first's, so a client's stored core model and DR
vector are read back, and the other clients' uploaded cores enter the mixtures.
"""

import math

import pytest
import torch
import torch.nn.functional as F
from torch.func import functional_call

from baseline_support import alg_factory, assert_unknown_key, close, gen
from pfl_cli.algorithms.apple import reg_weight
from pfl_cli.errors import ConfigError, InputError
from pfl_cli.fl.batches import sample_batches
from pfl_cli.fl.store import ROLE_TRAIN
from pfl_cli.models import num_parameters
from pfl_cli.registry import train_config
from pflx_testing import small_config

BASE = small_config(algorithm="apple", mlp_hidden=(16,), local_steps=4, batch_size=8, lr=0.05, clients_per_round=4,
                    momentum=0.9, client_clip=0.5, lambda_theta=0.0, apple_dr_lr=0.05, apple_mu=0.5,
                    apple_reg_rounds=1.0, apple_schedule="cosine", rounds=4)
alg_for = alg_factory(BASE)
COHORTS = ([0, 3, 5, 9], [3, 9, 1, 7])  # positions among the train clients; 3 and 9 train twice


def cohorts(store):
    train = store.clients(ROLE_TRAIN)
    return [torch.as_tensor(train[c]) for c in COHORTS]


def ref_round(alg, cores, ps, p0, clients, g, lam):
    """Each client alone: ``cores`` list of N models (dicts), ``ps`` (n_store, N); returns new cores and DR vectors."""
    cfg = alg.cfg
    index, mask = sample_batches(alg.store.fit, clients, cfg.local_steps, cfg.batch_size, g)
    pool = alg.pool.tolist()
    new_cores, new_ps = [], []
    for i, c in enumerate(clients.tolist()):
        me = pool.index(c)
        core = {k: v.clone() for k, v in cores[me].items()}
        p = ps[c].clone()
        buf = {k: torch.zeros_like(v) for k, v in core.items()}
        pbuf = torch.zeros_like(p)
        for s in range(cfg.local_steps):
            idx, m = index[i, s], mask[i, s]
            leaves = {k: v.clone().requires_grad_(True) for k, v in core.items()}
            q = p.clone().requires_grad_(True)
            hat = {k: sum(q[j] * (leaves[k] if j == me else cores[j][k]) for j in range(len(cores))) for k in core}
            logits = functional_call(alg.net, hat, (alg.store.inputs(idx),))
            loss = (F.cross_entropy(logits, alg.store.y[idx], reduction="none") * m).sum() / m.sum()
            loss = loss + lam * ((q - p0) ** 2).sum()
            grads = torch.autograd.grad(loss, [*leaves.values(), q])
            gcore = dict(zip(leaves, grads[:-1]))
            norm = torch.sqrt(sum(gr.pow(2).sum() for gr in gcore.values()))
            scale = min(1.0, cfg.client_clip / (float(norm) + 1e-6))
            for k in core:
                buf[k] = cfg.momentum * buf[k] + gcore[k] * scale
                core[k] = core[k] - cfg.lr * buf[k]
            pbuf = cfg.momentum * pbuf + grads[-1]
            p = p - cfg.apple_dr_lr * pbuf
        new_cores.append(core)
        new_ps.append(p)
    return new_cores, new_ps


@pytest.mark.parametrize("how", ["vmap", "loop"])
def test_two_rounds_equal_the_per_client_reference(store, how):
    alg = alg_for(store, cohort_exec=how)
    pool = alg.pool.tolist()
    values = alg.private.values
    cores = [{k: values["core." + k][c].clone() for k in alg.names} for c in pool]
    ps = values["p"].clone()
    size = (store.fit.length + store.val.length)[alg.pool].float()
    p0 = size / size.sum()
    torch.testing.assert_close(ps[pool[0]], p0)
    for t, clients in enumerate(cohorts(store)):
        lam = 0.5 * (math.cos(math.pi * t / 4) + 1) / 2
        new_cores, new_ps = ref_round(alg, cores, ps, p0, clients, gen(t), lam)
        alg.run_round(t, clients, gen(t))
        for c, core, p in zip(clients.tolist(), new_cores, new_ps):
            cores[pool.index(c)] = core
            ps[c] = p
        close({k: values["core." + k][alg.pool] for k in alg.names},
              {k: torch.stack([cr[k] for cr in cores]) for k in alg.names})
        torch.testing.assert_close(alg.private.values["p"], ps, atol=1e-6, rtol=1e-4)
        values = alg.private.values
    moved = ps[clients] - p0
    assert float(moved.abs().max()) > 1e-4  # the DR vectors moved off p^0: the check compared real updates
    # a train client's personalized model is its DR vector's mixture of the current core models
    own = alg.own_models(clients[:1])
    for k in alg.names:
        want = sum(ps[int(clients[0])][j] * cores[j][k] for j in range(len(pool)))
        torch.testing.assert_close(own[k][0], want, atol=1e-5, rtol=1e-4)


def test_schedules():
    assert reg_weight(0, 100, 0.1, 0.1, "cosine") == 0.1
    assert reg_weight(5, 100, 0.1, 0.1, "cosine") == pytest.approx(0.05)
    assert reg_weight(10, 100, 0.1, 0.1, "cosine") == 0.0 == reg_weight(50, 100, 0.1, 0.1, "exponential")
    assert reg_weight(5, 100, 0.1, 0.1, "exponential") == pytest.approx(0.1 * 1e-3 ** 0.5)
    assert reg_weight(3, 100, 0.0, 0.1, "cosine") == 0.0


def test_floats_counted_from_the_exchanged_tensors(store):
    alg = alg_for(store)
    clients = cohorts(store)[0]
    alg.run_round(0, clients, gen(0))
    alg.traffic.close_round(len(clients))
    s = alg.traffic.summary()
    n, d = len(alg.pool), num_parameters(alg.arch["client"])
    assert s["floats_down_per_client_round"] == (n - 1) * d and s["floats_up_per_client_round"] == d
    assert type(alg).floats_per_client_round(alg.arch) == n * d


def test_new_clients_get_the_p0_mixture(store):
    alg = alg_for(store, new_client_epochs=0)
    for t, clients in enumerate(cohorts(store)):
        alg.run_round(t, clients, gen(t))
    holdout = store.clients(1)
    assert not alg.has_state(holdout).any()
    params, personalized = alg.personalize(holdout, gen(5))
    size = (store.fit.length + store.val.length)[alg.pool].float()
    for k in alg.names:
        mean = torch.einsum("n,n...->...", size / size.sum(), alg.private.values["core." + k][alg.pool])
        torch.testing.assert_close(params[k], mean.expand_as(params[k]), atol=1e-6, rtol=1e-5)
    trained = alg_for(store, new_client_epochs=1)
    trained.private.load_state(alg.private.state())
    moved, _ = trained.personalize(holdout, gen(5))
    assert float((moved["fc1.weight"] - params["fc1.weight"]).abs().max()) > 0
    assert trained.protocol(True)["protocol"] == "p0 mixture of the core models trained 1 epochs"


def test_refusals():
    with pytest.raises(ConfigError, match=r"^apple_dr_lr must be a finite number > 0 for apple; got 0.0\.$"):
        train_config("apple", apple_dr_lr=0.0)
    with pytest.raises(ConfigError, match=r"^apple_mu must be a finite number >= 0 for apple; got -1.0\.$"):
        train_config("apple", apple_mu=-1.0)
    with pytest.raises(ConfigError, match=r"^apple_reg_rounds must be a fraction in \(0, 1\] for apple; got 0.0\.$"):
        train_config("apple", apple_reg_rounds=0.0)
    with pytest.raises(ConfigError, match="apple_schedule"):
        train_config("apple", apple_schedule="linear")
    assert_unknown_key("apple", "fomo_models", r" \(a key of fedfomo\)")


def test_a_single_labeled_client_is_refused(store):
    alg = alg_for(store)
    alg.pool = alg.pool[:1]
    with pytest.raises(InputError, match="apple: each client mixes the core models"):
        alg.check_trainable(torch.as_tensor(store.clients(ROLE_TRAIN)))


def test_keys_this_run_leaves_without_effect_are_refused(store):
    """The proximal term acts in rounds r < L = int(rounds x apple_reg_rounds): with L = 0 its keys change
    nothing, with L = 1 both schedules weigh round 0 by mu, and with mu = 0 there is nothing to schedule."""
    train = torch.as_tensor(store.clients(ROLE_TRAIN))
    short = dict(rounds=5, apple_reg_rounds=0.1, apple_schedule="exponential", apple_mu=0.1)
    for key, value in (("apple_mu", 0.5), ("apple_schedule", "cosine"), ("apple_reg_rounds", 0.15)):
        with pytest.raises(ConfigError, match=f"^{key} has no effect on algorithm 'apple' because its proximal "
                                              "term never acts in 5 rounds"):
            alg_for(store, **{**short, key: value}).check_trainable(train)
    with pytest.raises(ConfigError, match="^apple_schedule has no effect .* L = int"):
        alg_for(store, **{**short, "rounds": 10, "apple_schedule": "cosine"}).check_trainable(train)
    with pytest.raises(ConfigError, match="^apple_schedule has no effect .* apple_mu is 0"):
        alg_for(store, **{**short, "rounds": 100, "apple_mu": 0.0, "apple_schedule": "cosine"}).check_trainable(train)
    alg_for(store, **{**short, "rounds": 20, "apple_schedule": "cosine"}).check_trainable(train)
