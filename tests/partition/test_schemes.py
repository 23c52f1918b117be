"""Each scheme's defining property, on synthetic labels."""

import numpy as np
import pytest

from pfl_cli.errors import ConfigError, InfeasibleError
from pfl_cli.partition import PartitionConfig, partition_labels, partition_stats, validate_config
from pfl_cli.partition.pathological import class_sets
from pfl_cli.partition.quantity import client_sizes, fill_counts

LABELS = np.repeat(np.arange(10), 200)  # 2000 samples, 10 balanced classes


def make(labels=LABELS, num_classes=10, pool=None, client=None, seed=0, **kw):
    cfg = PartitionConfig(**kw)
    n_train = len(labels) if pool is None else int((pool == 0).sum())
    cfg = validate_config(cfg, num_samples=n_train, num_classes=num_classes, has_labels=True,
                          has_clients=client is not None, has_test_pool=pool is not None)
    return partition_labels(labels, cfg, num_classes=num_classes, rng=np.random.default_rng(seed), pool=pool, client=client)


def all_indices(part):
    return np.concatenate([part.train_indices, part.test_indices])


def train_hist(part, labels=LABELS, num_classes=10):
    hist, _ = partition_stats(part, labels, num_classes)
    return hist


def test_iid_sizes_differ_by_at_most_one_and_cover_everything():
    part = make(num_clients=7, test_fraction=0.0)
    sizes = part.train_sizes
    assert sizes.max() - sizes.min() <= 1 and sizes.sum() == 2000
    assert np.array_equal(np.sort(all_indices(part)), np.arange(2000))


def test_dirichlet_small_alpha_is_skewed_large_alpha_is_not():
    skew = partition_stats(make(num_clients=20, alpha=0.05), LABELS, 10)[1]["heterogeneity"]
    flat = partition_stats(make(num_clients=20, alpha=1000.0), LABELS, 10)[1]["heterogeneity"]
    assert skew["js_divergence_to_global"]["mean"] > 0.5
    assert flat["js_divergence_to_global"]["mean"] < 0.02
    assert flat["classes_per_client"]["min"] == 10


def test_dirichlet_every_sample_exactly_once_and_min_size_met():
    part = make(num_clients=50, alpha=0.1, min_size=25, test_fraction=0.0)
    idx = all_indices(part)
    assert len(idx) == len(np.unique(idx)) == 2000
    assert part.train_sizes.min() >= 25
    assert part.info["repaired"] is True and part.info["samples_moved"] > 0


def test_dirichlet_per_class_alpha():
    alpha = [1000.0] * 5 + [0.01] * 5
    hist = train_hist(make(num_clients=10, alpha=alpha, test_fraction=0.0, min_size=0))
    spread = (hist > 0).sum(axis=0)
    assert (spread[:5] == 10).all() and (spread[5:] <= 3).all()


def test_self_balancing_caps_client_sizes():
    plain = make(num_clients=10, alpha=0.1, test_fraction=0.0, min_size=0)
    balanced = make(num_clients=10, alpha=0.1, test_fraction=0.0, min_size=0, self_balancing=True)
    assert balanced.train_sizes.max() < plain.train_sizes.max()


@pytest.mark.parametrize("assign", ["random", "deterministic", "first-deterministic"])
def test_pathological_exactly_n_classes_per_client(assign):
    hist = train_hist(make(num_clients=20, classes_per_client=2, assign=assign, test_fraction=0.0))
    assert ((hist > 0).sum(axis=1) == 2).all()
    if assign == "deterministic":
        assert np.flatnonzero(hist[3]).tolist() == [3, 4]
    if assign == "first-deterministic":
        assert all(hist[j, j % 10] > 0 for j in range(20))


def test_pathological_random_balances_clients_per_class_and_equal_shares():
    held = class_sets(100, 10, 2, assign="random", rng=np.random.default_rng(0))
    assert (held.sum(axis=1) == 2).all() and (held.sum(axis=0) == 20).all()
    hist = train_hist(make(num_clients=20, classes_per_client=2, class_shares="equal", test_fraction=0.0))
    nonzero = hist[hist > 0]
    assert nonzero.max() - nonzero.min() <= 1  # 200 samples of a class over 4 clients: 50 each


def test_pathological_uniform_shares_stay_within_pfedhn_range():
    hist = train_hist(make(num_clients=20, classes_per_client=2, test_fraction=0.0))
    per_class = hist.sum(axis=0)
    share = hist / per_class
    held = share[hist > 0]
    # four U(0.4, 0.6) weights normalized: each share lies in [0.4/2.2, 0.6/1.8]
    assert held.min() >= 0.4 / 2.2 - 0.01 and held.max() <= 0.6 / 1.8 + 0.01


def test_shards_each_client_gets_its_shards_of_sorted_labels():
    part = make(num_clients=10, shards_per_client=2, test_fraction=0.0)
    assert (part.train_sizes == 200).all()
    assert ((train_hist(part) > 0).sum(axis=1) <= 2).all()


def test_quantity_linear_sizes_are_proportional():
    part = make(num_clients=4, quantity="linear", test_fraction=0.0)
    np.testing.assert_array_equal(part.train_sizes, [200, 400, 600, 800])


