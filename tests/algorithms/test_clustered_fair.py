"""IFCA and q-FFL against slow, obviously correct references of their papers' rules.

IFCA (Ghosh et al. 2020, Alg. 1): each client's cluster estimate is the argmin over the k models of its mean
loss on its train data, scored here by a plain forward per client and model; the server's new cluster model
is the size-weighted mean of its members' models, a loop over clusters here, and a cluster nobody chose keeps
its model. q-FFL (Li et al. 2020, Alg. 2): Delta_k and h_k by hand on a 2-client linear model, q = 0 as the
uniform mean, and a whole round replayed with the same draws.
"""

import pytest
import torch
import torch.nn.functional as F
from torch.func import functional_call

from baseline_support import alg_factory, gen
from pfl_cli.algorithms.qffl import qfedavg_messages, qfedavg_step
from pfl_cli.errors import ConfigError
from pfl_cli.fl import clusters as clusters_module
from pfl_cli.fl.store import ROLE_TRAIN
from pfl_cli.models import num_parameters
from pfl_cli.registry import train_config
from pflx_testing import small_config

IFCA = small_config(algorithm="ifca", mlp_hidden=(8,), local_steps=3, batch_size=8, lr=0.05, clients_per_round=4,
                    num_clusters=3)
QFFL = small_config(algorithm="qffl", mlp_hidden=(8,), local_steps=3, batch_size=8, lr=0.05, clients_per_round=4,
                    q=2.0)


def ref_loss(alg, params, client):
    """One model's mean cross-entropy over one client's fit samples: one plain forward."""
    n = int(alg.store.fit.length[client])
    idx = alg.store.fit.index[client, :n]
    return float(F.cross_entropy(functional_call(alg.net, params, (alg.store.inputs(idx),)), alg.store.y[idx]))


def cluster(alg, j):
    return {k: v[j] for k, v in alg.clusters.items()}


def spread_clusters(alg):
    """Cluster models far apart, so that clients choose different ones."""
    g = torch.Generator().manual_seed(3)
    alg.clusters = {k: v + torch.randn(v.shape, generator=g) for k, v in alg.clusters.items()}


@pytest.mark.parametrize("chunk", [256, 7])
def test_ifca_assignment_is_the_lowest_loss_model(store, monkeypatch, chunk):
    monkeypatch.setattr(clusters_module, "SAMPLE_CHUNK", chunk)  # 7: several sample chunks per client
    monkeypatch.setattr(clusters_module, "CLIENT_CHUNK", 5)
    alg = alg_factory(IFCA)(store)
    spread_clusters(alg)
    clients = torch.as_tensor(store.clients(ROLE_TRAIN))
    from pfl_cli.fl.cohort import resolve_cohort_exec

    got = clusters_module.losses_under(alg.net, store, store.fit, clients, alg.clusters,
                                       resolve_cohort_exec("auto", alg.net, "cpu"))
    want = torch.tensor([[ref_loss(alg, cluster(alg, j), int(i)) for j in range(3)] for i in clients])
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
    assert alg.assign(clients).tolist() == want.argmin(1).tolist()
    assert len(set(want.argmin(1).tolist())) > 1  # the test sees clients choose different clusters


def test_ifca_round_averages_each_cluster_and_keeps_the_unchosen(store):
    alg = alg_factory(IFCA)(store)
    spread_clusters(alg)
    ref = alg_factory(IFCA)(store)
    ref.clusters = {k: v.clone() for k, v in alg.clusters.items()}
    cohort = torch.as_tensor(store.clients(ROLE_TRAIN)[[0, 3, 5, 9]])
    alg.run_round(0, cohort, gen())
    # the reference: each client's argmin by plain forwards, its local SGD from that model (same draws), and the
    # size-weighted mean per cluster by a loop
    choice = [min(range(3), key=lambda j: ref_loss(ref, cluster(ref, j), int(i))) for i in cohort]
    start = {k: torch.stack([v[j] for j in choice]) for k, v in ref.clusters.items()}
    theta, _, _ = ref.cohort_sgd(start, cohort, gen(), steps=IFCA.local_steps)
    size = store.fit.length[cohort].to(torch.float32)
    for j in range(3):
        members = [r for r, cj in enumerate(choice) if cj == j]
        for k, v in ref.clusters.items():
            if members:
                want = sum(size[r] * theta[k][r] for r in members) / sum(size[r] for r in members)
            else:
                want = v[j]  # nobody chose it: unchanged
            torch.testing.assert_close(alg.clusters[k][j], want, atol=1e-6, rtol=1e-5)
    assert len(set(choice)) == 2  # one cluster averaged from two members or more, one kept


