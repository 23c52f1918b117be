"""Algorithm 6: summed statistics, Theorem 1, monotonicity, guards, bad input (specs/mdm.md §8 items 6-10)."""

import warnings

import numpy as np
import pytest
from scipy.special import digamma, logsumexp

from pfl_cli.errors import InfeasibleError, InputError, PflxWarning
from pfl_cli.mdm import MDMParams, fit_mdm, log_likelihood, sample_clients, server_update
from pfl_cli.mdm import _kernels as K
from pfl_cli.mdm.model import component_log_joint, integer_size_edges

MEDIUM_2 = (np.array([0.4, 0.6]), np.array([[0.1, 0.2, 0.6, 1.0, 2.0, 0.1, 1.0, 2.0, 0.5, 0.5],
                                            [2.5, 2.6, 2.7, 2.8, 3.0, 2.5, 2.0, 3.0, 1.0, 0.9]]))
A12 = (np.array([0.2, 0.5, 0.3]), np.array([[0.1, 0.2, 0.1, 0.3, 0.1], [1, 4, 1, 2, 0.5], [10, 5, 3, 2, 30]]))


def variable_size_clients(tau, alpha, n, lo, hi, seed):
    s = hi
    probs = np.zeros((len(tau), s))
    probs[:, lo - 1:hi] = 1.0 / (hi - lo + 1)
    params = MDMParams(tau, alpha, probs, integer_size_edges(hi))
    return params, sample_clients(params, n, rng=np.random.default_rng(seed)).counts


def per_client_loop_statistics(counts, params):
    """Reference: each client's (w^i, E^i, u^i, v^i) of Alg. 6 lines 6-9, one client at a time."""
    k, s = params.num_components, params.size_probs.shape[1]
    out = []
    for c in counts:
        logits = component_log_joint(c[None, :], params)[0]
        w = np.exp(logits - logsumexp(logits))
        e = np.zeros((k, s))
        e[:, c.sum() - 1] = w
        u = w[:, None] * (digamma(c[None, :] + params.alpha) - digamma(params.alpha))
        a0 = params.alpha.sum(axis=1)
        v = w * (digamma(c.sum() + a0) - digamma(a0))
        out.append((w, e, u, v))
    return out


def theorem_1(counts, params):
    """The full-batch update of Theorem 1, computed centrally."""
    logits = component_log_joint(counts, params)
    w = np.exp(logits - logsumexp(logits, axis=1, keepdims=True))
    m = counts.sum(axis=1)
    tau = w.mean(axis=0)
    pi = np.stack([np.bincount(m - 1, weights=w[:, k], minlength=params.size_probs.shape[1]) for k in range(len(tau))])
    pi /= w.sum(axis=0)[:, None]
    a0 = params.alpha.sum(axis=1)
    num = np.einsum("ik,ikj->kj", w, digamma(counts[:, None, :] + params.alpha[None]) - digamma(params.alpha)[None])
    den = (w * (digamma(m[:, None] + a0[None]) - digamma(a0)[None])).sum(axis=0)
    return tau, pi, params.alpha * num / den[:, None]


@pytest.fixture(scope="module")
def setting():
    params, counts = variable_size_clients(*MEDIUM_2, n=300, lo=5, hi=30, seed=0)
    rng = np.random.default_rng(1)
    guess = MDMParams(np.array([0.5, 0.5]), rng.uniform(0.5, 2, size=(2, 10)), rng.dirichlet(np.ones(30), size=2),
                      integer_size_edges(30))
    return counts, guess


def test_update_from_summed_client_statistics_equals_theorem_1(setting):
    counts, params = setting
    stats = per_client_loop_statistics(counts, params)
    summed = K.SummedStatistics(omega=sum(s[0] for s in stats), e=sum(s[1] for s in stats), u=sum(s[2] for s in stats),
                                v=sum(s[3] for s in stats), cohort_size=len(counts))
    new = server_update(summed, params)
    tau, pi, alpha = theorem_1(counts, params)
    assert np.allclose(new.tau, tau, rtol=1e-10) and np.allclose(new.size_probs, pi, rtol=1e-10, atol=1e-14)
    assert np.allclose(new.alpha, alpha, rtol=1e-10)
    # The vectorized kernel produces the same sums the clients would upload.
    fast = K.summed_statistics(K.encode(counts), params)
    for name in ("omega", "e", "u", "v"):
        assert np.allclose(getattr(fast, name), getattr(summed, name), rtol=1e-10, atol=1e-12), name
    assert fast.log_likelihood == pytest.approx(log_likelihood(counts, params), rel=1e-12)


