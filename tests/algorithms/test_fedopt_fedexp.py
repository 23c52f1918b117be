"""FedOpt (Reddi et al., ICLR 2021, Alg. 2) and FedExP (Jhunjhunwala et al., ICLR 2023, Alg. 1) against slow
references of their server steps.

Each round of the real algorithm is replayed: the cohort's client models come from a second instance's
local SGD on the same draws (same generator seed, same start), and the server step is recomputed
by a plain numpy float64 loop written from the papers' equations; the global models must agree to float
tolerance after three rounds, and must differ from FedAvg's (the server step acted).
"""

import numpy as np
import pytest
import torch

from baseline_support import alg_factory, cohort, gen
from pfl_cli.fl.params import broadcast
from pfl_cli.registry import entries, train_config
from pflx_testing import small_config

BASE = small_config(mlp_hidden=(16,), local_steps=4, local_epochs=None, batch_size=8, lr=0.05, momentum=0.0,
                    clients_per_round=4)
alg_for = alg_factory(BASE)
ROUNDS = 3


def client_models(alg, t, clients):
    """The cohort's models after round ``t``'s local SGD from ``alg``'s global model (the draws of ``gen(t)``)."""
    theta, _, _ = alg.cohort_sgd(broadcast(alg.global_params, len(clients)), clients, gen(t),
                                 **alg.round_schedule())
    return {k: v.detach().double().numpy() for k, v in theta.items()}


def weights_of(store, clients):
    n = store.fit.length[clients].double().numpy()
    return n / n.sum()


def as_numpy(params):
    return {k: v.detach().double().numpy().copy() for k, v in params.items()}


def reference_fedopt(x, m, v, delta, *, optimizer, lr, beta1, beta2, tau):
    """Alg. 2 (Reddi et al. 2021) element by element, float64: the new x, m, v."""
    x, m, v = dict(x), dict(m), dict(v)
    for k in x:
        d = delta[k]
        m[k] = beta1 * m[k] + (1 - beta1) * d
        if optimizer == "adagrad":
            v[k] = v[k] + d ** 2
        elif optimizer == "adam":
            v[k] = beta2 * v[k] + (1 - beta2) * d ** 2
        else:  # yogi
            v[k] = v[k] - (1 - beta2) * d ** 2 * np.sign(v[k] - d ** 2)
        x[k] = x[k] + lr * m[k] / (np.sqrt(v[k]) + tau)
    return x, m, v


@pytest.mark.parametrize("optimizer", ["adam", "yogi", "adagrad"])
def test_fedopt_rounds_equal_alg2_in_numpy(store, optimizer):
    opts = dict(algorithm="fedopt", server_optimizer=optimizer, server_lr=0.03, tau=1e-2)
    alg, twin = alg_for(store, **opts), alg_for(store, **opts)
    cfg = alg.cfg
    x = as_numpy(alg.global_params)
    m = {k: np.zeros_like(p) for k, p in x.items()}
    v = {k: np.full_like(p, cfg.tau ** 2) for k, p in x.items()}  # Alg. 2: v_{-1} >= tau^2
    for t in range(ROUNDS):
        c = cohort(store)
        twin.global_params = {k: p.clone() for k, p in alg.global_params.items()}
        theta, w = client_models(twin, t, c), weights_of(store, c)
        delta = {k: sum(w[i] * theta[k][i] for i in range(len(c))) - x[k] for k in x}
        x, m, v = reference_fedopt(x, m, v, delta, optimizer=optimizer, lr=cfg.server_lr, beta1=cfg.beta1,
                                   beta2=cfg.beta2, tau=cfg.tau)
        mean = {k: x[k] - (x[k] - delta[k]) for k in x}
        alg.run_round(t, c, gen(t))
        for k in x:
            np.testing.assert_allclose(alg.global_params[k].double().numpy(), x[k], rtol=1e-4, atol=2e-6,
                                       err_msg=f"round {t} {k}")
    # the server step acted: the global model is not the cohort's mean (FedAvg's step)
    assert max(np.abs(x[k] - mean[k]).max() for k in x) > 1e-3


def reference_fedexp(x, theta, w, eps):
    """Alg. 1 (Jhunjhunwala et al. 2023), float64, a loop over clients: the new x and eta_g."""
    deltas = [np.concatenate([(theta[k][i] - x[k]).ravel() for k in x]) for i in range(len(w))]
    mean = sum(w[i] * deltas[i] for i in range(len(w)))
    eta = max(1.0, sum(w[i] * float(deltas[i] @ deltas[i]) for i in range(len(w))) / (2 * (float(mean @ mean) + eps)))
    new, at = {}, 0
    for k in x:
        size = x[k].size
        new[k] = x[k] + eta * mean[at:at + size].reshape(x[k].shape)
        at += size
    return new, eta