def test_ifca_serves_every_client_its_lowest_loss_cluster(store):
    alg = alg_factory(IFCA)(store)
    spread_clusters(alg)
    clients = store.clients(ROLE_TRAIN)[:6]
    params, personalized = alg.personalize(clients, gen())
    assert personalized
    for r, i in enumerate(clients):
        j = min(range(3), key=lambda j: ref_loss(alg, cluster(alg, j), int(i)))
        for k in params:
            assert torch.equal(params[k][r], alg.clusters[k][j])


def test_qfedavg_messages_on_a_two_client_linear_model():
    """Alg. 2 by hand: w = (1, 2); clients at w_1 = (0, 2), w_2 = (1, 1); losses 0.5 and 2; L = 10; q = 2."""
    w = {"w": torch.tensor([1.0, 2.0])}
    theta = {"w": torch.tensor([[0.0, 2.0], [1.0, 1.0]])}
    f = torch.tensor([0.5, 2.0])
    delta, h = qfedavg_messages(w, theta, f, q=2.0, lipschitz=10.0)
    # Delta w_1 = 10 (1, 0), Delta w_2 = 10 (0, 1); F^q = 0.25, 4; ||Delta w||^2 = 100
    torch.testing.assert_close(delta["w"], torch.tensor([[2.5, 0.0], [0.0, 40.0]]))
    # h = q F^(q-1) ||Delta w||^2 + L F^q = 2 * 0.5 * 100 + 2.5, 2 * 2 * 100 + 40
    torch.testing.assert_close(h, torch.tensor([102.5, 440.0]))
    new = qfedavg_step(w, delta, h)
    torch.testing.assert_close(new["w"], torch.tensor([1.0 - 2.5 / 542.5, 2.0 - 40.0 / 542.5]))


def test_qfedavg_at_q0_is_the_uniform_mean():
    g = torch.Generator().manual_seed(0)
    w = {"a": torch.randn(3, 2, generator=g), "b": torch.randn(4, generator=g)}
    theta = {k: torch.randn(5, *v.shape, generator=g) for k, v in w.items()}
    delta, h = qfedavg_messages(w, theta, torch.rand(5, generator=g) + 0.1, q=0.0, lipschitz=7.0)
    new = qfedavg_step(w, delta, h)
    for k in w:
        torch.testing.assert_close(new[k], theta[k].mean(0))


def test_qffl_round_against_its_reference(store):
    alg = alg_factory(QFFL)(store)
    ref = alg_factory(QFFL)(store)
    w = {k: v.clone() for k, v in ref.global_params.items()}
    cohort = torch.as_tensor(store.clients(ROLE_TRAIN)[[1, 2, 6, 8]])
    alg.run_round(0, cohort, gen())
    fk = [ref_loss(ref, w, int(i)) for i in cohort]
    theta, _, _ = ref.cohort_sgd({k: v.expand(4, *v.shape).clone() for k, v in w.items()}, cohort, gen(),
                                 steps=QFFL.local_steps)
    lip, q = 1.0 / QFFL.lr, QFFL.q
    deltas, hs = [], []
    for r in range(4):
        dw = {k: lip * (w[k] - theta[k][r]) for k in w}
        norm2 = float(sum((v.double() ** 2).sum() for v in dw.values()))
        fq = (fk[r] + 1e-10) ** q
        deltas.append({k: fq * v for k, v in dw.items()})
        hs.append(q * (fk[r] + 1e-10) ** (q - 1) * norm2 + lip * fq)
    for k in w:
        want = w[k] - sum(d[k] for d in deltas) / sum(hs)
        torch.testing.assert_close(alg.global_params[k], want, atol=1e-6, rtol=1e-5)


@pytest.mark.parametrize("name, opts, message", [
    ("ifca", {"num_clusters": 0}, "num_clusters must be an integer >= 1 for ifca; got 0."),
    ("qffl", {"q": -1.0}, "q must be a finite number >= 0 for qffl; got -1.0."),
    ("ifca", {"server_lr": 0.5}, "server_lr has no effect on algorithm 'ifca'"),
    ("qffl", {"server_momentum": 0.5}, "server_momentum has no effect on algorithm 'qffl'"),
])
def test_bad_keys_are_refused_in_one_line(name, opts, message):
    with pytest.raises(ConfigError) as err:
        train_config(name, **opts)
    assert message in str(err.value) and "\n" not in str(err.value)