def test_per_client_statistics_kernel_matches_the_loop_and_is_a_softmax(setting):
    counts, params = setting
    w, b, u, v = K.client_statistics(K.encode(counts), params, slice(0, len(counts)))
    ref = per_client_loop_statistics(counts, params)
    assert np.allclose(w, [r[0] for r in ref]) and np.allclose(u, [r[2] for r in ref]) and np.allclose(v, [r[3] for r in ref])
    assert np.all(w >= 0) and np.allclose(w.sum(axis=1), 1.0)
    assert np.array_equal(b, counts.sum(axis=1) - 1)


def test_summed_statistics_do_not_depend_on_client_order(setting):
    counts, params = setting
    a = K.summed_statistics(K.encode(counts), params)
    b = K.summed_statistics(K.encode(counts[::-1].copy()), params)
    for name in ("omega", "e", "u", "v"):
        assert np.allclose(getattr(a, name), getattr(b, name), rtol=1e-12)


def test_cohort_of_all_clients_is_the_full_batch_iteration(setting):
    counts, _ = setting
    full = fit_mdm(counts, num_components=2, rounds=5, rng=np.random.default_rng(3))
    same = fit_mdm(counts, num_components=2, rounds=5, cohort_size=10 * len(counts), rng=np.random.default_rng(3))
    assert np.array_equal(full.params.alpha, same.params.alpha)


def test_full_batch_log_likelihood_never_decreases():
    _, counts = variable_size_clients(*MEDIUM_2, n=2000, lo=5, hi=50, seed=4)
    fit = fit_mdm(counts, num_components=2, rounds=200, rng=np.random.default_rng(5))
    ll = np.array([row[3] for row in fit.trace])
    assert len(ll) == 201
    assert np.all(np.diff(ll) >= -1e-8 * np.abs(ll[:-1]))


def test_no_nan_with_too_many_components_and_unseen_sizes():
    tau, alpha = A12
    params = MDMParams(tau, alpha, np.eye(100)[[99, 99, 99]], integer_size_edges(100))
    counts = sample_clients(params, 200, rng=np.random.default_rng(6)).counts
    counts[:5] = counts[:5] // 3                            # a few sizes nobody else has
    fit = fit_mdm(counts, num_components=6, rounds=100, cohort_size=50, restarts=2, rng=np.random.default_rng(7))
    p = fit.params
    assert np.isfinite(fit.log_likelihood)
    assert np.all(p.alpha > 0) and np.all(np.isfinite(p.alpha))
    assert p.tau.sum() == pytest.approx(1.0) and np.allclose(p.size_probs.sum(axis=1), 1.0)


def test_empty_component_keeps_its_parameters():
    params = MDMParams(np.array([0.5, 0.5]), np.array([[1.0, 1.0], [2.0, 3.0]]), np.ones((2, 1)), np.array([4, 5]))
    sums = K.SummedStatistics(omega=np.array([10.0, 0.0]), e=np.array([[10.0], [0.0]]), u=np.array([[5.0, 5.0], [0.0, 0.0]]),
                              v=np.array([10.0, 0.0]), cohort_size=10)
    new = server_update(sums, params)
    assert np.array_equal(new.alpha[1], [2.0, 3.0]) and new.tau[1] > 0 and np.all(np.isfinite(new.alpha))


def test_restarts_keep_the_best_log_likelihood(setting):
    counts, _ = setting
    fit = fit_mdm(counts, num_components=2, rounds=10, restarts=3, rng=np.random.default_rng(8))
    assert fit.log_likelihood == max(fit.restart_log_likelihoods)
    assert fit.restart_log_likelihoods[fit.best_restart] == fit.log_likelihood


