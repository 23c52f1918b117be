"""Simulated partitions: histograms, replacement regimes, shortage policies, baselines (specs/mdm.md §8 items 17-18)."""

import warnings

import numpy as np
import pytest

from pfl_cli.errors import ConfigError, InfeasibleError, InputError
from pfl_cli.mdm import MDMParams
from pfl_cli.partition.stats import label_histograms
from pfl_cli.simulate import SimulateConfig, deal, simulate_partition, validate_config

LABELS = np.repeat(np.arange(4), [300, 200, 250, 250])
MODEL = MDMParams(np.array([0.5, 0.5]), np.array([[0.3, 0.3, 0.3, 0.3], [4.0, 1.0, 1.0, 1.0]]),
                  np.full((2, 10), 0.1), np.arange(11, 22))


def run(labels=LABELS, model=MODEL, like=None, **kw):
    kw.setdefault("num_clients", 40)
    cfg = validate_config(SimulateConfig(**kw), has_model=model is not None, like_clients=None if like is None else len(like),
                          has_labels=True)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return simulate_partition(labels, cfg, num_classes=4, model=model, like_counts=like, rng=np.random.default_rng(0))


def test_train_histograms_match_the_drawn_counts_exactly():
    counts = np.random.default_rng(1).integers(0, 30, size=(25, 4))
    train, test, info = deal(counts, np.zeros_like(counts), LABELS, np.arange(len(LABELS)), replacement=True,
                             shortage="error", rng=np.random.default_rng(2))
    assert np.array_equal(label_histograms(*train, LABELS, 4), counts)
    assert info["short_classes"] == [] and len(test[1]) == 0


def test_with_replacement_no_index_repeats_within_a_client():
    part = run(replacement=True, test_fraction=0.2)
    for j in range(part.num_clients):
        both = np.concatenate([part.train_of(j), part.test_of(j)])
        assert len(both) == len(np.unique(both))


def test_without_replacement_no_index_repeats_within_or_across_clients():
    part = run(replacement=False, num_clients=30, shortage="error", test_fraction=0.2)
    every = np.concatenate([part.train_indices, part.test_indices])
    assert len(every) == len(np.unique(every))


def test_shortage_error_is_up_front_and_explains():
    with pytest.raises(InfeasibleError, match=r"class \d runs short: the clients together need \d+ samples"):
        run(replacement=False, num_clients=200, shortage="error")


def test_shortage_cap_and_replace_are_recorded():
    capped = run(replacement=False, num_clients=200, shortage="cap", test_fraction=0.0)
    info = capped.info["shortage"]
    assert info["policy"] == "cap" and info["samples_capped"] > 0 and info["short_classes"]
    every = capped.train_indices
    assert len(every) == len(np.unique(every)) == len(LABELS)         # capped: everything used once
    replaced = run(replacement=False, num_clients=200, shortage="replace", test_fraction=0.0)
    assert replaced.info["shortage"]["samples_reused"] == replaced.info["requested_train_samples"] - len(LABELS)
    assert replaced.train_sizes.sum() == replaced.info["requested_train_samples"]


def test_a_class_missing_from_the_server_data():
    labels = np.repeat([0, 1, 2], 100)                     # class 3 absent
    with pytest.raises(InfeasibleError, match="no sample of it"):
        run(labels=labels, shortage="replace")
    part = run(labels=labels, shortage="cap", test_fraction=0.0)
    assert 3 in part.info["shortage"]["short_classes"]


def test_iid_baseline_pooled_proportions_match_the_central_marginal():
    part = run(mode="iid", num_clients=3000, test_fraction=0.0)
    pooled = np.bincount(LABELS[part.train_indices], minlength=4) / len(part.train_indices)
    assert np.max(np.abs(pooled - np.bincount(LABELS) / len(LABELS))) < 0.01
    assert part.train_sizes.min() >= 11 and part.train_sizes.max() <= 20


def test_conditional_iid_copies_each_true_histogram():
    like = np.random.default_rng(3).integers(0, 9, size=(12, 4))
    part = run(mode="conditional-iid", model=None, like=like, num_clients=None, test_fraction=0.0)
    assert np.array_equal(label_histograms(part.train_offsets, part.train_indices, LABELS, 4), like)


def test_holdout_clients_and_test_pool():
    pool = np.zeros(len(LABELS), dtype=np.uint8)
    pool[::5] = 1
    cfg = validate_config(SimulateConfig(num_clients=20, holdout_clients=0.25), has_model=True, like_clients=None,
                          has_labels=True)
    part = simulate_partition(LABELS, cfg, num_classes=4, model=MODEL, pool=pool, rng=np.random.default_rng(4))
    assert (part.role == 1).sum() == 5
    assert np.all(pool[part.train_indices] == 0) and np.all(pool[part.test_indices] == 1)


def test_category_mismatch_and_bad_options():
    wrong = MDMParams(np.array([1.0]), np.ones((1, 3)), np.ones((1, 1)), np.array([5, 6]))
    with pytest.raises(InputError, match="model has 3 categories but the server dataset has 4 classes"):
        run(model=wrong)
    with pytest.raises(ConfigError, match="mode must be one of"):
        run(mode="fancy")
    with pytest.raises(ConfigError, match="conditional-iid makes one client per true client"):
        run(mode="conditional-iid", like=np.ones((3, 4), dtype=int), num_clients=5)
    with pytest.raises(ConfigError, match="needs --num-clients"):
        run(num_clients=None)


def test_same_seed_same_partition():
    a, b = run(), run()
    assert np.array_equal(a.train_indices, b.train_indices) and np.array_equal(a.test_indices, b.test_indices)


def test_on_progress_reports_histograms_each_class_and_the_split_and_changes_nothing():
    calls = []
    cfg = validate_config(SimulateConfig(num_clients=40), has_model=True, like_clients=None, has_labels=True)
    seen = simulate_partition(LABELS, cfg, num_classes=4, model=MODEL, rng=np.random.default_rng(0),
                              on_progress=lambda done, total, status: calls.append((done, total, status["step"])))
    plain = run()
    assert np.array_equal(seen.train_indices, plain.train_indices) and np.array_equal(seen.test_indices, plain.test_indices)
    assert [c[:2] for c in calls] == [(d, 6) for d in range(1, 7)]
    assert [c[2] for c in calls] == ["histograms of 40 clients drawn (mdm)", *(f"class {c}/4 dealt" for c in range(1, 5)),
                                     "test split and holdout clients"]