@pytest.mark.parametrize("name", ["ifca", "qffl"])
def test_reported_floats_are_the_exchanged_tensors(digits_clients, name):
    from pfl_cli.fl import train_federated

    ds, part = digits_clients
    cfg = small_config(algorithm=name, mlp_hidden=(8,), local_steps=2, batch_size=8, rounds=2, eval_every=2,
                       clients_per_round=3, num_clusters=2)
    run = train_federated(ds.x, ds.y, ds.num_classes, part, cfg, device="cpu")
    comm = run.algorithm.traffic.summary()
    d = num_parameters(run.model["arch"]["client"])
    down, up = (2 * d, d + 1) if name == "ifca" else (d, d + 1)  # k models | w down; model + j | Delta + h up
    assert comm["floats_down_per_client_round"] == down and comm["floats_up_per_client_round"] == up
    assert type(run.algorithm).floats_per_client_round(run.model["arch"]) == down + up


# ----------------------------------------------------------------------------------------------- CFL
CFL = small_config(algorithm="cfl", mlp_hidden=(8,), local_steps=2, batch_size=8, lr=0.05, clients_per_round=6,
                   cfl_eps1=0.5, cfl_eps2=1.0, cfl_warmup_rounds=0)


def brute_bipartition_value(s):
    """min over every bipartition of the largest cross similarity (Sattler et al. §III-C), by enumeration."""
    import itertools

    m = s.shape[0]
    best = float("inf")
    for mask in itertools.product([False, True], repeat=m - 1):
        side = (False, *mask)
        if not any(side):
            continue
        best = min(best, max(float(s[i, j]) for i in range(m) for j in range(m) if side[i] != side[j]))
    return best


@pytest.mark.parametrize("m", [2, 3, 5, 7])
def test_cfl_bipartition_is_the_optimal_one(m):
    from pfl_cli.algorithms.cfl import bipartition, cosine_similarity

    g = torch.Generator().manual_seed(m)
    for _ in range(5):
        s = cosine_similarity(torch.randn(m, 4, generator=g))
        side = bipartition(s)
        assert not side[0] and side.any()
        cross = max(float(s[i, j]) for i in range(m) for j in range(m) if side[i] != side[j])
        assert cross == pytest.approx(brute_bipartition_value(s), abs=1e-6)


def crafted(alg, updates):
    """``cohort_sgd`` that returns each client's start plus its row of ``updates`` (c, d) (the flattened net)."""
    def fake(start, clients, gen, **_):
        out, lo = {}, 0
        for k, v in start.items():
            n = v[0].numel()
            out[k] = v + updates[:, lo:lo + n].view_as(v)
            lo += n
        return out, torch.zeros(len(clients)), 0
    return fake


def test_cfl_splits_when_the_mean_update_is_small_and_one_is_large(store, monkeypatch):
    alg = alg_factory(CFL)(store)
    d = sum(v[0].numel() for v in alg.models.values())
    cohort = torch.as_tensor(store.clients(ROLE_TRAIN)[:6])
    size = store.fit.length[cohort].to(torch.float32)
    u = torch.zeros(d)
    u[0], u[5] = 1.5, 0.5  # ||u|| > eps2 = 1
    sign = torch.tensor([1.0, -1.0, 1.0, -1.0, -1.0, 1.0])
    g = torch.Generator().manual_seed(0)
    updates = sign[:, None] * u + 0.01 * torch.randn(6, d, generator=g)
    mean = (size[:, None] * updates).sum(0) / size.sum()
    assert mean.norm() < 0.5 < 1.0 < updates.norm(dim=1).max()  # the criterion holds
    root = torch.cat([v[0].flatten() for v in alg.models.values()])
    monkeypatch.setattr(alg, "cohort_sgd", crafted(alg, updates))
    alg.run_round(0, cohort, gen())
    assert alg.leaf.tolist()[:3] == [False, True, True] and int(alg.used) == 3
    node = alg.member.values["node"][cohort]
    groups = {s: set(node[sign == s].tolist()) for s in (1.0, -1.0)}
    assert groups[1.0] == {1} and groups[-1.0] == {2}  # row 0 (+u) stays on the first child
    for child, s in ((1, 1.0), (2, -1.0)):
        w = size * (sign == s)
        want = root + (w[:, None] * updates).sum(0) / w.sum()
        got = torch.cat([v[child].flatten() for v in alg.models.values()])
        torch.testing.assert_close(got, want, atol=1e-6, rtol=1e-5)