def test_binned_size_model():
    _, counts = variable_size_clients(*MEDIUM_2, n=500, lo=5, hi=50, seed=9)
    fit = fit_mdm(counts, num_components=2, rounds=20, sample_bins=5, rng=np.random.default_rng(0))
    assert fit.params.size_probs.shape == (2, 5) and fit.params.binned and fit.params.max_samples == 50


@pytest.mark.parametrize(
    "counts, match",
    [
        ([[1, -2]], r"must be >= 0; got -2"),
        ([[1.5, 2.0]], r"whole counts; got 1.5"),
        ([[np.nan, 1.0]], r"must be finite"),
        ([1, 2, 3], r"2-D matrix"),
        ([["a", "b"]], r"must hold numbers"),
    ],
    ids=["negative", "fraction", "nan", "1-d", "strings"],
)
def test_bad_counts_are_refused(counts, match):
    with pytest.raises(InputError, match=match):
        fit_mdm(counts, num_components=1, rng=np.random.default_rng(0))


def test_zero_sample_clients_are_skipped_with_a_warning_and_counted():
    counts = np.array([[3, 1], [0, 0], [2, 2], [0, 0], [1, 3]])
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        fit = fit_mdm(counts, num_components=1, rounds=3, rng=np.random.default_rng(0))
    assert fit.num_skipped == 2 and fit.num_clients == 3
    assert any(issubclass(w.category, PflxWarning) and "zero samples" in str(w.message) for w in caught)


@pytest.mark.filterwarnings("ignore::pfl_cli.errors.PflxWarning")
def test_fewer_clients_than_components_is_infeasible():
    with pytest.raises(InfeasibleError, match="num_components 4 needs at least 4 clients"):
        fit_mdm([[1, 2], [3, 4], [0, 0]], num_components=4, rng=np.random.default_rng(0))


def test_same_seed_same_fit():
    _, counts = variable_size_clients(*MEDIUM_2, n=300, lo=5, hi=30, seed=10)
    a = fit_mdm(counts, num_components=2, rounds=10, cohort_size=100, rng=np.random.default_rng(1))
    b = fit_mdm(counts, num_components=2, rounds=10, cohort_size=100, rng=np.random.default_rng(1))
    assert np.array_equal(a.params.alpha, b.params.alpha) and a.trace == b.trace


# ---------------------------------------------------------------------------- progress (issue 24)
def test_on_progress_counts_every_round_of_every_restart_and_changes_nothing():
    params, counts = variable_size_clients(*A12, n=300, lo=20, hi=40, seed=5)
    calls = []
    seen = fit_mdm(counts, num_components=3, rounds=4, restarts=2, rng=np.random.default_rng(7),
                   on_progress=lambda done, total, status: calls.append((done, total, status)))
    plain = fit_mdm(counts, num_components=3, rounds=4, restarts=2, rng=np.random.default_rng(7))
    assert seen.trace == plain.trace and np.array_equal(seen.params.alpha, plain.params.alpha)
    assert [(d, t) for d, t, _ in calls] == [(d, 8) for d in range(1, 9)]
    assert [s["restart"] for _, _, s in calls] == [1] * 4 + [2] * 4
    assert all(s["components"] == 3 and s["restarts"] == 2 for _, _, s in calls)
    # The status's log-likelihood is the trace's: the round's cohort before its update, per client.
    rounds = [row for row in plain.trace if row[1] < 4]
    assert [s["mean_log_likelihood"] for _, _, s in calls] == pytest.approx([ll / n for _, _, n, ll in rounds])


def test_select_components_progress_runs_over_all_candidates():
    from pfl_cli.mdm.select import select_components

    _, counts = variable_size_clients(*A12, n=200, lo=20, hi=40, seed=6)
    calls = []
    sel = select_components(counts, candidates=(1, 2, 3), rng=np.random.default_rng(0), rounds=3, restarts=1,
                            on_progress=lambda done, total, status: calls.append((done, total, status["components"])))
    assert [c[:2] for c in calls] == [(d, 9) for d in range(1, 10)]
    assert [c[2] for c in calls] == [1, 1, 1, 2, 2, 2, 3, 3, 3]
    plain = select_components(counts, candidates=(1, 2, 3), rng=np.random.default_rng(0), rounds=3, restarts=1)
    assert sel.validation_log_likelihood == plain.validation_log_likelihood
