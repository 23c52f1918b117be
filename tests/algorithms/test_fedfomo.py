"""FedFomo against a slow per-client reference of its paper's Alg. 1 and Eq. 3-7.

Two rounds of the real (cohort-vectorized) algorithm; the reference replays each round's draws (the same
generator seed) through a loop over clients written here: each received model scored by a plain forward
over the client's validation samples, the weights and the move by hand, then local SGD one client at a
time (autograd of one batch, the clipped momentum step by hand). The second round's cohort overlaps the
first's, so a client's stored model and its affinity row are read back.
"""

import pytest
import torch
import torch.nn.functional as F
from torch.func import functional_call

from baseline_support import alg_factory, assert_unknown_key, close, gen
from pfl_cli.errors import ConfigError, InputError
from pfl_cli.fl.batches import sample_batches
from pfl_cli.fl.store import ROLE_TRAIN
from pfl_cli.models import num_parameters
from pfl_cli.registry import train_config
from pflx_testing import small_config

BASE = small_config(algorithm="fedfomo", mlp_hidden=(16,), local_steps=4, batch_size=8, lr=0.05, clients_per_round=4,
                    momentum=0.9, client_clip=0.5, lambda_theta=0.0, fomo_models=3)
alg_for = alg_factory(BASE)
COHORTS = ([0, 3, 5, 9], [3, 9, 1, 7])  # positions among the train clients; 3 and 9 train twice


def cohorts(store):
    train = store.clients(ROLE_TRAIN)
    return [torch.as_tensor(train[c]) for c in COHORTS]


def ref_val_loss(alg, params, client):
    """Mean cross-entropy of one model on one client's validation samples, one plain forward."""
    n = int(alg.store.val.length[client])
    idx = alg.store.val.index[client, :n]
    y = alg.store.y[idx]
    keep = y >= 0
    if not bool(keep.any()):
        return 0.0
    logits = functional_call(alg.net, params, (alg.store.inputs(idx[keep]),))
    return float(F.cross_entropy(logits, y[keep]))


def ref_fomo(alg, own, received, client):
    """Eq. 3-7 for one client: ``own`` one model, ``received`` a list of models."""
    base = ref_val_loss(alg, own, client)
    w = []
    for theta_n in received:
        dist = float(torch.sqrt(sum(((theta_n[k] - own[k]) ** 2).sum() for k in own)))
        w.append(max(0.0, (base - ref_val_loss(alg, theta_n, client)) / dist) if dist > 0 else 0.0)
    total = sum(w)
    w = [x / total for x in w] if total > 0 else [0.0] * len(w)
    return w, {k: own[k] + sum(wn * (theta_n[k] - own[k]) for wn, theta_n in zip(w, received)) for k in own}


def ref_local(alg, start, clients, g):
    """Each client alone: momentum SGD on its clipped batch gradient, the batches cohort_sgd draws from ``g``."""
    cfg = alg.cfg
    index, mask = sample_batches(alg.store.fit, clients, cfg.local_steps, cfg.batch_size, g)
    out = {k: [] for k in start}
    for i in range(len(clients)):
        y = {k: v[i].clone() for k, v in start.items()}
        buf = {k: torch.zeros_like(v) for k, v in y.items()}
        for s in range(cfg.local_steps):
            idx, m = index[i, s], mask[i, s]
            leaves = {k: v.clone().requires_grad_(True) for k, v in y.items()}
            logits = functional_call(alg.net, leaves, (alg.store.inputs(idx),))
            loss = (F.cross_entropy(logits, alg.store.y[idx], reduction="none") * m).sum() / m.sum()
            grads = dict(zip(leaves, torch.autograd.grad(loss, list(leaves.values()))))
            norm = torch.sqrt(sum(gr.pow(2).sum() for gr in grads.values()))
            scale = min(1.0, cfg.client_clip / (float(norm) + 1e-6))
            for k in y:
                buf[k] = cfg.momentum * buf[k] + grads[k] * scale
                y[k] = y[k] - cfg.lr * buf[k]
        for k in y:
            out[k].append(y[k])
    return {k: torch.stack(v) for k, v in out.items()}


@pytest.mark.parametrize("how", ["vmap", "loop"])
def test_two_rounds_equal_the_per_client_reference(store, how):
    alg = alg_for(store, algorithm="fedfomo", cohort_exec=how, fomo_models=15)  # every other client
    models = {k: v.clone() for k, v in alg.private.values.items()}  # every client's stored model
    affinity = torch.zeros(store.num_clients, store.num_clients)
    moved_any = False
    for t, clients in enumerate(cohorts(store)):
        g = gen(t)
        chosen = alg.select(t, clients, g)  # the same draws run_round makes first
        starts, weights = {k: [] for k in models}, []
        for i, c in enumerate(clients.tolist()):
            own = {k: v[c] for k, v in models.items()}
            received = [{k: v[n] for k, v in models.items()} for n in chosen[i].tolist()]
            w, moved = ref_fomo(alg, own, received, c)
            moved_any |= sum(w) > 0
            weights.append(w)
            for k in models:
                starts[k].append(moved[k])
        trained = ref_local(alg, {k: torch.stack(v) for k, v in starts.items()}, clients, g)
        alg.run_round(t, clients, gen(t))
        for i, c in enumerate(clients.tolist()):
            for k in models:
                models[k][c] = trained[k][i]
            affinity[c, chosen[i]] += torch.tensor(weights[i])
        close(alg.private.values, models)
        torch.testing.assert_close(alg.affinity, affinity, atol=1e-5, rtol=1e-4)
    assert moved_any and float(affinity.abs().sum()) > 0  # some weights were positive: the check saw a real move