def test_cfl_keeps_one_cluster_below_the_thresholds(store, monkeypatch):
    alg = alg_factory(CFL)(store, cfl_eps2=5.0)  # no client update is that large: no split, the mean update added
    d = sum(v[0].numel() for v in alg.models.values())
    cohort = torch.as_tensor(store.clients(ROLE_TRAIN)[:4])
    size = store.fit.length[cohort].to(torch.float32)
    updates = torch.randn(4, d, generator=torch.Generator().manual_seed(1)) * 0.1
    root = torch.cat([v[0].flatten() for v in alg.models.values()])
    monkeypatch.setattr(alg, "cohort_sgd", crafted(alg, updates))
    alg.run_round(0, cohort, gen())
    assert int(alg.used) == 1 and bool(alg.leaf[0])
    got = torch.cat([v[0].flatten() for v in alg.models.values()])
    torch.testing.assert_close(got, root + (size[:, None] * updates).sum(0) / size.sum(), atol=1e-6, rtol=1e-5)


def test_cfl_client_that_missed_a_split_takes_the_lowest_loss_child(store, monkeypatch):
    alg = alg_factory(CFL)(store)
    d = sum(v[0].numel() for v in alg.models.values())
    train = store.clients(ROLE_TRAIN)
    cohort = torch.as_tensor(train[:4])
    updates = torch.zeros(4, d)
    updates[:, 0] = torch.tensor([3.0, -3.0, 3.0, -3.0])
    monkeypatch.setattr(alg, "cohort_sgd", crafted(alg, updates))
    alg.run_round(0, cohort, gen())
    assert int(alg.used) == 3
    late = int(train[7])  # sat out the split: still at the root, now an inner node
    assert int(alg.member.values["node"][late]) == 0
    want = min((1, 2), key=lambda j: ref_loss(alg, {k: v[j] for k, v in alg.models.items()}, late))
    params, _ = alg.personalize([late], gen())
    for k in params:
        assert torch.equal(params[k][0], alg.models[k][want])


# ----------------------------------------------------------------------------------------------- AFL
AFL = small_config(algorithm="afl", mlp_hidden=(8,), local_steps=2, batch_size=8, lr=0.05, clients_per_round=4,
                   afl_lambda_lr=0.05)


def bisection_projection(v):
    """The simplex projection by its definition: the tau with sum max(v - tau, 0) = 1, found by bisection."""
    lo, hi = float(v.min()) - 1.0, float(v.max())
    for _ in range(200):
        tau = (lo + hi) / 2
        if float((v - tau).clamp_min(0).sum()) > 1:
            lo = tau
        else:
            hi = tau
    return (v - (lo + hi) / 2).clamp_min(0)


def test_afl_simplex_projection_against_bisection():
    from pfl_cli.algorithms.afl import project_simplex

    g = torch.Generator().manual_seed(0)
    for n in (1, 2, 5, 17):
        for scale in (0.1, 1.0, 10.0):
            v = torch.randn(n, generator=g, dtype=torch.float64) * scale
            got = project_simplex(v)
            torch.testing.assert_close(got, bisection_projection(v), atol=1e-9, rtol=0)
            assert float(got.sum()) == pytest.approx(1.0) and bool((got >= 0).all())
    inside = torch.tensor([0.2, 0.3, 0.5], dtype=torch.float64)
    torch.testing.assert_close(project_simplex(inside), inside)  # a point of the simplex stays


def test_afl_round_against_its_reference(store):
    alg = alg_factory(AFL)(store)
    ref = alg_factory(AFL)(store)
    train = store.clients(ROLE_TRAIN)
    lam = torch.zeros(store.num_clients, dtype=torch.float64)
    lam[torch.as_tensor(train)] = torch.rand(len(train), generator=torch.Generator().manual_seed(2),
                                             dtype=torch.float64)
    lam /= lam.sum()
    alg.lam = lam.clone()
    w = {k: v.clone() for k, v in ref.global_params.items()}
    cohort = torch.as_tensor(train[[1, 2, 6, 8]])
    alg.run_round(0, cohort, gen())
    fk = torch.tensor([ref_loss(ref, w, int(i)) for i in cohort], dtype=torch.float64)
    theta, _, _ = ref.cohort_sgd({k: v.expand(4, *v.shape).clone() for k, v in w.items()}, cohort, gen(),
                                 steps=AFL.local_steps)
    share = lam[cohort] / lam[cohort].sum()
    for k in w:
        want = w[k] + sum(float(share[r]) * (theta[k][r] - w[k]) for r in range(4))
        torch.testing.assert_close(alg.global_params[k], want, atol=1e-6, rtol=1e-5)
    # lambda <- Proj(lambda + gamma g), g_k = (N / |S|) F_k on the cohort, over the N train clients
    step = lam[torch.as_tensor(train)].clone()
    where = {int(c): r for r, c in enumerate(cohort)}
    for j, c in enumerate(train):
        if int(c) in where:
            step[j] += AFL.afl_lambda_lr * (len(train) / 4) * fk[where[int(c)]]
    torch.testing.assert_close(alg.lam[torch.as_tensor(train)], bisection_projection(step), atol=1e-5, rtol=0)
    assert float(alg.lam.sum()) == pytest.approx(1.0)


