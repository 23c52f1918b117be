"""The ``ring:`` synthetic task (specs/pefll.md §7.2 L2): arrays, determinism, Bayes accuracies, CLI."""

import json

import numpy as np
import pytest

from pfl_cli.data import POOL_TEST, POOL_TRAIN, load_dataset
from pfl_cli.errors import DatasetError


def spec_means(classes=10, radius=2.0):
    """The class means as the spec states them: equally spaced on a circle, class c at 2*pi*c/C."""
    angle = 2 * np.pi * np.arange(classes) / classes
    return radius * np.stack([np.cos(angle), np.sin(angle)], axis=1)


def log_likelihoods(x2, means, sigma=1.0):
    """Log N(x2; mean_c, sigma^2 I_2) for every class; shape (n, C)."""
    sq = ((x2[:, None, :] - means[None, :, :]) ** 2).sum(axis=2)
    return -sq / (2 * sigma**2) - np.log(2 * np.pi * sigma**2)


@pytest.mark.parametrize("spec", ["ring:", "ring:?seed=0", "RING:"])
def test_default_shapes_dtypes_counts_and_pool_order(spec):
    ds = load_dataset(spec)
    assert ds.spec == spec
    assert ds.x.shape == (10 * (126 + 200), 64) and ds.x.dtype == np.float32
    assert ds.y.dtype == np.int64 and ds.num_classes == 10 and ds.client is None
    assert ds.pool.dtype == np.uint8
    n_train = 10 * 126
    assert (ds.pool[:n_train] == POOL_TRAIN).all() and (ds.pool[n_train:] == POOL_TEST).all()
    assert np.bincount(ds.y[ds.pool == POOL_TRAIN], minlength=10).tolist() == [126] * 10
    assert np.bincount(ds.y[ds.pool == POOL_TEST], minlength=10).tolist() == [200] * 10
    info = ds.info()
    assert info["pool_sizes"] == {"train": 1260, "test": 2000} and info["input_shape"] == [64]
    assert info["dtype"] == "float32" and info["has_test_pool"] is True
    assert info["generator"] == {"scheme": "ring", "classes": 10, "train_per_class": 126, "test_per_class": 200,
                                 "radius": 2.0, "sigma": 1.0, "noise_dims": 62, "seed": 0}
    json.dumps(info)


def test_options_shape_the_data():
    ds = load_dataset("ring:?classes=4&train_per_class=3&test_per_class=5&radius=1.5&sigma=0.5&noise_dims=6&seed=2")
    assert ds.x.shape == (4 * 8, 8) and ds.num_classes == 4
    assert np.bincount(ds.y[:12], minlength=4).tolist() == [3] * 4
    assert np.bincount(ds.y[12:], minlength=4).tolist() == [5] * 4
    assert ds.pool.tolist() == [0] * 12 + [1] * 20
    no_test = load_dataset("ring:?test_per_class=0&noise_dims=0")
    assert no_test.x.shape == (1260, 2) and not no_test.has_test_pool


def test_geometry_matches_the_spec():
    ds = load_dataset("ring:?train_per_class=4000&test_per_class=0")
    x = ds.x.astype(np.float64)
    for c, mean in enumerate(spec_means()):
        xc = x[ds.y == c]
        assert np.allclose(xc[:, :2].mean(axis=0), mean, atol=0.06)
        assert np.allclose(xc[:, :2].std(axis=0), 1.0, atol=0.04)
    noise = x[:, 2:]
    assert abs(noise.mean()) < 0.01 and abs(noise.std() - 1.0) < 0.01
    # The nuisance dims carry no class information.
    assert np.abs(np.array([noise[ds.y == c].mean(axis=0) for c in range(10)])).max() < 0.08


def test_deterministic_and_seed_dependent():
    a, b = load_dataset("ring:"), load_dataset("ring:?seed=0")
    for name in ("x", "y", "pool"):
        assert getattr(a, name).tobytes() == getattr(b, name).tobytes()
    assert a.content_sha256 == b.content_sha256
    c = load_dataset("ring:?seed=1")
    assert not np.array_equal(a.x, c.x) and not np.array_equal(a.y, c.y)
    # Each pool has its own stream: a bigger test pool leaves the train pool untouched.
    d = load_dataset("ring:?test_per_class=300")
    assert np.array_equal(d.x[:1260], a.x[:1260]) and np.array_equal(d.y[:1260], a.y[:1260])


def test_bayes_accuracy_10_way_is_about_47_percent():
    """Equal priors: argmax of the Gaussian likelihood on the 2 informative dims, 20,000 draws."""
    ds = load_dataset("ring:?train_per_class=2000&test_per_class=0&seed=3")
    assert ds.num_samples == 20_000
    pred = log_likelihoods(ds.x[:, :2].astype(np.float64), spec_means()).argmax(axis=1)
    acc = 100 * np.mean(pred == ds.y)
    assert abs(acc - 46.6) <= 1.5, acc


