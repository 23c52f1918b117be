"""FedNova (Wang et al., NeurIPS 2020) against a slow per-client reference of its Eq. 6-8, and its normalizer
on a quadratic whose optimum is known.

The reference runs two rounds one client at a time (autograd of one client's batch loss, the momentum step by
hand), builds each a_i by running the momentum recursion on unit gradients (the paper's definition: how much
each local gradient moved the model) and takes the server step ``x - tau_eff sum_i p_i (x - x_i) / ||a_i||_1``.
Under ``local_epochs`` the clients take different step counts, so FedNova differs from FedAvg; with equal step
counts it is FedAvg. Under ``local_epochs_range`` the reference draws each client's epochs itself from the round's
generator (uniform over lo..hi, Wang et al. §6) and checks that each client took ``E_i * ceil(n_i / b)`` steps.
"""

import pytest
import torch
import torch.nn.functional as F
from torch.func import functional_call

from baseline_support import alg_factory, assert_unknown_key, close, gen
from pfl_cli.errors import ConfigError
from pfl_cli.fl.batches import CohortBatches
from pfl_cli.fl.nova import normalized_delta, solver_norm
from pfl_cli.fl.store import ROLE_TRAIN
from pfl_cli.models import num_parameters
from pfl_cli.registry import train_config
from pflx_testing import small_config

BASE = small_config("fednova", mlp_hidden=(16,), local_epochs=1, batch_size=8, lr=0.05, clients_per_round=4,
                    momentum=0.9, client_clip=0.5, lambda_theta=0.0)
alg_for = alg_factory(BASE)
COHORTS = ([0, 3, 5, 9], [3, 9, 1, 7])


def cohorts(store):
    train = store.clients(ROLE_TRAIN)
    return [torch.as_tensor(train[c]) for c in COHORTS]


def a_vector(steps, rho):
    """a_i of ``steps`` momentum-SGD steps: entry k = the total move of gradient k, from the recursion itself."""
    a = []
    for k in range(steps):
        buf, moved = 0.0, 0.0
        for j in range(steps):
            buf = rho * buf + (1.0 if j == k else 0.0)
            moved += buf
        a.append(moved)
    return a


