"""Learning test (slow tier): FedProto and FedNH beat FedAvg's training clients on the ring by >= 0.10 (issue 40).

The ring task of ``tests/algorithms/test_babu_rod_ala_learning.py`` (two classes a client, 100 clients, 20 holdout,
200 rounds of 10 clients): one global model is capped near the 10-way Bayes accuracy (~47%), a client that knows
its 2 classes reaches ~89%. FedAvg gets the best of three client learning rates on the validation split (once per
seed); each method runs with RING_BASE's settings it takes (client lr 0.05, new clients 10 epochs) and its own
defaults otherwise (FedProto: one local epoch of batches of 8, lambda = 1 / d; FedNH: five local epochs, rho 0.9).
Seeds 0 and 1 (the partition and the run) are both asserted. Measured 2026-11-27 (train clients, seed 0 / seed 1):
FedAvg 0.321 / 0.314 (its best lr by validation: 0.02 / 0.05); FedProto 0.582 / 0.590 (margins +0.26 / +0.28;
holdout clients, 10 epochs from the initial model towards the global prototypes: 0.650 / 0.605); FedNH's
personalized models 0.492 / 0.489 (margins +0.17 / +0.17; holdout clients, the global model trained 10 epochs:
0.597 / 0.569). FedNH's PM is the model of a client's last local training (five epochs from the global model),
whose cosine classifier keeps the global prototypes of all ten classes: it personalizes less than the methods
with a head of their own (FedPAC 0.85), as its paper's PM/GM balance intends.
"""

import pytest

from baseline_support import RING_BASE, assert_beats_fedavg, fedavg_train_accuracy, ring
from pflx_testing import small_config

BASE = small_config(**RING_BASE)


@pytest.fixture(scope="module", params=[0, 1])
def task(request):
    seed = request.param
    data = ring(seed)
    return seed, data, fedavg_train_accuracy(BASE, data, seed)


@pytest.mark.slow
@pytest.mark.parametrize("name", ["fedproto", "fednh"])
def test_beats_fedavg_on_train_clients_by_a_wide_margin(task, name):
    seed, data, fedavg = task
    assert_beats_fedavg(BASE, data, seed, name, fedavg)
