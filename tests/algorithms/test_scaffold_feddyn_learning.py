"""Learning claim of SCAFFOLD and FedDyn (issue 40): under strong heterogeneity with many local steps they
reach FedAvg's accuracy in fewer rounds.

Task (used by no other test): builtin:digits over 30 clients by Dirichlet(0.1) labels, 10 clients a round,
50 local steps of plain SGD (lr 0.1, batch 16, no momentum for any of the three, so only the drift
correction differs), 60 rounds, the global model scored on the train clients' test splits every 5 rounds.
The target is FedAvg's plateau: the mean of its last three evaluations, less one point. Measured (seeds 0
and 1), rounds to the target: FedAvg 30 and 30, SCAFFOLD 20 and 25, FedDyn (alpha 0.1) 20 and 20.

FedDyn is run at alpha 0.1, the top of the paper's grid {0.1, 0.01, 0.001} (Acar et al. 2021, §5): at the
default 0.01 it leads FedAvg for the first 25 rounds but levels off below FedAvg's plateau (94.4 % against
95.2 %, 95.0 % against 96.6 %), at 0.001 lower still (94.4 %, 95.4 %).
"""

import pytest

from pfl_cli.data import load_dataset
from pfl_cli.fl import train_federated
from pfl_cli.partition import PartitionConfig, partition_labels
from pfl_cli.rng import make_rng
from pflx_testing import small_config

RUN = dict(rounds=60, eval_every=5, local_steps=50, lr=0.1, clients_per_round=10, mlp_hidden=(32,), batch_size=16,
           val_fraction=0.0, momentum=0.0)


def curve(data, seed, algorithm, **opts):
    ds, part = data
    cfg = small_config(algorithm=algorithm, seed=seed, **{**RUN, **opts})
    history = train_federated(ds.x, ds.y, ds.num_classes, part, cfg, device="cpu").outcome.history
    return [(r, v) for r, g, m, v in history if g == "train" and m == "pooled_accuracy"]


def rounds_to(points, target):
    return next((r for r, v in points if v >= target), None)


@pytest.mark.slow
@pytest.mark.parametrize("seed", [0, 1])
def test_scaffold_and_feddyn_reach_fedavgs_accuracy_in_fewer_rounds(seed):
    ds = load_dataset("builtin:digits")
    cfg = PartitionConfig(scheme="dirichlet", alpha=0.1, num_clients=30, holdout_clients=0, test_fraction=0.3,
                          seed=seed)
    data = ds, partition_labels(ds.y, cfg, num_classes=ds.num_classes, rng=make_rng(seed, "partition"), pool=ds.pool)
    fedavg = curve(data, seed, "fedavg")
    target = sum(v for _, v in fedavg[-3:]) / 3 - 0.01
    reached = {"fedavg": rounds_to(fedavg, target),
               "scaffold": rounds_to(curve(data, seed, "scaffold"), target),
               "feddyn": rounds_to(curve(data, seed, "feddyn", alpha=0.1), target)}
    assert None not in reached.values(), (target, reached)
    assert reached["scaffold"] < reached["fedavg"] and reached["feddyn"] < reached["fedavg"], (target, reached)