def test_bayes_accuracy_of_a_random_class_pair_is_about_89_percent():
    """Mean over random pairs (a, b) of distinct classes of the 2-way Bayes accuracy.

    Every draw of class a is paired with a uniformly random other class b and classified
    between the two by likelihood; averaging over draws averages over random pairs.
    """
    ds = load_dataset("ring:?train_per_class=2000&test_per_class=0&seed=4")
    rng = np.random.default_rng(0)
    other = (ds.y + rng.integers(1, 10, size=ds.num_samples)) % 10
    assert (other != ds.y).all()
    ll = log_likelihoods(ds.x[:, :2].astype(np.float64), spec_means())
    rows = np.arange(ds.num_samples)
    acc = 100 * np.mean(ll[rows, ds.y] > ll[rows, other])
    assert abs(acc - 89.4) <= 2.0, acc
    # The same number exactly: Phi(d / 2 sigma) averaged over the 45 pairs.
    from math import erf, sin, pi, sqrt

    exact = np.mean([0.5 * (1 + erf(2 * sin(pi * abs(a - b) / 10) / sqrt(2)))
                     for a in range(10) for b in range(a + 1, 10)])
    assert abs(100 * exact - 89.4) < 0.1


@pytest.mark.parametrize(
    ("spec", "needle"),
    [
        ("ring:?clases=10", "unknown option(s) ['clases']"),
        ("ring:?train_per_class=-1", "train_per_class must be >= 1; got -1"),
        ("ring:?train_per_class=0", "train_per_class must be >= 1; got 0"),
        ("ring:?test_per_class=-5", "test_per_class must be >= 0; got -5"),
        ("ring:?noise_dims=-2", "noise_dims must be >= 0; got -2"),
        ("ring:?classes=1", "classes must be >= 2; got 1"),
        ("ring:?classes=0", "classes must be >= 2; got 0"),
        ("ring:?sigma=0", "sigma must be finite and > 0; got 0.0"),
        ("ring:?radius=-1", "radius must be finite and >= 0; got -1.0"),
        ("ring:?radius=nan", "radius must be finite and >= 0; got nan"),
        ("ring:?seed=-3", "seed must be >= 0; got -3"),
        ("ring:?classes=ten", "classes must be an integer; got 'ten'"),
        ("ring:?sigma=wide", "sigma must be a number; got 'wide'"),
        ("ring:clients", "got 'clients'"),
    ],
)
def test_bad_options_name_the_offending_value(spec, needle):
    with pytest.raises(DatasetError) as err:
        load_dataset(spec)
    msg = str(err.value)
    assert needle in msg and spec in msg


def test_unknown_option_lists_the_known_ones():
    with pytest.raises(DatasetError, match="classes, train_per_class, test_per_class"):
        load_dataset("ring:?k=3")


def test_partition_gives_the_spec_ring_setup(cli, tmp_path):
    """100 clients x 2 classes: about 12 train / 20 test samples each, test labels follow train labels."""
    out = tmp_path / "ring"
    res = cli("partition", "--dataset", "ring:", "--classes-per-client", 2, "--class-shares", "equal",
              "--num-clients", 100, "--holdout-clients", 20, "--out", out, "--format", "json")
    assert res.code == 0, res.err
    dataset = json.loads((out / "dataset.json").read_text())
    assert dataset["spec"] == "ring:" and dataset["pool_sizes"] == {"train": 1260, "test": 2000}
    with np.load(out / "clients.npz", allow_pickle=False) as z:
        arrays = {k: z[k] for k in z.files}
    assert len(arrays["client_id"]) == 100 and np.bincount(arrays["role"]).tolist() == [80, 20]
    n_train, n_test = np.diff(arrays["train_offsets"]), np.diff(arrays["test_offsets"])
    # 126 train / 200 test samples per class over 20 clients per class: 12.6 / 20 on average.
    assert n_train.sum() == 1260 and n_test.sum() == 2000
    assert 12 <= n_train.min() and n_train.max() <= 14 and 18 <= n_test.min() and n_test.max() <= 22
    ds = load_dataset("ring:")
    for j in range(100):
        tr = arrays["train_indices"][arrays["train_offsets"][j]:arrays["train_offsets"][j + 1]]
        te = arrays["test_indices"][arrays["test_offsets"][j]:arrays["test_offsets"][j + 1]]
        assert (ds.pool[tr] == POOL_TRAIN).all() and (ds.pool[te] == POOL_TEST).all()
        train_classes = set(ds.y[tr].tolist())
        assert len(train_classes) == 2 and set(ds.y[te].tolist()) <= train_classes
