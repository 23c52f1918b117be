"""simulate never deals a training sample out as a test sample (DESIGN.md section 5).

Generated over the simulate modes (``pfl_cli.simulate.MODES``), both sampling regimes (``--replacement``,
``--no-replacement``), the shortage policies (``pfl_cli.simulate.SHORTAGE_POLICIES``) and three pool setups
of the server data: one pool; two pools (an official test pool) with ``--test-fraction`` (test samples
drawn from the train pool); two pools with the official test pool. The reference is obviously correct:
Python sets of the dataset indices, and of the samples' content digests (``sample_digests``: features and
label), that any client (train or holdout) trains on, against those that any client is tested on. A server
dataset holding copies of some samples at other indices is a case of its own: a copy is the same sample.
"""

import warnings

import numpy as np
import pytest

from pfl_cli.data import load_dataset
from pfl_cli.data.digest import sample_digests
from pfl_cli.errors import InfeasibleError
from pfl_cli.mdm import MDMParams
from pfl_cli.partition._alloc import split_counts
from pfl_cli.partition.stats import label_histograms
from pfl_cli.simulate import MODES, SHORTAGE_POLICIES, SimulateConfig, simulate_partition, validate_config

DIGITS = load_dataset("builtin:digits")
X, Y, C = DIGITS.x, DIGITS.y, DIGITS.num_classes
# Two components: near-uniform and skewed labels, sizes 20..59.
MODEL = MDMParams(np.array([0.5, 0.5]), np.vstack([np.full(C, 0.5), np.linspace(0.1, 3.0, C)]),
                  np.full((2, 40), 1 / 40), np.arange(20, 61))
