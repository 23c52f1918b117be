"""The centralized reference against a slow reference written here: torch.optim.SGD on one copy of the net over
the pooled train splits, its momentum buffer kept across rounds, as many steps a round as the federated cohort
takes in all; the refusals."""

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from baseline_support import alg_factory, close, gen
from pfl_cli.errors import ConfigError, InputError
from pfl_cli.fl.batches import CohortBatches
from pfl_cli.fl.store import ROLE_TRAIN
from pfl_cli.models import build
from pfl_cli.registry import train_config
from pflx_testing import small_config

BASE = small_config("centralized", mlp_hidden=(16,), local_steps=3, batch_size=8, lr=0.05, clients_per_round=4,
                    momentum=0.9, client_clip=0.5, lambda_theta=0.01)
alg_for = alg_factory(BASE)
COHORTS = ([0, 3, 5, 9], [3, 9, 1])


def cohorts(store):
    train = store.clients(ROLE_TRAIN)
    return [torch.as_tensor(train[c]) for c in COHORTS]


def pooled_samples(store):
    """The fit samples of every train client, client after client (what the reference trains on)."""
    out = []
    for j in store.clients(ROLE_TRAIN):
        n = int(store.fit.length[j])
        out.append(store.fit.index[j, :n])
    return torch.cat(out)


@pytest.mark.parametrize("epochs", [None, 1])
def test_two_rounds_equal_torch_sgd_on_the_pooled_data(store, epochs):
    alg = alg_for(store, local_epochs=epochs)
    cfg = alg.cfg
    net = build(alg.arch["client"])
    net.load_state_dict({k: v.clone() for k, v in alg.global_params.items()})
    opt = torch.optim.SGD(net.parameters(), lr=cfg.lr, momentum=cfg.momentum, weight_decay=2 * cfg.lambda_theta)
    pool = pooled_samples(store)
    assert torch.equal(alg.pool.index[0, :len(pool)], pool) and int(alg.pool.length[0]) == len(pool)
    for t, clients in enumerate(cohorts(store)):
        alg.run_round(t, clients, gen(t))
        n = store.fit.length[clients]
        steps = (len(clients) * cfg.local_steps if epochs is None
                 else int((epochs * torch.ceil(n / cfg.batch_size)).sum()))          # the cohort's steps in all
        index, mask, _ = CohortBatches(alg.pool, torch.zeros(1, dtype=torch.long), steps, cfg.batch_size,
                                       gen(t)).materialize()
        assert index.shape[1] == steps
        for s in range(steps):
            idx, m = index[0, s], mask[0, s]
            loss = (F.cross_entropy(net(store.inputs(idx)), store.y[idx], reduction="none") * m).sum() / m.sum()
            opt.zero_grad()
            loss.backward()
            torch.nn.utils.clip_grad_norm_(net.parameters(), cfg.client_clip)
            opt.step()                                   # one optimizer: its momentum buffer crosses rounds
        close(alg.global_params, {k: v.detach() for k, v in net.named_parameters()})


def test_a_round_takes_the_federated_cohorts_steps(store):
    for epochs in (None, 2):
        alg = alg_for(store, local_epochs=epochs)
        fedavg = alg_for(store, algorithm="fedavg", local_epochs=epochs)
        clients = cohorts(store)[0]
        batches = fedavg.local_batches(clients, gen(0), **fedavg.round_schedule())
        assert alg.round_steps(clients) == batches.active_steps()


def test_nothing_is_exchanged_and_the_model_is_one(store):
    alg = alg_for(store)
    clients = cohorts(store)[0]
    alg.run_round(0, clients, gen(0))
    alg.traffic.close_round(len(clients))
    assert alg.exchanged() in ({}, {"down": {}, "up": {}}) and type(alg).floats_per_client_round(alg.arch) == 0
    params, personalized = alg.personalize(np.asarray(store.clients(ROLE_TRAIN))[:3], gen(1))
    assert personalized is False and params is alg.global_params


def test_train_clients_without_labels_leave_nothing_to_pool(digits_clients):
    from pfl_cli.fl import train_federated

    ds, part = digits_clients
    with pytest.raises(InputError, match=r"^centralized: training needs train clients with labels; none of the 16"):
        train_federated(ds.x, ds.y, 10, part, BASE, device="cpu", labeled=np.zeros(len(ds.y), dtype=bool))


def test_refusals():
    for k in ("server_lr", "server_momentum"):
        with pytest.raises(ConfigError, match=f"{k} has no effect on algorithm 'centralized'"):
            train_config("centralized", **{k: 0.5})
    with pytest.raises(ConfigError, match="unknown key 'alpha' for algorithm 'centralized'"):
        train_config("centralized", alpha=0.1)
