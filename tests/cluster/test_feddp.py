"""FedDP-Init / FedDP-Lloyds: noise, clipping, the client/server boundary, utility."""

import numpy as np
import pytest

from pfl_cli.cluster import evaluate_clustering, federated, feddp_init, fit_feddp_kmeans
from pfl_cli.cluster.federated import ClientData
from pfl_cli.cluster.kmeans import kmeans_cost
from pfl_cli.errors import InputError


def test_symmetric_noise_is_symmetric_with_the_right_scale():
    noise = feddp_init._release(np.zeros((150, 150)), 3.0, "symmetric", np.random.default_rng(0))
    assert np.array_equal(noise, noise.T)
    upper = noise[np.triu_indices(150)]
    assert abs(upper.std() / 3.0 - 1) < 0.02 and abs(upper.mean()) < 0.1


def _clients(rng, n=6, d=4):
    sizes = rng.integers(1, 9, n)
    return ClientData(rng.normal(scale=3.0, size=(sizes.sum(), d)), np.concatenate([[0], np.cumsum(sizes)]))


def _per_client(data):
    return [data.points[data.offsets[i]:data.offsets[i + 1]] for i in range(data.num_clients)]


def test_client_level_clipping_never_exceeds_the_bounds():
    rng = np.random.default_rng(1)
    data = _clients(rng)
    bound = 20.0
    ref = np.zeros((4, 4))
    for p in _per_client(data):  # reference loop over clients
        outer = p.T @ p
        clipped = outer * min(1.0, bound / np.linalg.norm(outer))
        assert np.linalg.norm(clipped) <= bound + 1e-9
        ref += clipped
    assert np.allclose(federated.outer_product_sum(data, clip=bound), ref)
    centers = rng.normal(size=(3, 4))
    sums, counts = federated.cluster_sums_and_counts(data, centers, clip_sums=4.0, clip_counts=2.0)
    ref_s, ref_c = np.zeros((3, 4)), np.zeros(3)
    for p in _per_client(data):
        lab = ((p[:, None] - centers[None]) ** 2).sum(axis=2).argmin(axis=1)
        s = np.stack([p[lab == j].sum(axis=0) for j in range(3)])
        c = np.bincount(lab, minlength=3).astype(float)
        s, c = s * min(1, 4.0 / np.linalg.norm(s)), c * min(1, 2.0 / c.sum())
        assert np.linalg.norm(s) <= 4.0 + 1e-9 and c.sum() <= 2.0 + 1e-9
        ref_s, ref_c = ref_s + s, ref_c + c
    assert np.allclose(sums, ref_s) and np.allclose(counts, ref_c)
    means, ind = federated.cluster_means_and_indicators(data, centers[:, :2], projection=np.eye(4)[:, :2],
                                                        clip_means=1.0, clip_indicators=1.5)
    assert np.linalg.norm(means, axis=1).max() <= data.num_clients * 1.0 + 1e-9 and ind.sum() <= 1.5 * 6 + 1e-9


def test_data_point_sensitivities_hold_for_a_neighbouring_dataset():
    rng = np.random.default_rng(2)
    radius, d = 2.0, 5
    base = ClientData(rng.normal(size=(40, d)), np.array([0, 20, 40]))
    base = ClientData(base.points * np.minimum(1, radius / np.linalg.norm(base.points, axis=1))[:, None], base.offsets)
    extra = rng.normal(size=d)
    extra *= radius / np.linalg.norm(extra)  # one added point of norm Delta
    plus = ClientData(np.vstack([base.points, extra]), np.array([0, 20, 41]))
    d_outer = federated.outer_product_sum(plus) - federated.outer_product_sum(base)
    assert np.linalg.norm(d_outer) <= radius**2 + 1e-9
    proj, q = np.eye(d)[:, :2], rng.normal(size=(7, 2))
    dw = federated.nearest_server_counts(plus, proj, q) - federated.nearest_server_counts(base, proj, q)
    assert np.abs(dw).sum() <= 1
    centers = rng.normal(size=(3, d))
    (s1, c1), (s0, c0) = (federated.cluster_sums_and_counts(x, centers) for x in (plus, base))
    assert np.linalg.norm(s1 - s0) <= radius + 1e-9 and np.abs(c1 - c0).sum() <= 1


