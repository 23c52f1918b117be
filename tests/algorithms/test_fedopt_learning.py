"""FedAdam and FedYogi against FedAvg's plain server step (Reddi et al., ICLR 2021, §5), slow tier, two seeds.

The task, used by no other learning test: the Gaussian mixture of ``gmm:clients`` (d = 20, k = 10 classes,
variance 0.2, 2,400 points) as a classification task, split over 40 clients by a Dirichlet(0.1) label
partition (8 of them new clients); 60 rounds of 8 clients, 10 plain SGD steps each (batch 16).

Where the global lr matters, the adaptive server step wins: at a client lr (0.005) at which FedAvg's step
(the mean model, server lr 1) moves the global model too little in 60 rounds, FedAdam and FedYogi at
server lr 0.03 (inside Reddi et al.'s grid, App. D) reach a far higher train-client accuracy. Measured
(train clients' mean accuracy): seed 0, FedAvg 0.405, FedAdam 0.786, FedYogi 0.788; seed 1, 0.612, 0.894,
0.895. What does not hold on this task: with the client lr tuned on the validation split over {0.005, 0.02,
0.05, 0.2}, FedAvg catches up (seed 0: FedAvg 0.815 at lr 0.2, FedAdam 0.764, FedYogi 0.788; seed 1: 0.894,
0.893, 0.895): the test asserts that they are then level within 0.08, not that FedOpt leads.
"""

import functools

import pytest

from pfl_cli.data import load_dataset
from pfl_cli.fl import train_federated
from pfl_cli.partition import PartitionConfig, partition_labels
from pfl_cli.registry import train_config
from pfl_cli.rng import make_rng

pytestmark = pytest.mark.slow

BASE = dict(rounds=60, eval_every=20, clients_per_round=8, local_steps=10, batch_size=16, momentum=0.0,
            mlp_hidden=(32,))
METHODS = {"fedavg": dict(algorithm="fedavg"),  # server_lr 1, no momentum: McMahan et al. Alg. 1's mean
           "fedadam": dict(algorithm="fedopt", server_optimizer="adam", server_lr=0.03, local_epochs=None),
           "fedyogi": dict(algorithm="fedopt", server_optimizer="yogi", server_lr=0.03, local_epochs=None)}
CLIENT_LRS = (0.005, 0.02, 0.05, 0.2)
SLOW_LR = 0.005
LEAD = 0.15   # measured leads at SLOW_LR: 0.38 (seed 0), 0.28 (seed 1)
LEVEL = 0.08  # tuned: FedOpt at most 0.051 behind (seed 0), level (seed 1)


@functools.lru_cache(maxsize=None)
def task(seed):
    ds = load_dataset(f"gmm:clients?d=20&k=10&variance=0.2&num_clients=40&client_size=60&seed={seed}")
    cfg = PartitionConfig(scheme="dirichlet", alpha=0.1, num_clients=40, holdout_clients=8, seed=seed)
    return ds, partition_labels(ds.y, cfg, num_classes=ds.num_classes, rng=make_rng(seed, "partition"), pool=ds.pool)


@functools.lru_cache(maxsize=None)
def run(seed, method, lr):
    """(validation pooled accuracy, train clients' mean accuracy) at the best evaluation."""
    ds, part = task(seed)
    cfg = train_config(**{**BASE, **METHODS[method], "lr": lr, "seed": seed})
    s = train_federated(ds.x, ds.y, ds.num_classes, part, cfg, device="cpu").outcome.best.summaries()
    return s["val"]["pooled_accuracy"], s["train"]["mean_accuracy"]


@pytest.mark.parametrize("seed", [0, 1])
def test_fedadam_and_fedyogi_beat_fedavgs_server_step_where_the_global_lr_matters(seed):
    fedavg = run(seed, "fedavg", SLOW_LR)[1]
    for method in ("fedadam", "fedyogi"):
        got = run(seed, method, SLOW_LR)[1]
        print(f"seed {seed} client lr {SLOW_LR}: {method} {got:.3f} fedavg {fedavg:.3f}")
        assert got >= fedavg + LEAD, (method, got, fedavg)
    # the client lr tuned on validation: level, not ahead (the note above)
    tuned = {m: max(run(seed, m, lr) for lr in CLIENT_LRS)[1] for m in METHODS}
    print(f"seed {seed} tuned client lr: {tuned}")
    for method in ("fedadam", "fedyogi"):
        assert tuned[method] >= tuned["fedavg"] - LEVEL, tuned
