"""Learning claim of FedNova (issue 40; Wang et al., NeurIPS 2020, Theorem 1): with clients that take
different numbers of local steps, FedAvg converges to the optimum of an objective that weighs each client by its
step count (the objective inconsistency), FedNova to the optimum of the true one.

Task (used by no other test): builtin:digits over 10 clients of two classes each, sizes alternating 240 and 24
samples (80 % train), a linear softmax model with weight decay (so the objective is strongly convex and its
optimum known), every client every round, one local epoch of plain SGD with batch 12: the large clients take 16
steps, the small ones 2. The true objective is the pooled training loss, ``F = sum_i p_i F_i`` with p_i the data
shares; FedAvg's surrogate weighs client i by ``p_i tau_i`` (the paper's ``||a_i||_1``). Both optima are computed
here by L-BFGS on the pooled data (the slow obvious reference). After 300 rounds each method's excess over the
optimum of each objective is measured. Seeds 0 and 1: FedNova's excess on the true objective 0.0043 / 0.0047
against FedAvg's 0.019 / 0.022; on the step-weighted objective FedAvg's excess is 0.0042 / 0.0051, FedNova's
0.0079 / 0.0078 (printed by the test with -s).

With the paper's variable local work (§6: E_i drawn uniformly from [2, 5] every round, ``local_epochs_range``) on
the same task, FedAvg with the same draws (FedNova's round with its normalization taken out: every ||a_i||_1 equal,
which is FedAvg's weighted mean exactly) against FedNova: the excess over the true objective's optimum after
ROUNDS_RANGE rounds is printed and FedNova's must be below half of FedAvg's: seeds 0 and 1, 0.0033 / 0.0043
against FedAvg's 0.018 / 0.024.
"""

import pytest
import torch
import torch.nn.functional as F
from torch.func import functional_call

from pfl_cli.data import load_dataset
from pfl_cli.fl import train_federated
from pfl_cli.fl.store import ROLE_TRAIN
from pfl_cli.partition import PartitionConfig, partition_labels
from pfl_cli.rng import make_rng
from pflx_testing import small_config

LAM = 1e-3  # lambda_theta: the local steps' weight decay is 2 * LAM, the objective's term LAM |x|^2
RUN = dict(rounds=300, eval_every=300, local_epochs=1, batch_size=12, lr=0.05, momentum=0.0, mlp_hidden=(),
           clients_per_round=10, val_fraction=0.0, lambda_theta=LAM)


def objective(net, X, Y, weight):
    """x -> sum_j weight_j CE(x; sample j) + LAM |x|^2 (weight sums to 1)."""
    def f(p):
        ce = F.cross_entropy(functional_call(net, p, (X,)), Y, reduction="none")
        return (weight * ce).sum() + LAM * sum((v ** 2).sum() for v in p.values())
    return f


def minimum(f, like):
    p = {k: torch.zeros_like(v).requires_grad_(True) for k, v in like.items()}
    opt = torch.optim.LBFGS(list(p.values()), lr=1, max_iter=500, tolerance_grad=1e-10, tolerance_change=1e-12,
                            line_search_fn="strong_wolfe")

    def closure():
        opt.zero_grad()
        loss = f(p)
        loss.backward()
        return loss

    for _ in range(5):
        opt.step(closure)
    with torch.no_grad():
        return float(f(p))