def test_server_sees_only_noisy_sums(monkeypatch, small_mixture):
    x, offsets, q = small_mixture
    seen = []

    def spy(fn, name):
        def wrapped(*args, **kw):
            seen.append((name, [np.shape(a) for a in args if isinstance(a, np.ndarray)]))
            return fn(*args, **kw)
        return wrapped

    for name in ("server_projection", "server_weighted_kmeans", "server_centers"):
        monkeypatch.setattr(feddp_init, name, spy(getattr(feddp_init, name), name))
    fit_feddp_kmeans(x, offsets, q, k=4, epsilon=1.0, rng=np.random.default_rng(0))
    d, nq = x.shape[1], len(q)
    assert seen[0] == ("server_projection", [(d, d)])
    assert seen[1] == ("server_weighted_kmeans", [(nq, 4), (nq,)])
    assert seen[2] == ("server_centers", [(4, d), (4,)])
    for _, shapes in seen:  # never anything with a clients axis or a points axis
        assert all(len(x) not in s and len(offsets) - 1 not in s[:1] for s in shapes)


def test_large_epsilon_matches_non_private_federated_kmeans(small_mixture):
    x, offsets, q = small_mixture
    radius = float(np.linalg.norm(x, axis=1).max()) + 1  # nothing clipped
    kw = dict(k=4, radius=radius, min_server_weight=4.5, lloyds_steps=2, init="feddp")
    private = fit_feddp_kmeans(x, offsets, q, epsilon=3000.0, split=[1, 1, 1, 1], rng=np.random.default_rng(0), **kw)
    exact = fit_feddp_kmeans(x, offsets, q, epsilon=None, rng=np.random.default_rng(0), **kw)
    assert private.epsilon <= 3000.0 and exact.ledger is None
    # Same centers up to their order (tiny noise may permute the server's k-means labels).
    gap = np.sqrt(((private.centers[:, None] - exact.centers[None]) ** 2).sum(axis=2))
    assert sorted(gap.argmin(axis=1)) == list(range(4)) and gap.min(axis=1).max() < 2e-2
    assert abs(kmeans_cost(x, private.centers) / kmeans_cost(x, exact.centers) - 1) < 1e-4


def test_results_are_reproducible(small_mixture):
    x, offsets, q = small_mixture
    a = fit_feddp_kmeans(x, offsets, q, k=4, epsilon=0.5, lloyds_steps=1, rng=np.random.default_rng(9))
    b = fit_feddp_kmeans(x, offsets, q, k=4, epsilon=0.5, lloyds_steps=1, rng=np.random.default_rng(9))
    assert np.array_equal(a.centers, b.centers) and a.ledger == b.ledger


def test_client_level_run_and_k_selection(small_mixture):
    x, offsets, q = small_mixture
    res = fit_feddp_kmeans(x, offsets, q, k=4, epsilon=2.0, privacy_unit="client", k_candidates=range(1, 9),
                           rng=np.random.default_rng(0))
    assert res.ledger.unit == "client" and res.epsilon <= 2.0
    assert res.projection_dim == 4 and res.k_selection["k"] == list(range(1, 9))
    w = res.k_selection["weighted_cost"]
    assert w[0] > w[3]  # the elbow side: more clusters, lower weighted cost
    assert len(res.ledger.events) == 4  # choosing k spends nothing extra
    assert any("no privacy cost" in note for note in res.ledger.notes)
    # The same projection as the released centers: asking for k candidates changes no released number.
    plain = fit_feddp_kmeans(x, offsets, q, k=4, epsilon=2.0, privacy_unit="client", rng=np.random.default_rng(0))
    assert np.array_equal(plain.centers, res.centers) and plain.ledger.events == res.ledger.events


def test_dp_with_noise_off_equals_the_non_private_fit(small_mixture):
    """sigma = 0 through the DP code path (a radius no point reaches) = the --no-dp fit, bit for bit up to rounding."""
    x, offsets, q = small_mixture
    big = 1e3 * float(np.linalg.norm(x, axis=1).max())
    kw = dict(k=4, lloyds_steps=2, init="feddp", min_server_weight=0.0)
    plain = fit_feddp_kmeans(x, offsets, q, rng=np.random.default_rng(5), **kw)
    off = fit_feddp_kmeans(x, offsets, q, epsilon=1.0, radius=big, rng=np.random.default_rng(5), _noise_factor=0.0,
                           **kw)
    assert off.ledger is not None and off.clipped_fraction == 0.0
    np.testing.assert_allclose(off.centers, plain.centers, rtol=1e-9, atol=1e-9)