def test_quantity_with_dirichlet_keeps_sizes_and_skews_labels():
    part = make(num_clients=20, quantity="lognormal:1.0", alpha=0.1, test_fraction=0.0, min_size=10)
    sizes, _ = client_sizes("lognormal", 1.0, num_clients=20, total=2000, min_size=10,
                            rng=np.random.default_rng(0).spawn(3)[0])
    assert part.train_sizes.sum() == 2000 and part.train_sizes.min() >= 10
    js = partition_stats(part, LABELS, 10)[1]["heterogeneity"]["js_divergence_to_global"]["mean"]
    assert js > 0.3
    assert part.info["quantity"]["law"] == "lognormal"


def test_fill_counts_never_exceeds_supply():
    rng = np.random.default_rng(0)
    supply = np.array([5, 500, 50, 0])
    sizes = np.array([100, 200, 255])
    q = rng.dirichlet(np.ones(4), size=3)
    counts = fill_counts(sizes, q, supply)
    np.testing.assert_array_equal(counts.sum(axis=1), sizes)
    assert (counts.sum(axis=0) <= supply).all() and (counts >= 0).all()


def test_fill_counts_gives_rounding_leftovers_to_the_clients_own_classes():
    # 75 = 37.5 + 37.5: flooring leaves one sample per client, which must come from one of its two
    # classes, not from the lowest class that still has supply (issue 34, item 6)
    supply = np.full(10, 200)
    q = np.zeros((5, 10))
    for j in range(5):
        q[j, [2 * j + 1, (2 * j + 4) % 10]] = 0.5
    counts = fill_counts(np.full(5, 75), q, supply)
    np.testing.assert_array_equal(counts.sum(axis=1), 75)
    assert (counts[q == 0] == 0).all()


def test_classes_per_client_with_given_sizes_keeps_exactly_those_classes():
    part = make(num_clients=20, classes_per_client=2, sizes=[75] * 20, test_fraction=0.0)
    np.testing.assert_array_equal(part.train_sizes, 75)
    assert ((train_hist(part) > 0).sum(axis=1) == 2).all()


def test_natural_ids_keep_first_appearance_order_and_use_the_test_pool():
    labels = np.array([0, 1, 0, 1, 1, 0, 0, 1])
    client = np.array(["b", "a", "b", "c", "a", "b", "c", "a"])
    pool = np.array([0, 0, 0, 0, 0, 1, 1, 1], dtype=np.uint8)
    part = make(labels=labels, num_classes=2, pool=pool, client=client, natural_id=True)
    assert part.client_name.tolist() == ["b", "a", "c"]
    assert [part.train_of(j).tolist() for j in range(3)] == [[0, 2], [1, 4], [3]]
    assert [part.test_of(j).tolist() for j in range(3)] == [[5], [7], [6]]


def test_test_pool_is_matched_to_train_labels():
    labels = np.concatenate([LABELS, np.repeat(np.arange(10), 50)])
    pool = np.concatenate([np.zeros(2000), np.ones(500)]).astype(np.uint8)
    part = make(labels=labels, pool=pool, num_clients=20, classes_per_client=2)
    for j in range(20):
        assert set(labels[part.test_of(j)]) <= set(labels[part.train_of(j)])
        assert (part.test_of(j) >= 2000).all() and (part.train_of(j) < 2000).all()
    assert part.test_sizes.sum() == 500


def test_test_fraction_and_holdout_clients():
    part = make(num_clients=10, test_fraction=0.25, holdout_clients=0.3)
    assert part.test_sizes.sum() == 500 and (part.test_sizes == 50).all()
    assert part.role.sum() == 3
    assert make(num_clients=10, holdout_clients=4).role.sum() == 4


def test_seeds_reproduce_and_differ():
    a, b, c = (make(num_clients=10, alpha=0.3, seed=s) for s in (1, 1, 2))
    assert np.array_equal(a.train_indices, b.train_indices) and np.array_equal(a.role, b.role)
    assert not np.array_equal(a.train_indices, c.train_indices)


@pytest.mark.parametrize(
    "kw, err, match",
    [
        ({"alpha": 0.0}, ConfigError, "alpha must be > 0"),
        ({"alpha": [0.1, 0.2]}, ConfigError, "one float or 10 floats"),
        ({"num_clients": 0}, ConfigError, "num-clients must be an integer >= 1; got 0"),
        ({"num_clients": 2001}, InfeasibleError, "more than the 2000 samples"),
        ({"num_clients": 100, "min_size": 21, "alpha": 0.1}, InfeasibleError, "no partition can meet it"),
        ({"classes_per_client": 11}, ConfigError, "classes-per-client must be <= the number of classes"),
        ({"scheme": "bogus"}, ConfigError, "scheme must be one of"),
        ({"alpha": 0.1, "classes_per_client": 2}, ConfigError, "several schemes"),
        ({"quantity": "lognormal:-1"}, ConfigError, "must be > 0"),
        ({"quantity": "zipf"}, ConfigError, "quantity must be one of"),
        ({"test_fraction": 1.0}, ConfigError, "test-fraction must be in"),
        ({"holdout_clients": 2.5}, ConfigError, "holdout-clients must be"),
        ({"natural_id": True}, ConfigError, "needs a client column"),
        ({"shards_per_client": 300}, InfeasibleError, "shards need at least"),
    ],
)
def test_bad_requests_fail_before_drawing(kw, err, match):
    with pytest.raises(err, match=match):
        validate_config(PartitionConfig(**kw), num_samples=2000, num_classes=10, has_labels=True,
                        has_clients=False, has_test_pool=False)


def test_all_holdout_is_infeasible():
    with pytest.raises(InfeasibleError, match="leaves no train client"):
        make(num_clients=5, holdout_clients=5)