# ----------------------------------------------------------------------------------------------- FedEM
FEDEM = small_config(algorithm="fedem", mlp_hidden=(8,), local_steps=2, batch_size=8, lr=0.05, clients_per_round=4,
                     num_components=3, new_client_em_steps=3)


def ref_e_step(alg, client, pi):
    """Marfoq et al. Alg. 2's E-step for one client: q_s(m) ∝ pi_m p_m(y_s | x_s) per sample, then their mean."""
    n = int(alg.store.fit.length[client])
    idx = alg.store.fit.index[client, :n]
    x, y = alg.store.inputs(idx), alg.store.y[idx]
    qs = []
    for s in range(n):
        p = [float(pi[m]) * float(torch.softmax(functional_call(
            alg.base, {k: v[m] for k, v in alg.stacked().items()}, (x[s:s + 1],)), -1)[0, y[s]])
             for m in range(alg.k)]
        qs.append([v / sum(p) for v in p])
    return torch.tensor(qs, dtype=torch.float64).mean(0)


def test_fedem_e_step_weights_against_the_per_sample_posterior(store):
    alg = alg_factory(FEDEM)(store)
    g = torch.Generator().manual_seed(4)
    alg.components = {k: v + torch.randn(v.shape, generator=g) for k, v in alg.components.items()}
    clients = torch.as_tensor(store.clients(ROLE_TRAIN)[:5])
    pi = torch.softmax(torch.randn(5, 3, generator=g), 1)
    got = alg.e_step(clients, pi)
    want = torch.stack([ref_e_step(alg, int(i), pi[r]) for r, i in enumerate(clients)]).to(got.dtype)
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-4)
    torch.testing.assert_close(got.sum(1), torch.ones(5))


def test_fedem_mixture_output_is_the_log_of_the_mixed_probabilities(store):
    alg = alg_factory(FEDEM)(store)
    x = store.inputs(store.fit.index[0, :4])
    pi = torch.tensor([0.2, 0.5, 0.3])
    params = {**alg.components, "pi": pi}
    got = functional_call(alg.net, params, (x,))
    probs = sum(pi[m] * torch.softmax(functional_call(alg.base, {k: v[m] for k, v in alg.stacked().items()}, (x,)),
                                      -1) for m in range(3))
    torch.testing.assert_close(got, torch.log(probs), atol=1e-5, rtol=1e-5)


def test_fedem_round_sets_pi_by_the_e_step_and_averages_each_component(store):
    alg = alg_factory(FEDEM)(store)
    ref = alg_factory(FEDEM)(store)
    cohort = torch.as_tensor(store.clients(ROLE_TRAIN)[[0, 2, 4, 7]])
    alg.run_round(0, cohort, gen())
    pi = torch.stack([ref_e_step(ref, int(i), torch.full((3,), 1 / 3)) for i in cohort]).to(torch.float32)
    torch.testing.assert_close(alg.private.values["pi"][cohort], pi, atol=1e-5, rtol=1e-4)
    start = {**{k: v.expand(4, *v.shape).clone() for k, v in ref.components.items()},
             "pi": alg.private.values["pi"][cohort]}
    theta, _, _ = ref.cohort_sgd(start, cohort, gen(), trainable=set(ref.components), steps=FEDEM.local_steps)
    size = store.fit.length[cohort].to(torch.float32)
    for k in ref.components:
        want = (size.view(-1, *([1] * (theta[k].dim() - 1))) * theta[k]).sum(0) / size.sum()
        torch.testing.assert_close(alg.components[k], want, atol=1e-6, rtol=1e-5)


def test_fedem_new_client_fits_its_weights_with_the_components_frozen(store):
    alg = alg_factory(FEDEM)(store)
    g = torch.Generator().manual_seed(5)
    alg.components = {k: v + torch.randn(v.shape, generator=g) for k, v in alg.components.items()}
    new = int(store.clients(1)[0])
    before = {k: v.clone() for k, v in alg.components.items()}
    params, personalized = alg.personalize([new], gen())
    pi = torch.full((3,), 1 / 3, dtype=torch.float64)
    for _ in range(3):
        pi = ref_e_step(alg, new, pi)
    assert personalized
    torch.testing.assert_close(params["pi"][0], pi.to(torch.float32), atol=1e-5, rtol=1e-4)
    for k, v in before.items():
        assert torch.equal(alg.components[k], v) and torch.equal(params[k][0], v)
