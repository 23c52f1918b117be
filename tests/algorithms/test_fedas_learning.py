"""Learning test (slow tier): FedAS beats FedAvg's training clients where personalization is needed.

The setting of ``tests/algorithms/test_babu_rod_ala_learning.py``: the ring task (``pfl_cli.data.ring``)
with two classes a client, 100 clients (20 holdout), 200 rounds of 10 clients and 20 local steps;
one global model is capped near the 10-way Bayes accuracy (~47 %), a client that knows its two classes
can reach ~89 %. FedAvg gets the best of three client learning rates on the train clients' validation
split; FedAS runs once with its defaults (alignment: SGD 0.01, one epoch, batches of 16). Seeds 0 and 1
(the partition and the run) are both asserted. Measured (train clients, seed 0 / seed 1): FedAvg 0.327 / 0.357; FedAS
0.671 / 0.718 (margins +0.34 / +0.36; holdout clients 0.673 / 0.747).
"""

import pytest

from baseline_support import RING_BASE, assert_beats_fedavg, fedavg_train_accuracy, ring
from pflx_testing import small_config

BASE = small_config(**RING_BASE)


@pytest.mark.slow
@pytest.mark.parametrize("seed", [0, 1])
def test_fedas_beats_fedavg_on_train_clients_by_a_wide_margin(seed):
    data = ring(seed)
    assert_beats_fedavg(BASE, data, seed, "fedas", fedavg_train_accuracy(BASE, data, seed))
