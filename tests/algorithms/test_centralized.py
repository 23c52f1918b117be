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


# ----------------------------------------------------------------------------- --dp: DP-SGD on the pool
DP = dict(dp_epsilon=4.0, dp_delta=1e-5, dp_clip=0.3, dp_sampling_rate=0.03, dp_noise="seeded", normalize=False,
          client_clip=train_config("centralized").client_clip, clients_per_round=2, local_steps=2)


def dp_alg(store, **opts):
    from pfl_cli.algorithms.centralized import Centralized

    alg = alg_for(store, **{**DP, **opts})
    alg.dp = Centralized.plan_dp(alg.cfg, store)
    return alg


def test_dp_rounds_equal_a_per_record_dp_sgd_reference(store):
    """Two --dp rounds against Abadi et al. 2016, Alg. 1 written out: Poisson batches over the pool, each record's
    gradient by its own backward pass, clipped to C, summed, N(0, (zC)^2) added (the seeded stream's draws),
    divided by the batch size, one torch.optim.SGD whose momentum crosses the rounds."""
    from pfl_cli.privacy.randomness import mechanism_generator

    alg = dp_alg(store)
    cfg, dp = alg.cfg, alg.dp
    assert dp.steps == cfg.rounds * cfg.clients_per_round * cfg.local_steps and dp.noise_multiplier > 0.5
    net = build(alg.arch["client"])
    net.load_state_dict({k: v.clone() for k, v in alg.global_params.items()})
    names = [k for k, _ in net.named_parameters()]
    opt = torch.optim.SGD(net.parameters(), lr=cfg.lr, momentum=cfg.momentum, weight_decay=2 * cfg.lambda_theta)
    pool = pooled_samples(store)
    steps = cfg.clients_per_round * cfg.local_steps
    drawn = 0
    for t, clients in enumerate(cohorts(store)):
        alg.run_round(t, clients, gen(t))
        keep = torch.rand((1, steps, len(pool)), generator=gen(t)) < cfg.dp_sampling_rate   # Poisson, rate q
        noise = mechanism_generator(cfg, f"dp-noise-{t}")
        for s in range(steps):
            total = {k: torch.zeros_like(p) for k, p in net.named_parameters()}
            for j in pool[keep[0, s]].tolist():
                loss = F.cross_entropy(net(store.inputs(torch.tensor([j]))), store.y[[j]])
                g = torch.autograd.grad(loss, list(net.parameters()))
                norm = torch.sqrt(sum((x.double() ** 2).sum() for x in g))
                scale = min(1.0, cfg.dp_clip / float(norm))
                for k, x in zip(names, g):
                    total[k] += scale * x
                drawn += 1
            for k, p in net.named_parameters():
                z = torch.randn((1, *p.shape), generator=noise)[0]
                p.grad = (total[k] + dp.noise_multiplier * cfg.dp_clip * z) / cfg.batch_size
            opt.step()
        close(alg.global_params, {k: v.detach() for k, v in net.named_parameters()})
    assert drawn > 0


def test_dp_ledger_is_the_pooled_steps_at_the_calibrated_noise(store):
    """privacy.json's event: rounds x clients_per_round x local_steps Poisson-sampled Gaussian steps at rate q, whose
    epsilon at delta (dp_accounting's RDP accountant, composed here) is the target; nothing read from the data."""
    import dp_accounting
    from dp_accounting.rdp import RdpAccountant

    alg = dp_alg(store, rounds=7)
    cfg, dp = alg.cfg, alg.dp
    steps = 7 * cfg.clients_per_round * cfg.local_steps
    acc = RdpAccountant()
    acc.compose(dp_accounting.PoissonSampledDpEvent(cfg.dp_sampling_rate,
                                                    dp_accounting.GaussianDpEvent(dp.noise_multiplier)), steps)
    assert abs(acc.get_epsilon(cfg.dp_delta) - cfg.dp_epsilon) < 0.01 * cfg.dp_epsilon
    assert dp.steps == steps and dp.unit == "example" and dp.denominator == cfg.batch_size
    assert "central DP-SGD on the pooled train records" in dp.note()
    assert dp.ledger().unit == "example" and dp.ledger().events == (dp.event(),)
    # public inputs only: another store (other records, other sizes) plans the same mechanism
    assert type(alg).plan_dp(cfg, None) == dp


@pytest.mark.parametrize("opts, message", [
    ({"dp_sampling_rate": None}, "centralized --dp needs --set dp_sampling_rate=Q"),
    # (DP's local_steps back at its default: beside local_epochs a set local_steps is refused first, as ignored)
    ({"local_epochs": 2, "local_steps": train_config("centralized").local_steps},
     "local_epochs under --dp: centralized's steps a round would follow the private client"),
    ({"clients_per_round": None}, "clients_per_round null under --dp"),
    ({"client_clip": 3.0}, "client_clip under --dp: DP-SGD clips each record's gradient to --dp clip=C"),
])
def test_dp_refusals_name_the_key(opts, message):
    from pfl_cli.fl.api import validate_train_config

    validate_train_config(train_config("centralized", **DP))   # the base passes
    with pytest.raises(ConfigError) as err:
        validate_train_config(train_config("centralized", **{**DP, **opts}))
    assert message in str(err.value) and "\n" not in str(err.value), str(err.value)