LIKE = np.random.default_rng(7).integers(0, 8, size=(30, C))
OFFICIAL = np.zeros(len(Y), dtype=np.uint8)
OFFICIAL[::4] = 1                                   # every 4th sample in an official test pool
# Digits where about a fifth of the samples are copies of other samples of their class (same features, same label).
_rng = np.random.default_rng(11)
COPIES = X.copy()
for _c in range(C):
    _at = np.flatnonzero(Y == _c)
    _to = _rng.choice(_at, size=len(_at) // 5, replace=False)
    COPIES[_to] = X[_rng.choice(np.setdiff1d(_at, _to), size=len(_to))]
POOLS = {  # name: (pool, test_fraction)
    "one pool": (None, 0.3),
    "two pools, --test-fraction": (OFFICIAL, 0.3),
    "two pools, official test pool": (OFFICIAL, None),
}


def simulate(mode="mdm", replacement=True, pools="one pool", shortage="cap", num_clients=30, seed=0, like=LIKE,
             holdout=0.2, x=X):
    pool, fraction = POOLS[pools]
    cfg = validate_config(
        SimulateConfig(mode=mode, replacement=replacement, shortage=shortage, test_fraction=fraction,
                       holdout_clients=holdout, num_clients=None if mode == "conditional-iid" else num_clients),
        has_model=mode != "conditional-iid", like_clients=len(like), has_labels=True)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # shortage warnings: the crowded cases run short on purpose
        return simulate_partition(Y, cfg, num_classes=C, rng=np.random.default_rng(seed),
                                  model=None if mode == "conditional-iid" else MODEL, like_counts=like, pool=pool, x=x)


def overlap(part, x=X):
    """(indices, contents) that some client trains on and some client is tested on: Python sets, client by client."""
    train_idx, test_idx = set(), set()
    for j in range(part.num_clients):  # every client, holdout clients included
        train_idx.update(int(i) for i in part.train_of(j))
        test_idx.update(int(i) for i in part.test_of(j))
    content = {bytes(d) for d in sample_digests(x, Y, np.array(sorted(train_idx), dtype=np.int64))}
    tested = {bytes(d) for d in sample_digests(x, Y, np.array(sorted(test_idx), dtype=np.int64))}
    return len(train_idx & test_idx), len(content & tested), len(test_idx)


@pytest.mark.parametrize("pools", list(POOLS))
@pytest.mark.parametrize("replacement", [True, False], ids=["replacement", "no-replacement"])
@pytest.mark.parametrize("mode", MODES)
def test_no_training_sample_is_a_test_sample(mode, replacement, pools):
    part = simulate(mode=mode, replacement=replacement, pools=pools)
    by_index, by_content, tested = overlap(part)
    assert tested > 0                                # the check has test samples to look at
    assert (by_index, by_content) == (0, 0), f"{by_index} indices / {by_content} contents both train and test"


@pytest.mark.parametrize("replacement", [True, False], ids=["replacement", "no-replacement"])
@pytest.mark.parametrize("mode", MODES)
def test_copies_of_a_sample_are_one_sample(mode, replacement):
    """Copies of one sample at other indices all go to the train pool or all to the test pool."""
    assert len(np.unique(sample_digests(COPIES, Y), axis=0)) < len(Y) - 200  # the data does hold copies
    part = simulate(mode=mode, replacement=replacement, x=COPIES)
    by_index, by_content, tested = overlap(part, x=COPIES)
    assert tested > 0
    assert (by_index, by_content) == (0, 0), f"{by_index} indices / {by_content} contents both train and test"


@pytest.mark.parametrize("shortage", [s for s in SHORTAGE_POLICIES if s != "error"])
@pytest.mark.parametrize("replacement", [True, False], ids=["replacement", "no-replacement"])
def test_no_training_sample_is_a_test_sample_when_classes_run_short(replacement, shortage):
    """Crowded: the clients need more of some classes than the server holds (capped or reused)."""
    if replacement:  # one client alone needs more of each class than the server holds
        part = simulate(mode="conditional-iid", replacement=True, shortage=shortage, like=np.full((4, C), 150), holdout=0)
    else:  # the clients together need more than the server holds
        part = simulate(replacement=False, shortage=shortage, num_clients=120)
    assert part.info["shortage"]["short_classes"], "the case must run short"
    by_index, by_content, tested = overlap(part)
    assert tested > 0 and (by_index, by_content) == (0, 0)


@pytest.mark.parametrize("replacement", [True, False], ids=["replacement", "no-replacement"])
def test_histograms_stay_as_drawn(replacement):
    """Train histograms are exactly the copied ones; test histograms follow each client's train proportions."""
    part = simulate(mode="conditional-iid", replacement=replacement, pools="one pool", holdout=0)
    train = label_histograms(part.train_offsets, part.train_indices, Y, C)
    test = label_histograms(part.test_offsets, part.test_indices, Y, C)
    assert np.array_equal(train, LIKE)
    sizes = LIKE.sum(axis=1)
    want = split_counts(LIKE / sizes[:, None], np.floor(sizes * 0.3 / 0.7 + 0.5).astype(np.int64))
    assert np.array_equal(test, want)


def test_same_seed_same_bytes_other_seed_other_split():
    a, b, c = simulate(seed=3), simulate(seed=3), simulate(seed=4)
    for name in ("train_offsets", "train_indices", "test_offsets", "test_indices"):
        assert getattr(a, name).tobytes() == getattr(b, name).tobytes()
    assert not np.array_equal(a.test_indices, c.test_indices)


def test_impossible_requests_are_refused_up_front():
    # One client alone needs 150 train + 64 test samples of each class; digits has about 180 of each.
    big = np.full((2, C), 150)
    cfg = validate_config(SimulateConfig(mode="conditional-iid", shortage="error", test_fraction=0.3), has_model=False,
                          like_clients=2, has_labels=True)
    progress = []
    with pytest.raises(InfeasibleError, match=r"class \d runs short: a client needs up to 150 samples of it to train "
                                              r"on and a client up to \d+ to test on.*--shortage cap"):
        simulate_partition(Y, cfg, num_classes=C, rng=np.random.default_rng(0), like_counts=big, x=X,
                           on_progress=lambda *a: progress.append(a))
    assert progress == []                              # up front: refused before any progress line
    # A class with a single server sample that a client trains on leaves nothing to reuse as a test sample.
    labels = np.where(np.arange(len(Y)) == 0, C, Y)    # class C (an extra class) holds sample 0 only
    like = np.zeros((3, C + 1), dtype=np.int64)
    like[:, C] = 1
    like[:, 0] = 5
    cfg = validate_config(SimulateConfig(mode="conditional-iid", shortage="replace", test_fraction=0.5), has_model=False,
                          like_clients=3, has_labels=True)
    with pytest.raises(InfeasibleError, match=rf"class {C} runs short: the clients need 1 test samples of it but its 1 "
                                              r"server sample\(s\) all go to training.*--test-fraction 0"):
        simulate_partition(labels, cfg, num_classes=C + 1, rng=np.random.default_rng(0), like_counts=like)
    # Enough samples of class 0 in number, but both are copies of one sample: they cannot be split.
    x = np.stack([X[0], X[0], X[1], X[2]])
    cfg = validate_config(SimulateConfig(mode="conditional-iid", shortage="error", test_fraction=0.5), has_model=False,
                          like_clients=1, has_labels=True)
    with pytest.raises(InfeasibleError, match=r"class 0 runs short: .* copies of one sample that cannot be split"):
        simulate_partition(np.array([0, 0, 1, 1]), cfg, num_classes=2, rng=np.random.default_rng(0),
                           like_counts=np.array([[1, 1]]), x=x)
    part = simulate_partition(np.array([0, 0, 1, 1]), cfg, num_classes=2, rng=np.random.default_rng(0),
                              like_counts=np.array([[1, 1]]), x=np.stack([X[0], X[3], X[1], X[2]]))
    assert part.train_sizes.tolist() == [2] and part.test_sizes.tolist() == [2]