def test_fedexp_rounds_equal_alg1_in_numpy(store):
    alg, twin = alg_for(store, algorithm="fedexp"), alg_for(store, algorithm="fedexp")
    x, etas = as_numpy(alg.global_params), []
    for t in range(ROUNDS):
        c = cohort(store)
        twin.global_params = {k: p.clone() for k, p in alg.global_params.items()}
        last = x
        x, eta = reference_fedexp(x, client_models(twin, t, c), weights_of(store, c), alg.cfg.eps)
        etas.append(eta)
        alg.run_round(t, c, gen(t))
        for k in x:
            np.testing.assert_allclose(alg.global_params[k].double().numpy(), x[k], rtol=1e-4, atol=2e-6,
                                       err_msg=f"round {t} {k}")
    np.testing.assert_allclose(alg.server_eta, etas, rtol=1e-4)
    assert max(etas) > 1.2, etas  # the clients disagree on non-IID digits: the step extrapolates
    served = alg.personalize(np.arange(3), gen())[0]  # §5: the average of the last two iterates
    for k in x:
        np.testing.assert_allclose(served[k].double().numpy(), (x[k] + last[k]) / 2, rtol=1e-4, atol=2e-6)


@pytest.mark.parametrize("opts", [dict(algorithm="fedopt", server_optimizer="yogi"),
                                  dict(algorithm="fedopt", server_optimizer="adagrad"), dict(algorithm="fedexp")])
def test_resumed_training_is_identical(store, opts):
    whole, first = alg_for(store, **opts), alg_for(store, **opts)
    for t in range(4):
        whole.run_round(t, cohort(store), gen(t))
    for t in range(2):
        first.run_round(t, cohort(store), gen(t))
    second = alg_for(store, **opts)
    second.load_state(first.state())
    for t in range(2, 4):
        second.run_round(t, cohort(store), gen(t))
    a, b = whole.state(), second.state()
    assert a.keys() == b.keys() and len(a) >= 2  # the server state (moments, last iterate) is in the checkpoint
    for part in a:
        for k in a[part]:
            assert torch.equal(a[part][k], b[part][k]), (part, k)
    if opts["algorithm"] == "fedopt":  # the moments moved: a resume that dropped them would differ
        assert all(not torch.equal(v, torch.full_like(v, whole.cfg.tau ** 2)) for v in a["server_v"].values())


@pytest.mark.parametrize("name", ["fedopt", "fedexp"])
def test_recorded_traffic_equals_the_floats_each_reports(store, name):
    alg = alg_for(store, algorithm=name)
    for t in range(2):
        c = cohort(store, 3 + t)
        alg.run_round(t, c, gen(t))
        alg.traffic.close_round(len(c))
    s = alg.traffic.summary()
    assert s["floats_down_per_client_round"] + s["floats_up_per_client_round"] == \
        entries()[name].algorithm.floats_per_client_round(alg.arch)
    assert s["client_rounds"] == 7


@pytest.mark.parametrize("name,opts,message", [
    ("fedopt", {"server_optimizer": "adm"}, "server_optimizer must be one of adam, yogi, adagrad; got 'adm' "
                                            "(did you mean 'adam'?)"),
    ("fedopt", {"beta1": 1.0}, "beta1 must be a number in [0, 1)"),
    ("fedopt", {"beta2": -0.1}, "beta2 must be a number in [0, 1)"),
    ("fedopt", {"server_optimizer": "adagrad", "beta2": 0.9}, "beta2 has no effect on algorithm 'fedopt'"),
    ("fedopt", {"tau": 0.0}, "tau must be a finite number > 0 for fedopt"),
    ("fedopt", {"server_momentum": 0.9}, "unknown key 'server_momentum' for algorithm 'fedopt' (a key of"),
    ("fedexp", {"eps": -1.0}, "eps must be a finite number > 0 for fedexp"),
    ("fedexp", {"server_lr": 2.0}, "unknown key 'server_lr' for algorithm 'fedexp' (a key of"),
])
def test_bad_keys_are_refused_in_one_line(name, opts, message):
    from pfl_cli.errors import ConfigError

    with pytest.raises(ConfigError) as err:
        train_config(name, **opts)
    assert message in str(err.value) and "\n" not in str(err.value), str(err.value)


def test_defaults_are_the_papers_and_cited():
    import dataclasses

    opt, exp = train_config("fedopt"), train_config("fedexp")
    assert (opt.server_optimizer, opt.beta1, opt.beta2, opt.tau, opt.clients_per_round, opt.local_epochs) == \
        ("adam", 0.9, 0.99, 1e-3, 10, 1)
    assert (exp.eps, exp.local_steps, exp.clients_per_round, exp.average_last_two) == (1e-3, 20, 20, True)
    for cfg, own in ((opt, ("server_optimizer", "server_lr", "beta1", "beta2", "tau")), (exp, ("eps",))):
        sources = {f.name: f.metadata.get("source", "") for f in dataclasses.fields(cfg)}
        assert all("ICLR 202" in sources[k] for k in own), sources
