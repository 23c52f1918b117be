"""Learning claims of FedLC (issue 40), slow tier: what reproduces of Zhang et al. (ICML 2022) on a small task.

Task (used by no other test): builtin:digits over 20 clients by Dirichlet(0.1) labels (at least 10 samples a
client, 30 % test), 50 local steps of plain SGD (lr 0.1, no momentum, the same for both), MLP 64-32-10.

1. The paper's mechanism (§3: under label skew the local models of softmax cross-entropy overfit to the
   client's own classes and forget the missing ones; the calibrated loss leaves those logits alone): from one
   common global model (FedAvg after 10 rounds of every client), one round of local training of every
   client, and each local model scored on the pooled test splits of all clients. Measured (mean over the 20
   local models, seed 0 / seed 1): cross-entropy 0.876 / 0.882, calibrated (tau = 1) 0.921 / 0.922.
   Asserted: the calibrated local models score at least 2 points higher.
2. The headline claim (the global model beats FedAvg's under strong label skew) does not reproduce here:
   30 rounds of 10 clients, the global model on the train clients' pooled test splits, best of three
   evaluations: FedAvg 0.941 / 0.941, FedLC 0.889 / 0.913 (tau 0.1 and 1 alike on seed 0). The cause
   found: a class a client does not hold gets the count 1e-8 (the paper's n^{-1/4} is undefined at 0; its
   margin removes the class from the client's softmax, as the peers' code does), so no client pushes
   another client's classes down and the global classifier's class scores are compared across clients only
   through the average. With a finite margin for missing classes (count 1) FedLC ties FedAvg (0.941 on
   seed 0). Asserted: FedLC's global model is at most 8 points below FedAvg's, far above chance.
"""

import pytest
import torch
from torch.func import functional_call

from pfl_cli.data import load_dataset
from pfl_cli.fl import train_federated
from pfl_cli.fl.api import make_algorithm
from pfl_cli.fl.store import ROLE_TRAIN, build_store
from pfl_cli.partition import PartitionConfig, partition_labels
from pfl_cli.rng import make_rng
from pflx_testing import small_config

RUN = dict(local_steps=50, lr=0.1, momentum=0.0, mlp_hidden=(32,))


def task(seed):
    ds = load_dataset("builtin:digits")
    cfg = PartitionConfig(scheme="dirichlet", alpha=0.1, num_clients=20, holdout_clients=0, test_fraction=0.3,
                          min_size=10, seed=seed)
    return ds, partition_labels(ds.y, cfg, num_classes=ds.num_classes, rng=make_rng(seed, "partition"), pool=ds.pool)


@pytest.mark.slow
@pytest.mark.parametrize("seed", [0, 1])
def test_calibrated_local_models_forget_less_of_the_other_clients_classes(seed):
    ds, part = task(seed)
    store = build_store(ds.x, ds.y, ds.num_classes, part, val_fraction=0.0, rng=make_rng(0, "validation-split"),
                        device="cpu")
    clients = torch.as_tensor(store.clients(ROLE_TRAIN))
    common = dict(RUN, clients_per_round=len(clients), seed=seed)
    fedavg = make_algorithm(small_config("fedavg", **common), store)
    for t in range(10):
        fedavg.run_round(t, clients, torch.Generator().manual_seed(t))
    index, length = store.test.rows(clients)
    pooled = torch.cat([index[i, :length[i]] for i in range(len(clients))])
    scores = {}
    for tau in (0.0, 1.0):  # tau = 0: FedAvg's local steps exactly (tests/algorithms/test_fedlc.py)
        alg = make_algorithm(small_config("fedlc", tau=tau, **common), store)
        alg.global_params = {k: v.clone() for k, v in fedavg.global_params.items()}
        local = {}
        alg.aggregate = lambda t, cohort, theta: local.update(theta)  # keep the round's local models
        alg.run_round(10, clients, torch.Generator().manual_seed(10))
        acc = [float((functional_call(alg.net, {k: v[i] for k, v in local.items()}, (store.inputs(pooled),))
                      .argmax(1) == store.y[pooled]).float().mean()) for i in range(len(clients))]
        scores[tau] = sum(acc) / len(acc)
    print(f"\nseed {seed}: local models on the pooled test splits: cross-entropy {scores[0.0]:.3f}, "
          f"calibrated {scores[1.0]:.3f}")
    assert scores[1.0] >= scores[0.0] + 0.02, scores


@pytest.mark.slow
@pytest.mark.parametrize("seed", [0, 1])
def test_global_model_stays_near_fedavgs(seed):
    ds, part = task(seed)
    best = {}
    for name in ("fedavg", "fedlc"):
        cfg = small_config(name, rounds=30, eval_every=10, clients_per_round=10, seed=seed, **RUN)
        s = train_federated(ds.x, ds.y, ds.num_classes, part, cfg, device="cpu").outcome.best.summaries()
        best[name] = s["train"]["pooled_accuracy"]
    print(f"\nseed {seed}: global model, pooled test accuracy: fedavg {best['fedavg']:.3f}, fedlc {best['fedlc']:.3f}")
    assert best["fedlc"] >= best["fedavg"] - 0.08 and best["fedlc"] > 0.5, best