@pytest.mark.slow
@pytest.mark.parametrize("seed", [0, 1])
def test_fednova_converges_to_the_true_optimum_and_fedavg_to_the_step_weighted_one(seed):
    ds = load_dataset("builtin:digits")
    cfg = PartitionConfig(scheme="pathological", classes_per_client=2, class_shares="equal", sizes=[240, 24] * 5,
                          num_clients=10, holdout_clients=0, test_fraction=0.2, seed=seed)
    part = partition_labels(ds.y, cfg, num_classes=10, rng=make_rng(seed, "partition"), pool=ds.pool)
    final = {}
    for name in ("fedavg", "fednova"):
        run = train_federated(ds.x, ds.y, 10, part, small_config(algorithm=name, seed=seed, **RUN), device="cpu")
        final[name] = {k: v.detach() for k, v in run.algorithm.global_params.items()}
    alg, store = run.algorithm, run.store
    clients = torch.as_tensor(store.clients(ROLE_TRAIN))
    rows, length = store.fit.rows(clients)
    X = store.inputs(torch.cat([r[:n] for r, n in zip(rows, length)]))
    Y = store.y[torch.cat([r[:n] for r, n in zip(rows, length)])]
    tau = alg.local_steps_of(clients)
    assert sorted(set(tau.tolist())) == [2.0, 16.0]  # the step counts differ eight-fold
    per_sample_tau = torch.repeat_interleave(tau, length)
    weights = {"true": torch.full((len(Y),), 1.0 / len(Y)),            # p_i / n_i a sample: the pooled loss
               "step-weighted": per_sample_tau / per_sample_tau.sum()}  # p_i tau_i: FedAvg's surrogate
    excess = {}
    for obj, w in weights.items():
        f = objective(alg.net, X, Y, w.float())
        best = minimum(f, final["fedavg"])
        with torch.no_grad():
            excess[obj] = {name: float(f(p)) - best for name, p in final.items()}
    print(f"\nseed {seed}: excess over each objective's optimum {excess}")
    assert excess["true"]["fednova"] < 0.5 * excess["true"]["fedavg"], excess
    assert excess["step-weighted"]["fedavg"] < excess["step-weighted"]["fednova"], excess


ROUNDS_RANGE = 150


@pytest.mark.slow
@pytest.mark.parametrize("seed", [0, 1])
def test_with_random_epochs_fednova_reaches_a_lower_gap_than_fedavg_with_the_same_epochs(seed, monkeypatch):
    """local_epochs_range [2, 5] (Wang et al. §6), tau_i = E_i * {16, 2}: both runs draw the same E_i and batches
    (the round's generator), FedAvg's differs only in the server's average. Measured (2-core dev CPU,
    2026-11-27, 150 rounds): excess 0.0033 / 0.0043 (FedNova, seeds 0 / 1) against 0.018 / 0.024 (FedAvg)."""
    import pfl_cli.fl.nova as nova

    ds = load_dataset("builtin:digits")
    cfg = PartitionConfig(scheme="pathological", classes_per_client=2, class_shares="equal", sizes=[240, 24] * 5,
                          num_clients=10, holdout_clients=0, test_fraction=0.2, seed=seed)
    part = partition_labels(ds.y, cfg, num_classes=10, rng=make_rng(seed, "partition"), pool=ds.pool)
    run_cfg = small_config(algorithm="fednova", seed=seed, **{**RUN, "rounds": ROUNDS_RANGE,
                                                               "eval_every": ROUNDS_RANGE, "local_epochs": 2},
                           local_epochs_range=(2, 5))
    final = {}
    normalized = nova.normalized_delta
    for name in ("fedavg", "fednova"):
        if name == "fedavg":  # equal norms: tau_eff * p_i / ||a_i||_1 = p_i, FedAvg's weighted mean of the moves
            monkeypatch.setattr(nova, "normalized_delta",
                                lambda g, theta, share, norm: normalized(g, theta, share, torch.ones_like(norm)))
        else:
            monkeypatch.setattr(nova, "normalized_delta", normalized)
        run = train_federated(ds.x, ds.y, 10, part, run_cfg, device="cpu")
        final[name] = {k: v.detach() for k, v in run.algorithm.global_params.items()}
    alg, store = run.algorithm, run.store
    clients = torch.as_tensor(store.clients(ROLE_TRAIN))
    rows, length = store.fit.rows(clients)
    X = store.inputs(torch.cat([r[:n] for r, n in zip(rows, length)]))
    Y = store.y[torch.cat([r[:n] for r, n in zip(rows, length)])]
    f = objective(alg.net, X, Y, torch.full((len(Y),), 1.0 / len(Y)))
    best = minimum(f, final["fednova"])
    with torch.no_grad():
        excess = {name: float(f(p)) - best for name, p in final.items()}
    print(f"\nseed {seed}: random epochs [2, 5], excess over the true optimum {excess}")
    assert excess["fednova"] < 0.5 * excess["fedavg"], excess