def ref_round(alg, x, clients, g):
    """One FedNova round written per client from the paper; returns the new global model and each ||a_i||_1."""
    cfg = alg.cfg
    epochs = [cfg.local_epochs] * len(clients)
    if cfg.local_epochs_range is not None:  # E_i uniform over lo..hi, drawn before the batches
        lo, hi = cfg.local_epochs_range
        epochs = torch.randint(lo, hi + 1, (len(clients),), generator=g).tolist()
    index, mask, active = CohortBatches(alg.store.fit, clients, None, cfg.batch_size, g,
                                        epochs=torch.tensor(epochs)).materialize()
    models, norms = [], []
    for i in range(len(clients)):
        y = {k: v.clone() for k, v in x.items()}
        buf = {k: torch.zeros_like(v) for k, v in y.items()}
        taken = 0
        for s in range(index.shape[1]):
            if not bool(active[i, s]):
                continue
            taken += 1
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
        n_i, b = int(alg.store.fit.length[clients[i]]), index.shape[2]
        assert taken == epochs[i] * max(1, -(-n_i // b)), (taken, epochs[i], n_i, b)  # tau_i = E_i ceil(n_i / b)
        models.append(y)
        norms.append(sum(a_vector(taken, cfg.momentum)))                 # ||a_i||_1 (Eq. 6's normalizer)
    n = alg.store.fit.length[clients].tolist()
    p = [ni / sum(n) for ni in n]
    tau_eff = sum(pi * a for pi, a in zip(p, norms))                       # Eq. 8: tau_eff = sum p_i ||a_i||_1
    new = {k: x[k] - tau_eff * sum(pi * (x[k] - yi[k]) / a for pi, yi, a in zip(p, models, norms)) for k in x}
    return new, norms, epochs


@pytest.mark.parametrize("how,momentum,epochs", [("vmap", 0.9, None), ("loop", 0.0, None), ("vmap", 0.9, (1, 3)),
                                                 ("loop", 0.0, (2, 5))])
def test_two_rounds_equal_the_per_client_reference(store, how, momentum, epochs):
    alg = alg_for(store, cohort_exec=how, momentum=momentum, local_epochs_range=epochs,
                  local_epochs=1 if epochs is None else 2)  # with the range local_epochs stays at its default
    x = {k: v.clone() for k, v in alg.global_params.items()}
    drawn = []
    for t, clients in enumerate(cohorts(store)):
        alg.run_round(t, clients, gen(t))
        x, norms, e = ref_round(alg, x, clients, gen(t))
        drawn += e
        assert len(set(norms)) > 1, norms  # the clients took different step counts: the normalization acted
        close(alg.global_params, x)
    if epochs is None:
        torch.testing.assert_close(solver_norm(alg.local_steps_of(clients), momentum), torch.tensor(norms).double())
    else:
        assert set(drawn) <= set(range(epochs[0], epochs[1] + 1)) and len(set(drawn)) > 1, drawn
        tau = alg.local_steps_of(clients, torch.tensor(e))
        torch.testing.assert_close(solver_norm(tau, momentum), torch.tensor(norms).double())


def test_random_epochs_are_drawn_uniformly_per_client_and_round(store):
    """E_i over many rounds: every value of lo..hi, near-uniform frequencies, different clients different draws;
    the draw depends on the round's generator only (the same generator seed, the same epochs)."""
    alg = alg_for(store, local_epochs_range=(2, 5), local_epochs=2)
    clients = cohorts(store)[0]
    draws = torch.stack([alg.round_work(clients, gen(t))["epochs"] for t in range(500)])
    counts = torch.bincount(draws.flatten(), minlength=6)[2:].double() / draws.numel()
    assert bool((draws >= 2).all() and (draws <= 5).all())
    torch.testing.assert_close(counts, torch.full((4,), 0.25, dtype=torch.float64), atol=0.03, rtol=0)
    assert bool((draws != draws[:, :1]).any(1).float().mean() > 0.9)  # clients of a round mostly differ
    assert torch.equal(alg.round_work(clients, gen(7))["epochs"], alg.round_work(clients, gen(7))["epochs"])
    assert alg_for(store).round_work(clients, gen(0)) == {"epochs": 1}  # without the range: local_epochs


def test_equal_step_counts_make_it_fedavg_and_unequal_ones_do_not(store):
    start = {}
    for name, epochs in (("fednova", None), ("fedavg", None), ("fednova", 1), ("fedavg", 1)):
        alg = alg_for(store, algorithm=name, local_epochs=epochs, local_steps=3)
        clients = cohorts(store)[0]
        alg.run_round(0, clients, gen(0))
        start[name, epochs] = alg.global_params
    close(start["fednova", None], start["fedavg", None])
    gap = max(float((start["fednova", 1][k] - start["fedavg", 1][k]).abs().max()) for k in start["fedavg", 1])
    assert gap > 1e-4, gap


@pytest.mark.parametrize("rho", [0.0, 0.5, 0.9])
def test_solver_norm_is_the_sum_of_the_a_vector(rho):
    steps = torch.tensor([1, 2, 7, 30])
    want = torch.tensor([sum(a_vector(int(s), rho)) for s in steps], dtype=torch.float64)
    torch.testing.assert_close(solver_norm(steps, rho), want)


def test_on_a_quadratic_fedavg_drifts_and_fednova_finds_the_true_optimum():
    """F_i(x) = |x - e_i|^2 / 2, equal shares, local GD (lr 0.002) for tau_i in {2, 40} steps. The true optimum of
    sum_i p_i F_i is the mean of the e_i; FedAvg's fixed point weighs e_i by 1 - (1 - lr)^tau_i (about tau_i lr:
    the objective inconsistency, Wang et al. 2020 Theorem 1), FedNova's by (1 - (1 - lr)^tau_i) / tau_i (equal up
    to O(tau lr)). Both fixed points are checked in closed form, and FedNova's lies much nearer the optimum."""
    lr, taus = 0.002, torch.tensor([2, 40, 2, 40])
    e = torch.tensor([[0.0, 0.0], [4.0, 0.0], [0.0, 2.0], [4.0, 2.0]]) + torch.tensor([[1.0, -1.0]])
    share = torch.full((4,), 0.25, dtype=torch.float64)
    optimum = e.mean(0)
    ends = {}
    steps = torch.arange(int(taus.max()))[:, None] < taus[None, :]  # (step, client): the clients still stepping
    for name in ("fedavg", "fednova"):
        x = {"w": torch.zeros(2)}
        for _ in range(400):
            y = x["w"].expand(4, 2).clone()
            for go in steps:
                y = torch.where(go[:, None], y - lr * (y - e), y)          # a GD step on F_i, tau_i of them
            theta = {"w": y}
            if name == "fedavg":
                x = {"w": x["w"] + torch.einsum("c,c...->...", share.float(), theta["w"] - x["w"])}
            else:
                delta = normalized_delta(x, theta, share, solver_norm(taus, 0.0))
                x = {"w": x["w"] + delta["w"]}
        ends[name] = x["w"]
    moved = 1 - (1 - lr) ** taus.double()
    fixed = {"fedavg": moved, "fednova": moved / taus}
    for name, weight in fixed.items():
        want = (weight[:, None] * e.double()).sum(0) / weight.sum()
        torch.testing.assert_close(ends[name].double(), want, atol=1e-4, rtol=0)
    off = {name: float((ends[name] - optimum).norm()) for name in ends}
    assert off["fedavg"] > 1.0 and off["fednova"] < 0.1 * off["fedavg"], off


def test_with_random_epochs_fedavg_drifts_and_fednova_finds_the_true_optimum():
    """The quadratic above with the paper's variable local work (Wang et al. §6): every round client i draws E_i
    uniformly from {2..5} and takes tau_i = E_i s_i GD steps, s_i in {1, 10} its steps an epoch (its data size).
    FedAvg's average weighs e_i by its expected move, about E[tau_i] lr (the objective inconsistency, Theorem 1);
    FedNova's normalized average stays near the true optimum. Averaged over the last 100 rounds (the iterates
    jitter with the draws). tau_i GD steps on F_i in closed form: y_i = e_i + (1 - lr)^tau_i (x - e_i)."""
    lr, per_epoch = 0.002, torch.tensor([1, 10, 1, 10])
    e = torch.tensor([[0.0, 0.0], [4.0, 0.0], [0.0, 2.0], [4.0, 2.0]]) + torch.tensor([[1.0, -1.0]])
    share = torch.full((4,), 0.25, dtype=torch.float64)
    optimum = e.mean(0)
    ends = {}
    for name in ("fedavg", "fednova"):
        g = torch.Generator().manual_seed(0)
        x, tail = {"w": torch.zeros(2)}, []
        for r in range(500):
            taus = torch.randint(2, 6, (4,), generator=g) * per_epoch
            y = e + (1 - lr) ** taus[:, None].float() * (x["w"] - e)
            if name == "fedavg":
                x = {"w": x["w"] + torch.einsum("c,c...->...", share.float(), y - x["w"])}
            else:
                x = {"w": x["w"] + normalized_delta(x, {"w": y}, share, solver_norm(taus, 0.0))["w"]}
            if r >= 400:
                tail.append(x["w"])
        ends[name] = torch.stack(tail).mean(0)
    off = {name: float((ends[name] - optimum).norm()) for name in ends}
    assert off["fedavg"] > 1.0 and off["fednova"] < 0.1 * off["fedavg"], off


def test_floats_counted_from_the_exchanged_tensors(store):
    alg = alg_for(store)
    clients = cohorts(store)[0]
    alg.run_round(0, clients, gen(0))
    alg.traffic.close_round(len(clients))
    s = alg.traffic.summary()
    measured = s["floats_down_per_client_round"] + s["floats_up_per_client_round"]
    assert measured == 2 * num_parameters(alg.arch["client"]) + 1 == type(alg).floats_per_client_round(alg.arch)


def test_refusals():
    assert_unknown_key("fednova", "alpha", r" \(a key of apfl, feddyn, fedasync\)")
    with pytest.raises(ConfigError, match=r"local_epochs must be"):
        train_config("fednova", local_epochs=0)
    with pytest.raises(ConfigError, match=r"momentum must be"):
        train_config("fednova", momentum=1.0)
    for bad in ([5, 2], [0, 3], [2], [2, 3, 4]):
        with pytest.raises(ConfigError, match=r"^local_epochs_range must be two integers \[lo, hi\] with 1 <= lo <= "
                                              r"hi for fednova; got \[[0-9, ]+\]\. Use e\.g\. \[2, 5\]"):
            train_config("fednova", local_epochs_range=bad)
    with pytest.raises(ConfigError, match=r"^local_epochs_range must be a list of integers; got \[2\.5, 3\]\.$"):
        train_config("fednova", local_epochs_range=[2.5, 3])
    with pytest.raises(ConfigError, match=r"^local_epochs has no effect beside local_epochs_range \(each client's "
                                          r"epochs are drawn from \[2, 5\] every round\); got local_epochs=3\. Drop"):
        train_config("fednova", local_epochs_range=[2, 5], local_epochs=3)
    assert_unknown_key("fedavg", "local_epochs_range", r" \(a key of fednova\)")
