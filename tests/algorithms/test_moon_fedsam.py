"""MOON and FedSAM against slow per-client references of their papers' algorithms (issue 40).

Each test runs two rounds of the real (cohort-vectorized) algorithm and replays both rounds' draws (same
generator seeds) through a plain loop over clients written here from the paper: autograd of one client's
batch loss, the step by hand (SGD with momentum after the gradient is clipped, as pflx's client optimizer).
MOON's reference computes Eq. 3 with three separate nets (the trained one, the global one, the client's
previous one) and its stored previous models are compared row by row; the second round's cohort overlaps
the first's, so a client's previous model is read back. FedSAM's reference takes the second gradient at
``w + rho g / ||g||`` (Foret et al. 2021, Eq. 2-3).
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


def features(net, params, x):
    """The hidden representation of the digits MLP (fc1 + ReLU), by hand."""
    return F.relu(F.linear(x.flatten(1), params["fc1.weight"], params["fc1.bias"]))


def grad_of(loss, leaves):
    return dict(zip(leaves, torch.autograd.grad(loss, list(leaves.values()))))


def ref_local(alg, start, clients, g, loss_of, *, rho=0.0):
    """Each client alone from ``start``: ``loss_of(i, params, idx, m)`` descended by SGD with momentum on the clipped
    gradient, taken at ``w + rho g / ||g||`` when ``rho`` (SAM); the batches the algorithm draws from ``g``."""
    cfg = alg.cfg
    index, mask = sample_batches(alg.store.fit, clients, cfg.local_steps, cfg.batch_size, g)
    out = {k: [] for k in start}
    for i in range(len(clients)):
        w = {k: v.clone() for k, v in start.items()}
        buf = {k: torch.zeros_like(v) for k, v in w.items()}
        for s in range(cfg.local_steps):
            idx, m = index[i, s], mask[i, s]
            leaves = {k: v.clone().requires_grad_(True) for k, v in w.items()}
            grads = grad_of(loss_of(i, leaves, idx, m), leaves)
            if rho:
                norm = torch.sqrt(sum(gr.pow(2).sum() for gr in grads.values()))
                moved = {k: (w[k] + rho * grads[k] / (norm + 1e-12)).requires_grad_(True) for k in w}
                grads = grad_of(loss_of(i, moved, idx, m), moved)
                grads = {k: grads[k] for k in w}
            norm = torch.sqrt(sum(gr.pow(2).sum() for gr in grads.values()))
            scale = min(1.0, cfg.client_clip / (float(norm) + 1e-6))
            for k in w:
                buf[k] = cfg.momentum * buf[k] + grads[k] * scale
                w[k] = w[k] - cfg.lr * buf[k]
        for k in w:
            out[k].append(w[k])
    return {k: torch.stack(v) for k, v in out.items()}


def data_weighted(store, clients, theta):
    n = store.fit.length[clients].to(torch.float32)
    return {k: torch.einsum("c,c...->...", n / n.sum(), v) for k, v in theta.items()}


def ce(alg, params, idx, m):
    logits = functional_call(alg.net, params, (alg.store.inputs(idx),))
    return (F.cross_entropy(logits, alg.store.y[idx], reduction="none") * m).sum() / m.sum()


@pytest.mark.parametrize("how", ["vmap", "loop"])
def test_moon_two_rounds_equal_the_per_client_reference(store, how):
    mu, tau = 2.0, 0.3
    alg = alg_for(store, algorithm="moon", moon_mu=mu, moon_tau=tau, cohort_exec=how)
    w = {k: v.clone() for k, v in alg.global_params.items()}
    prev = {k: v.unsqueeze(0).repeat(store.num_clients, *([1] * v.dim())) for k, v in w.items()}  # w^0 for all
    for t, clients in enumerate(cohorts(store)):
        alg.run_round(t, clients, gen(t))

        def loss_of(i, params, idx, m, glob=dict(w), clients=clients):
            x = alg.store.inputs(idx)
            z = features(alg.net, params, x)
            with torch.no_grad():
                z_glob = features(alg.net, glob, x)
                z_prev = features(alg.net, {k: v[clients[i]] for k, v in prev.items()}, x)
            pos = torch.exp(F.cosine_similarity(z, z_glob, dim=1) / tau)
            neg = torch.exp(F.cosine_similarity(z, z_prev, dim=1) / tau)
            con = -torch.log(pos / (pos + neg))                                           # Eq. 3
            return ce(alg, params, idx, m) + mu * (con * m).sum() / m.sum()              # Eq. 4

        local = ref_local(alg, w, clients, gen(t), loss_of)
        for k in w:
            prev[k][clients] = local[k]
        w = data_weighted(store, clients, local)                                          # Alg. 1 line 8
        close(alg.global_params, w)
        close(alg.previous.values, prev)
    assert bool(alg.previous.has[cohorts(store)[1]].all())
    # the contrastive term acted: mu -> 0 gives another model
    plain = alg_for(store, algorithm="moon", moon_mu=1e-9, moon_tau=tau, cohort_exec=how)
    for t, clients in enumerate(cohorts(store)):
        plain.run_round(t, clients, gen(t))
    assert float((plain.global_params["fc1.weight"] - w["fc1.weight"]).abs().max()) > 1e-4


@pytest.mark.parametrize("how", ["vmap", "loop"])
def test_fedsam_two_rounds_equal_the_per_client_reference(store, how):
    rho = 0.2
    alg = alg_for(store, algorithm="fedsam", sam_rho=rho, cohort_exec=how, server_lr=0.8)
    w = {k: v.clone() for k, v in alg.global_params.items()}
    for t, clients in enumerate(cohorts(store)):
        alg.run_round(t, clients, gen(t))
        local = ref_local(alg, w, clients, gen(t), lambda i, p, idx, m: ce(alg, p, idx, m), rho=rho)
        mean = data_weighted(store, clients, local)
        w = {k: w[k] + 0.8 * (mean[k] - w[k]) for k in w}                                 # FedAvg's server step
        close(alg.global_params, w)
    # the second gradient acted: plain steps (the reference with rho 0) give another model
    fedavg = alg_for(store, algorithm="fedavg", cohort_exec=how, server_lr=0.8)
    for t, clients in enumerate(cohorts(store)):
        fedavg.run_round(t, clients, gen(t))
    assert float((fedavg.global_params["fc1.weight"] - w["fc1.weight"]).abs().max()) > 1e-4


def test_sam_with_rho_0_takes_plain_sgd_steps(store):
    """fl/sam.local_steps at rho 0 is the engine's local SGD (the block other algorithms can take as an option)."""
    from pfl_cli.fl.cohort import local_sgd
    from pfl_cli.fl.params import broadcast
    from pfl_cli.fl.sam import cross_entropy_grad_fn, local_steps

    alg = alg_for(store, algorithm="fedavg", cohort_exec="vmap")
    clients = cohorts(store)[0]
    start = broadcast(alg.global_params, len(clients))
    opts = alg.sgd_update_options()
    ours, loss = local_steps(cross_entropy_grad_fn(alg.net, store, "vmap"), start,
                             alg.local_batches(clients, gen(3), steps=4), sgd=opts)
    engine, engine_loss = local_sgd(alg.net, start, store, alg.local_batches(clients, gen(3), steps=4),
                                    cohort_exec="vmap", **opts)
    close(ours, engine)
    torch.testing.assert_close(loss, engine_loss)


