"""FedLC against a slow per-client reference of its calibrated loss (Zhang et al., ICML 2022, §4).

Two rounds of the real (cohort-vectorized) algorithm are replayed through a plain loop over clients
written here: each client's class counts by counting its training labels one by one, the logits
calibrated by ``tau * n^{-1/4}`` by hand, autograd of one client's batch loss, SGD with momentum by
hand, then FedAvg's data-size-weighted mean. The second round's cohort overlaps the first's.
"""

import pytest
import torch
import torch.nn.functional as F
from torch.func import functional_call

from baseline_support import alg_factory, assert_unknown_key, close, gen
from pfl_cli.errors import ConfigError
from pfl_cli.fl.batches import sample_batches
from pfl_cli.fl.store import ROLE_TRAIN
from pfl_cli.models import num_parameters
from pfl_cli.registry import train_config
from pflx_testing import small_config

BASE = small_config("fedlc", mlp_hidden=(16,), local_steps=4, batch_size=8, lr=0.05, clients_per_round=4,
                    momentum=0.9, client_clip=0.5, lambda_theta=0.0)
alg_for = alg_factory(BASE)
COHORTS = ([0, 3, 5, 9], [3, 9, 1, 7])  # positions among the train clients; 3 and 9 train twice


def cohorts(store):
    train = store.clients(ROLE_TRAIN)
    return [torch.as_tensor(train[c]) for c in COHORTS]


def counts_by_hand(store, client):
    """n_{i,y}: the client's labeled fit samples of each class, counted one by one."""
    index, length = store.fit.rows(torch.as_tensor([int(client)]))
    n = [0.0] * store.num_classes
    for j in range(int(length[0])):
        y = int(store.y[index[0, j]])
        if y >= 0:
            n[y] += 1.0
    return n


def ref_round(alg, start, clients, g, tau):
    """Each client alone: momentum SGD on its clipped calibrated-CE batch gradient; then the weighted mean."""
    cfg = alg.cfg
    index, mask = sample_batches(alg.store.fit, clients, cfg.local_steps, cfg.batch_size, g)
    models, sizes = [], []
    for i, client in enumerate(clients.tolist()):
        n = counts_by_hand(alg.store, client)
        margin = torch.tensor([tau * (c if c > 0 else 1e-8) ** -0.25 for c in n])
        w = {k: v.clone() for k, v in start.items()}
        buf = {k: torch.zeros_like(v) for k, v in w.items()}
        for s in range(cfg.local_steps):
            idx, m = index[i, s], mask[i, s]
            leaves = {k: v.clone().requires_grad_(True) for k, v in w.items()}
            logits = functional_call(alg.net, leaves, (alg.store.inputs(idx),)) - margin   # f_y(x) - tau n^-1/4
            loss = (F.cross_entropy(logits, alg.store.y[idx], reduction="none") * m).sum() / m.sum()
            grads = dict(zip(leaves, torch.autograd.grad(loss, list(leaves.values()))))
            norm = torch.sqrt(sum(gr.pow(2).sum() for gr in grads.values()))
            scale = min(1.0, cfg.client_clip / (float(norm) + 1e-6))
            for k in w:
                buf[k] = cfg.momentum * buf[k] + grads[k] * scale
                w[k] = w[k] - cfg.lr * buf[k]
        models.append(w)
        sizes.append(float(alg.store.fit.length[client]))
    total = sum(sizes)
    return {k: sum(s / total * mdl[k] for s, mdl in zip(sizes, models)) for k in start}


@pytest.mark.parametrize("how", ["vmap", "loop"])  # both paths of local_sgd read the margins
def test_two_rounds_equal_the_per_client_reference(store, how):
    tau = 0.5
    alg = alg_for(store, tau=tau, cohort_exec=how)
    w = {k: v.clone() for k, v in alg.global_params.items()}
    plain = alg_for(store, tau=0.0, cohort_exec=how)  # tau = 0: FedAvg's round exactly
    fedavg = alg_for(store, algorithm="fedavg", cohort_exec=how)
    for t, clients in enumerate(cohorts(store)):
        alg.run_round(t, clients, gen(t))
        plain.run_round(t, clients, gen(t))
        fedavg.run_round(t, clients, gen(t))
        w = ref_round(alg, w, clients, gen(t), tau)
        close(alg.global_params, w)
    for k, v in fedavg.global_params.items():
        torch.testing.assert_close(plain.global_params[k], v, rtol=0, atol=0)
    moved = max(float((alg.global_params[k] - fedavg.global_params[k]).abs().max()) for k in w)
    assert moved > 1e-3  # the margins changed the training: the comparison above checked the calibration


def test_margins_follow_each_clients_counts(store):
    from pfl_cli.fl.logit_calibration import calibration_margin

    clients = cohorts(store)[0]
    margin = calibration_margin(store, clients, 2.0)
    for i, client in enumerate(clients.tolist()):
        n = counts_by_hand(store, client)
        for y, c in enumerate(n):
            expected = 2.0 * (c if c > 0 else 1e-8) ** -0.25
            assert float(margin[i, y]) == pytest.approx(expected, rel=1e-6)
    assert (margin > 150).any()  # the digits clients miss some classes: their margin is 100 tau


def test_prediction_reads_the_plain_logits(store):
    """The calibration is a training loss only: the served net is the client net (no margin)."""
    alg = alg_for(store)
    assert alg.predict_net is alg.net and alg.personalized is False
    x = store.inputs(torch.arange(5))
    torch.testing.assert_close(alg.calibrated(x), alg.net(x), rtol=0, atol=0)  # margin zero unless given


def test_floats_counted_from_the_exchanged_tensors(store):
    alg = alg_for(store)
    clients = cohorts(store)[0]
    alg.run_round(0, clients, gen(0))
    alg.traffic.close_round(len(clients))
    s = alg.traffic.summary()
    measured = s["floats_down_per_client_round"] + s["floats_up_per_client_round"]
    assert measured == 2 * num_parameters(alg.arch["client"]) == type(alg).floats_per_client_round(alg.arch)


def test_refusals():
    with pytest.raises(ConfigError, match=r"^tau must be a finite number >= 0 for fedlc; got -1.0\.$"):
        train_config("fedlc", tau=-1.0)
    with pytest.raises(ConfigError, match=r"^tau must be a finite number; got inf\.$"):
        train_config("fedlc", tau=float("inf"))
    assert_unknown_key("fedlc", "mu", r".*fedprox")
    assert_unknown_key("fedavg", "tau", r" \(a key of .*fedlc")
