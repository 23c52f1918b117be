import numpy as np

from pfl_cli.cluster.kmeans import assign, kmeans, kmeans_cost, kmeans_plusplus, lloyd


def _blobs(rng):
    means = np.array([[0.0, 0.0], [10.0, 0.0], [0.0, 10.0]])
    return np.concatenate([m + rng.normal(size=(50, 2)) for m in means]), means


def test_kmeans_plusplus_is_reproducible_and_picks_data_points():
    x, _ = _blobs(np.random.default_rng(0))
    a = kmeans_plusplus(x, 3, rng=np.random.default_rng(5))
    b = kmeans_plusplus(x, 3, rng=np.random.default_rng(5))
    assert np.array_equal(a, b)
    assert all(any(np.array_equal(c, p) for p in x) for c in a)


def test_kmeans_finds_separated_blobs():
    x, means = _blobs(np.random.default_rng(1))
    fit = kmeans(x, 3, rng=np.random.default_rng(0), n_init=3)
    nearest = np.sqrt(((means[:, None] - fit.centers[None]) ** 2).sum(axis=2)).min(axis=1)
    assert nearest.max() < 0.6
    assert np.isclose(fit.cost, kmeans_cost(x, fit.centers))


def test_lloyd_never_increases_weighted_cost():
    rng = np.random.default_rng(2)
    x, w = rng.normal(size=(200, 3)), rng.uniform(0.1, 3.0, 200)
    start = x[:4].copy()
    fit = lloyd(x, start, weights=w, tol=0)
    assert fit.cost <= kmeans_cost(x, start, w) + 1e-9


def test_weights_equal_to_duplicated_points():
    rng = np.random.default_rng(3)
    x = rng.normal(size=(30, 2))
    w = rng.integers(1, 4, 30)
    start = x[:3].copy()
    weighted = lloyd(x, start, weights=w.astype(float), tol=0).centers
    duplicated = lloyd(np.repeat(x, w, axis=0), start, tol=0).centers
    assert np.allclose(weighted, duplicated)


def test_assign_ties_go_to_lowest_index():
    labels, d2 = assign(np.array([[0.0, 0.0]]), np.array([[1.0, 0.0], [-1.0, 0.0]]))
    assert labels.tolist() == [0] and d2.tolist() == [1.0]