@pytest.mark.parametrize("name", ["moon", "fedsam"])
def test_floats_counted_from_the_exchanged_tensors(store, name):
    alg = alg_for(store, algorithm=name)
    clients = cohorts(store)[0]
    alg.run_round(0, clients, gen(0))
    alg.traffic.close_round(len(clients))
    s = alg.traffic.summary()
    measured = s["floats_down_per_client_round"] + s["floats_up_per_client_round"]
    assert measured == 2 * num_parameters(alg.arch["client"]) == type(alg).floats_per_client_round(alg.arch)


def test_refusals():
    with pytest.raises(ConfigError, match=r"^sam_rho must be a finite number > 0 for fedsam; got 0.0\.$"):
        train_config("fedsam", sam_rho=0.0)
    with pytest.raises(ConfigError, match=r"^moon_mu must be a finite number > 0 for moon; got -1.0\.$"):
        train_config("moon", moon_mu=-1.0)
    with pytest.raises(ConfigError, match=r"^moon_tau must be a finite number > 0 for moon; got 0.0\.$"):
        train_config("moon", moon_tau=0.0)
    with pytest.raises(ConfigError, match=r"^moon_tau must be a finite number; got inf\.$"):
        train_config("moon", moon_tau=float("inf"))
    assert_unknown_key("moon", "sam_rho", r" \(a key of fedavg, fedprox, fedsam\)")
    assert_unknown_key("fedsam", "mu", r".*fedprox")
    assert_unknown_key("fedavg", "moon_tau", r" \(a key of moon\)")


def test_moon_refuses_a_net_without_a_representation(digits_clients):
    from pfl_cli.fl.api import make_algorithm
    from pfl_cli.fl.store import build_store
    from pfl_cli.rng import make_rng

    ds, part = digits_clients
    x = F.interpolate(torch.as_tensor(ds.x, dtype=torch.float32).reshape(len(ds.x), 1, 8, 8), size=28)  # 28x28
    store = build_store(x, ds.y, ds.num_classes, part, val_fraction=0.1, rng=make_rng(0, "v"), device="cpu")
    with pytest.raises(InputError, match=r"^model_arch: moon contrasts the representation the classifier reads; "
                                         r"the \w+ net has no features\(\) / head\(\)\. Use --set model_arch=mlp"):
        make_algorithm(small_config("moon", model_arch="hyperfl-cnn"), store)


@pytest.mark.parametrize("name", ["moon", "fedsam"])
def test_a_new_client_gets_the_global_model_or_it_fine_tuned_by_plain_steps(store, name):
    """The new-client protocol: the global model as-is; with finetune_steps, FedAvg's plain local steps from it
    (no contrastive term, no SAM step: the same models FedAvg's fine-tuning gives from the same global model)."""
    import numpy as np

    from pfl_cli.fl.store import ROLE_HOLDOUT

    new = np.asarray(store.clients(ROLE_HOLDOUT))
    alg = alg_for(store, algorithm=name)
    alg.run_round(0, cohorts(store)[0], gen(0))
    served, personalized = alg.personalize(new, gen(1))
    assert personalized is False and served is alg.global_params
    assert alg.protocol(True) == {"protocol": "global model", "rounds": 0}
    tuned = alg_for(store, algorithm=name, finetune_steps=3)
    tuned.global_params = {k: v.clone() for k, v in alg.global_params.items()}
    models, personalized = tuned.personalize(new, gen(1))
    fedavg = alg_for(store, algorithm="fedavg", finetune_steps=3)
    fedavg.global_params = {k: v.clone() for k, v in alg.global_params.items()}
    reference, _ = fedavg.personalize(new, gen(1))
    assert personalized is True and tuned.protocol(True)["protocol"] == "global model fine-tuned 3 local steps"
    close(models, reference)
    assert float((models["fc1.weight"] - alg.global_params["fc1.weight"]).abs().max()) > 0
