"""SCAFFOLD and FedDyn against slow per-client references of their papers' Alg. 1.

Each test runs two rounds of the real (cohort-vectorized) algorithm, replays both rounds' draws
(same generator seeds) through a plain loop over clients written here from the paper (autograd of
one client's batch loss, the corrected step by hand), and compares the global model, the server
state and every client's drift state. The second round's cohort overlaps the first's, so a
client's stored state is read back.
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

BASE = small_config(mlp_hidden=(16,), local_steps=4, batch_size=8, lr=0.05, clients_per_round=4, momentum=0.9,
                    client_clip=0.5, lambda_theta=0.0)
alg_for = alg_factory(BASE)
COHORTS = ([0, 3, 5, 9], [3, 9, 1, 7])  # positions among the train clients; 3 and 9 train twice


def cohorts(store):
    train = store.clients(ROLE_TRAIN)
    return [torch.as_tensor(train[c]) for c in COHORTS]


def ref_local(alg, start, clients, g, correction, *, momentum, alpha=0.0, anchor=None):
    """Each client alone: SGD with momentum on its clipped batch gradient plus ``correction[i]`` (and alpha's
    proximal gradient), the batches ``cohort_sgd`` draws from ``g``; returns the models and K."""
    cfg = alg.cfg
    index, mask = sample_batches(alg.store.fit, clients, cfg.local_steps, cfg.batch_size, g)
    out = {k: [] for k in start}
    for i in range(len(clients)):
        y = {k: v.clone() for k, v in start.items()}
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
                step = grads[k] * scale + correction[k][i]
                if alpha:
                    step = step + alpha * (y[k] - anchor[k])
                buf[k] = momentum * buf[k] + step
                y[k] = y[k] - cfg.lr * buf[k]
        for k in y:
            out[k].append(y[k])
    return {k: torch.stack(v) for k, v in out.items()}, cfg.local_steps


def population(store):
    return int(store.labeled[store.clients(ROLE_TRAIN)].sum())


@pytest.mark.parametrize("how", ["vmap", "loop"])  # both paths of local_sgd carry the correction
def test_scaffold_two_rounds_equal_the_per_client_reference(store, how):
    alg = alg_for(store, algorithm="scaffold", server_lr=0.7, cohort_exec=how)
    x = {k: v.clone() for k, v in alg.global_params.items()}
    c = {k: torch.zeros_like(v) for k, v in x.items()}
    c_i = {k: torch.zeros(store.num_clients, *v.shape) for k, v in x.items()}
    n = population(store)
    for t, clients in enumerate(cohorts(store)):
        alg.run_round(t, clients, gen(t))
        corr = {k: c[k].unsqueeze(0) - c_i[k][clients] for k in x}                   # Alg. 1 line 10
        y, steps = ref_local(alg, x, clients, gen(t), corr, momentum=0.0)  # line 10: plain SGD
        dc = {}
        for k in x:
            new = c_i[k][clients] - c[k] + (x[k] - y[k]) / (steps * alg.cfg.lr)      # line 12, option II
            dc[k] = new - c_i[k][clients]
            c_i[k][clients] = new
        x = {k: x[k] + 0.7 * (y[k] - x[k]).mean(0) for k in x}                       # line 16
        c = {k: c[k] + dc[k].sum(0) / n for k in c}                                  # line 17
        close(alg.global_params, x)
        close(alg.server_drift, c)
        close(alg.drift.values, c_i)
    assert float(c["fc1.weight"].abs().sum()) > 0  # the variates moved: the check compared real state


@pytest.mark.parametrize("how", ["vmap", "loop"])
def test_feddyn_two_rounds_equal_the_per_client_reference(store, how):
    alpha = 0.1
    alg = alg_for(store, algorithm="feddyn", alpha=alpha, cohort_exec=how)
    theta = {k: v.clone() for k, v in alg.global_params.items()}
    h = {k: torch.zeros_like(v) for k, v in theta.items()}
    grad = {k: torch.zeros(store.num_clients, *v.shape) for k, v in theta.items()}
    m = population(store)
    for t, clients in enumerate(cohorts(store)):
        alg.run_round(t, clients, gen(t))
        local, _ = ref_local(alg, theta, clients, gen(t), {k: -grad[k][clients] for k in theta}, alpha=alpha,
                             anchor=theta, momentum=alg.cfg.momentum)
        for k in theta:
            grad[k][clients] = grad[k][clients] - alpha * (local[k] - theta[k])
            h[k] = h[k] - alpha * (local[k] - theta[k]).sum(0) / m
        theta = {k: local[k].mean(0) - h[k] / alpha for k in theta}
        close(alg.global_params, theta)
        close(alg.server_drift, h)
        close(alg.drift.values, grad)
    assert float(h["fc1.weight"].abs().sum()) > 0


@pytest.mark.parametrize("name,models", [("scaffold", 4), ("feddyn", 2)])
def test_floats_counted_from_the_exchanged_tensors(store, name, models):
    alg = alg_for(store, algorithm=name)
    clients = cohorts(store)[0]
    alg.run_round(0, clients, gen(0))
    alg.traffic.close_round(len(clients))
    s = alg.traffic.summary()
    measured = s["floats_down_per_client_round"] + s["floats_up_per_client_round"]
    d = num_parameters(alg.arch["client"])
    assert measured == models * d == type(alg).floats_per_client_round(alg.arch)


def test_refusals():
    with pytest.raises(ConfigError, match=r"^alpha must be a finite number > 0 for feddyn; got 0.0\.$"):
        train_config("feddyn", alpha=0.0)  # (a negative or above-1 alpha: the shared rule, a fraction in [0, 1])
    with pytest.raises(ConfigError, match="server_lr has no effect on algorithm 'feddyn'"):
        train_config("feddyn", server_lr=0.5)
    with pytest.raises(ConfigError, match="server_lr must be"):
        train_config("scaffold", server_lr=0.0)
    assert_unknown_key("scaffold", "alpha", r" \(a key of apfl, feddyn, fedasync\)")
    assert_unknown_key("feddyn", "mu", r".*fedprox")
    with pytest.raises(ConfigError, match="momentum has no effect on algorithm 'scaffold' because its local steps "
                                          "are plain SGD"):
        train_config("scaffold", momentum=0.5)


@pytest.mark.parametrize("name", ["scaffold", "feddyn"])
def test_a_cohort_above_the_population_is_refused(store, name):
    with pytest.raises(InputError, match=f"clients_per_round must be at most the 16 train clients with labels "
                                         f"for {name}.*got 17"):
        alg = alg_for(store, algorithm=name, clients_per_round=17)
        alg.check_trainable(torch.as_tensor(store.clients(ROLE_TRAIN)))


def test_with_local_epochs_k_is_each_clients_own_step_count(store):
    """Option II divides by K: with local_epochs a client takes epochs * ceil(n_i / b) steps, the count local SGD
    really takes."""
    alg = alg_for(store, algorithm="scaffold", local_epochs=2)
    clients = cohorts(store)[0]
    k = alg.local_steps_of(clients)
    n, b = store.fit.length[clients], alg.cfg.batch_size
    assert k.tolist() == (2 * ((n + b - 1) // b)).tolist() and len(set(k.tolist())) > 1
    assert int(k.sum()) == alg.local_batches(clients, gen(0), epochs=2).active_steps()