def test_selection_takes_the_top_affinities_or_explores(store):
    alg = alg_for(store, algorithm="fedfomo", fomo_epsilon=0.0)
    clients = cohorts(store)[0]
    pool = alg.pool
    g = torch.Generator().manual_seed(3)
    alg.affinity[:, pool] = torch.rand(store.num_clients, len(pool), generator=g)  # distinct scores, no ties
    chosen = alg.select(0, clients, gen(0))
    for i, c in enumerate(clients.tolist()):
        others = [int(p) for p in pool if int(p) != c]
        ranked = sorted(others, key=lambda p: -float(alg.affinity[c, p]))
        assert chosen[i].tolist() == ranked[:3]
    explore = alg_for(store, algorithm="fedfomo", fomo_epsilon=1.0)
    draws = [explore.select(0, clients, gen(s)) for s in range(20)]
    for d in draws:
        assert all(c not in row.tolist() and len(set(row.tolist())) == 3 for c, row in zip(clients.tolist(), d))
    assert len({tuple(d[0].tolist()) for d in draws}) > 5  # random, not the first M of the pool


def test_epsilon_decays_to_zero(store):
    alg = alg_for(store, algorithm="fedfomo", fomo_epsilon=0.3, fomo_epsilon_decay=0.05)
    assert [round(alg.epsilon(t), 10) for t in (0, 1, 5, 6, 50)] == [0.3, 0.25, 0.05, 0.0, 0.0]


def test_floats_counted_from_the_exchanged_tensors(store):
    alg = alg_for(store, algorithm="fedfomo")
    clients = cohorts(store)[0]
    alg.run_round(0, clients, gen(0))
    alg.traffic.close_round(len(clients))
    s = alg.traffic.summary()
    measured = s["floats_down_per_client_round"] + s["floats_up_per_client_round"]
    d = num_parameters(alg.arch["client"])
    assert s["floats_down_per_client_round"] == 3 * d
    assert measured == 4 * d + 3 == type(alg).floats_per_client_round(alg.arch)


def test_new_clients_train_the_mean_model(store):
    alg = alg_for(store, algorithm="fedfomo", new_client_epochs=0)
    for t, clients in enumerate(cohorts(store)):
        alg.run_round(t, clients, gen(t))
    holdout = store.clients(1)
    assert not alg.has_state(holdout).any()
    params, personalized = alg.personalize(holdout, gen(5))
    train = torch.as_tensor(store.clients(ROLE_TRAIN))
    size = (store.fit.length + store.val.length)[train].float()
    for k, v in alg.private.values.items():
        mean = torch.einsum("c,c...->...", size / size.sum(), v[train])
        torch.testing.assert_close(params[k], mean.expand_as(params[k]), atol=1e-6, rtol=1e-5)
    trained = alg_for(store, algorithm="fedfomo", new_client_epochs=1)
    trained.private.load_state(alg.private.state())
    moved, _ = trained.personalize(holdout, gen(5))
    assert float((moved["fc1.weight"] - params["fc1.weight"]).abs().max()) > 0
    assert trained.protocol(True)["protocol"] == "train clients' mean model trained 1 epochs"


def test_refusals():
    with pytest.raises(ConfigError, match=r"^fomo_models must be an integer >= 1 for fedfomo; got 0\.$"):
        train_config("fedfomo", fomo_models=0)
    with pytest.raises(ConfigError, match=r"^fomo_epsilon must be a probability in \[0, 1\] for fedfomo"):
        train_config("fedfomo", fomo_epsilon=1.5)
    with pytest.raises(ConfigError, match=r"^fomo_epsilon_decay must be a finite number >= 0 for fedfomo; got -0.1"):
        train_config("fedfomo", fomo_epsilon_decay=-0.1)
    with pytest.raises(ConfigError, match=r"^val_fraction must be > 0 for fedfomo"):
        train_config("fedfomo", val_fraction=0.0)
    assert_unknown_key("fedfomo", "alpha", r" \(a key of ")
    assert_unknown_key("fedavg", "fomo_models", r" \(a key of fedfomo\)")


def test_a_single_labeled_client_is_refused(store):
    alg = alg_for(store, algorithm="fedfomo")
    alg.pool = alg.pool[:1]
    with pytest.raises(InputError, match="fedfomo: each client weighs other clients' models"):
        alg.check_trainable(torch.as_tensor(store.clients(ROLE_TRAIN)))


def test_keys_this_partition_leaves_without_effect_are_refused(store):
    """M above the 15 other train clients cannot be honoured; with M = 15 every client gets every other model,
    whatever epsilon (the default M = 5 is capped silently on a smaller partition, as the docstring says)."""
    train = torch.as_tensor(store.clients(ROLE_TRAIN))
    with pytest.raises(InputError, match=r"^fomo_models must be at most the 15 other train clients with labels "
                                         r"for fedfomo .*got 16\."):
        alg_for(store, fomo_models=16).check_trainable(train)
    alg_for(store, fomo_models=15).check_trainable(train)
    for key in ("fomo_epsilon", "fomo_epsilon_decay"):
        with pytest.raises(ConfigError, match=f"^{key} has no effect on algorithm 'fedfomo' because M = 15 sends"):
            alg_for(store, fomo_models=15, **{key: 0.1}).check_trainable(train)
    alg_for(store, fomo_models=14, fomo_epsilon=0.1).check_trainable(train)
