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

FedProto's scores above are its decision layer's (``inference: head``). Its paper's rule, the nearest global
prototype (``inference: prototype``, the default), measured 2026-11-27 on the same runs (seed 0 / seed 1): train
clients 0.198 / 0.219 over all ten classes, 0.573 / 0.575 among the client's own classes (``--label-mask``, the
authors' code's rule: ``lib/update.py``, ``j in classes_list[idx]``), against the head's 0.582 / 0.590 (masked
0.582 / 0.590); holdout clients 0.289 / 0.275 (masked 0.625 / 0.618). A client's model trains on its two classes
only, so its representation of a sample lies near no particular prototype of the eight classes it never saw:
over all classes the rule misses the beat-FedAvg claim (it holds for the head), among the client's own classes
it is within 0.02 of the head. Asserted: the head's claim, and the prototype rule within 0.05 of the head under
the label mask.
"""

import pytest

from baseline_support import RING_BASE, assert_beats_fedavg, fedavg_train_accuracy, ring, train
from pflx_testing import small_config

BASE = small_config(**RING_BASE)
HEAD = small_config(**RING_BASE, inference="head")  # FedProto's decision layer (the others take no such key)


@pytest.fixture(scope="module", params=[0, 1])
def task(request):
    seed = request.param
    data = ring(seed)
    return seed, data, fedavg_train_accuracy(BASE, data, seed)


@pytest.mark.slow
@pytest.mark.parametrize("name", ["fedproto", "fednh"])
def test_beats_fedavg_on_train_clients_by_a_wide_margin(task, name):
    seed, data, fedavg = task
    assert_beats_fedavg(HEAD, data, seed, name, fedavg)


@pytest.mark.slow
def test_fedproto_nearest_prototype_matches_its_head_among_a_clients_classes(task):
    seed, data, _ = task
    proto, head = (train(BASE, data, seed, algorithm="fedproto", inference=rule) for rule in ("prototype", "head"))
    print(f"\nseed {seed} fedproto train: prototype {proto['train']['mean_accuracy']:.3f} (masked "
          f"{proto['train']['mean_accuracy_lm']:.3f}), head {head['train']['mean_accuracy']:.3f} (masked "
          f"{head['train']['mean_accuracy_lm']:.3f}); holdout prototype {proto['holdout']['mean_accuracy']:.3f}")
    assert proto["train"]["mean_accuracy_lm"] >= head["train"]["mean_accuracy_lm"] - 0.05
    assert proto["train"]["mean_accuracy_lm"] > 0.5   # above a two-class client's chance