@pytest.mark.parametrize("kw,match", [
    (dict(k=10_000), "number of server points"), (dict(epsilon=0.0), "epsilon"), (dict(epsilon=-1.0), "epsilon"),
    (dict(delta=1.0), "delta"), (dict(delta=0.0), "delta"), (dict(radius=0.0), "radius"),
    (dict(init="kfed"), "kfed"), (dict(privacy_unit="user"), "privacy unit"),
])
def test_bad_input_is_refused(small_mixture, kw, match):
    x, offsets, q = small_mixture
    args = dict(k=4, epsilon=1.0) | kw
    with pytest.raises(InputError, match=match):
        fit_feddp_kmeans(x, offsets, q, rng=np.random.default_rng(0), **args)


def test_server_dimension_must_match(small_mixture):
    x, offsets, q = small_mixture
    with pytest.raises(InputError, match="server data dimension"):
        fit_feddp_kmeans(x, offsets, q[:, :5], k=4, epsilon=1.0, rng=np.random.default_rng(0))


def _quality(mixture, spec, eps, seed):
    x, offsets, q = mixture(**spec, seed=seed)
    k = spec["k"]
    res = fit_feddp_kmeans(x, offsets, q, k=k, epsilon=eps, rng=np.random.default_rng(seed))
    m = evaluate_clustering(x, res.centers, rng=np.random.default_rng(0), reference_n_init=1)
    base = {init: kmeans_cost(x, fit_feddp_kmeans(x, offsets, q, k=k, epsilon=eps, init=init,
                                                  rng=np.random.default_rng(seed)).centers) / len(x)
            for init in ("server-kmeans++", "server-lloyds", "random", "sphere-packing")}
    return res, m, base


@pytest.mark.parametrize("seed", [0, 1])
def test_quality_small_mixture(make_mixture, seed):
    res, m, base = _quality(make_mixture, dict(d=40, k=5, num_clients=40, client_size=300), 1.0, seed)
    assert res.epsilon <= 1.0
    assert m["relative_gap"] <= 0.02
    assert all(m["normalized_cost"] < b for b in base.values()), (m, base)


def test_quality_thesis_mixture_100_clients_x_1000(make_mixture):
    # specs/clustering.md §7.3: d=100, k=10, 100 clients x 1000 points, total epsilon ~ 1.
    res, m, base = _quality(make_mixture, dict(d=100, k=10, num_clients=100, client_size=1000), 1.0, 0)
    assert res.epsilon <= 1.0
    assert m["relative_gap"] <= 0.02, m
    assert all(m["normalized_cost"] < b for b in base.values()), (m, base)


@pytest.mark.parametrize("kw", [dict(epsilon=1.0, k_candidates=[2, 4], lloyds_steps=2),
                                dict(epsilon=None, init="server-kmeans++"),
                                dict(epsilon=1.0, privacy_unit="client", lloyds_steps=1)])
def test_on_progress_names_each_protocol_step_and_changes_nothing(small_mixture, kw):
    from pfl_cli.cluster.api import progress_steps

    x, offsets, q = small_mixture
    calls = []
    seen = fit_feddp_kmeans(x, offsets, q, k=4, rng=np.random.default_rng(0), **kw,
                            on_progress=lambda done, total, status: calls.append((done, total, status["step"])))
    plain = fit_feddp_kmeans(x, offsets, q, k=4, rng=np.random.default_rng(0), **kw)
    assert np.array_equal(seen.centers, plain.centers)
    total = progress_steps(kw.get("init", "feddp"), kw.get("lloyds_steps"), kw.get("k_candidates"))
    assert [c[:2] for c in calls] == [(d, total) for d in range(1, total + 1)]
    names = [c[2] for c in calls]
    lloyds = [f"FedDP-Lloyds step {t}/{plain.lloyds_steps}" for t in range(1, plain.lloyds_steps + 1)]
    if kw.get("init", "feddp") == "feddp":
        init = ["FedDP-Init step 1/3: projection", "FedDP-Init step 2/3: server weights", "FedDP-Init step 3/3: centers"]
        assert names == init + (["k candidates: server costs"] if "k_candidates" in kw else []) + lloyds
    else:
        assert names == [f"{kw['init']} init"] + lloyds
