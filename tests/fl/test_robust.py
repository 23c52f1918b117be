"""Robust aggregators and Byzantine attacks against slow, obviously correct references (issue 48).

Each aggregator of :mod:`pfl_cli.fl.robust` (torch ops over a [clients, params] matrix) is checked against a
per-client numpy loop written from its paper's definition, on random updates; each attack of
:mod:`pfl_cli.fl.byzantine.attacks` against its formula; the engine's hook keeps honest rows untouched and the
default (no attack, ``aggregator=mean``) run equal to FedAvg's bit for bit.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from pfl_cli.errors import ConfigError
from pfl_cli.fl.byzantine.attacks import ATTACKS, alie_z
from pfl_cli.fl.robust import AGGREGATORS, cohort_f


# ------------------------------------------------------------------ references (numpy, one client at a time)
def ref_median(X):
    out = np.empty(X.shape[1])
    for j in range(X.shape[1]):
        col = sorted(X[:, j])
        n = len(col)
        out[j] = col[n // 2] if n % 2 else (col[n // 2 - 1] + col[n // 2]) / 2
    return out


def ref_trimmed(X, f):
    out = np.empty(X.shape[1])
    for j in range(X.shape[1]):
        col = sorted(X[:, j])
        kept = col[f:len(col) - f]
        out[j] = sum(kept) / len(kept)
    return out


def ref_krum_scores(X, f, rows):
    scores = {}
    for i in rows:
        d = sorted(float(np.sum((X[i] - X[j]) ** 2)) for j in rows if j != i)
        scores[i] = sum(d[:len(rows) - f - 2])
    return scores


def ref_krum(X, f, m):
    scores = ref_krum_scores(X, f, list(range(len(X))))
    best = sorted(scores, key=lambda i: (scores[i], i))[:m]
    return np.mean([X[i] for i in best], axis=0)


def ref_bulyan(X, f):
    n = len(X)
    left, chosen = list(range(n)), []
    for _ in range(n - 2 * f):
        scores = ref_krum_scores(X, f, left)
        i = min(left, key=lambda r: (scores[r], r))
        chosen.append(i)
        left.remove(i)
    S = X[chosen]
    beta = len(chosen) - 2 * f
    med = ref_median(S)
    out = np.empty(X.shape[1])
    for j in range(X.shape[1]):
        closest = sorted(range(len(S)), key=lambda r: (abs(S[r, j] - med[j]), r))[:beta]
        out[j] = np.mean([S[r, j] for r in closest])
    return out


def ref_centered_clip(X, tau, v):
    total = np.zeros(X.shape[1])
    for x in X:
        d = x - v
        total += d * min(1.0, tau / np.linalg.norm(d))
    return v + total / len(X)


def ref_norm_bound(X, w, M):
    out = np.zeros(X.shape[1])
    for x, wi in zip(X, w):
        out += wi * x * min(1.0, M / np.linalg.norm(x))
    return out


def random_updates(n=11, p=23, seed=0):
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(n, p))
    X[:2] += 5.0  # two outliers
    w = rng.uniform(1, 10, size=n)
    return X, w / w.sum()


@pytest.mark.parametrize("n", [7, 11, 12])
def test_each_aggregator_equals_its_per_client_reference(n):
    X, w = random_updates(n=n, seed=n)
    f = cohort_f(0.2, n)
    Xt, wt = torch.tensor(X), torch.tensor(w)
    center = np.random.default_rng(1).normal(size=X.shape[1]) * 0.1
    want = {
        "mean": sum(wi * x for wi, x in zip(w, X)),
        "median": ref_median(X),
        "trimmed-mean": ref_trimmed(X, f),
        "krum": ref_krum(X, f, 1),
        "multi-krum": ref_krum(X, f, n - f),
        "bulyan": ref_bulyan(X, f) if n >= 4 * f + 3 else None,
        "centered-clip": ref_centered_clip(X, 1.5, center),
        "norm-bound": ref_norm_bound(X, w, 2.0),
    }
    assert set(want) == set(AGGREGATORS)
    for name, agg in AGGREGATORS.items():
        if want[name] is None:
            continue
        got = agg.combine(Xt, wt, f=f, clip=1.5 if name == "centered-clip" else 2.0, center=torch.tensor(center))
        np.testing.assert_allclose(got.numpy(), want[name], rtol=1e-12, atol=1e-12, err_msg=name)


def test_default_clip_is_the_median_norm():
    X, w = random_updates(n=9)
    norms = np.linalg.norm(X, axis=1)
    got = AGGREGATORS["norm-bound"].combine(torch.tensor(X), torch.tensor(w), f=0, clip=None, center=None)
    np.testing.assert_allclose(got.numpy(), ref_norm_bound(X, w, float(np.median(norms))), rtol=1e-12)
    got = AGGREGATORS["centered-clip"].combine(torch.tensor(X), torch.tensor(w), f=0, clip=None, center=None)
    np.testing.assert_allclose(got.numpy(), ref_centered_clip(X, float(np.median(norms)), np.zeros(X.shape[1])),
                               rtol=1e-12)


def test_krum_ignores_far_updates():
    X = np.zeros((7, 3))
    X[:5] = np.random.default_rng(0).normal(scale=0.01, size=(5, 3))
    X[5:] = 100.0
    got = AGGREGATORS["krum"].combine(torch.tensor(X), None, f=2, clip=None, center=None).numpy()
    assert np.abs(got).max() < 0.1


# ------------------------------------------------------------------ attacks against their formulas
def test_each_attack_uploads_its_formula():
    rng = np.random.default_rng(3)
    D = torch.tensor(rng.normal(size=(10, 17)))
    mal = torch.zeros(10, dtype=torch.bool)
    mal[[1, 4, 7]] = True
    honest = D[~mal].numpy()
    s = 2.5
    np.testing.assert_array_equal(ATTACKS["sign-flip"].corrupt(D, mal, scale=s, gen=None).numpy(),
                                  -s * D[mal].numpy())
    np.testing.assert_array_equal(ATTACKS["backdoor"].corrupt(D, mal, scale=s, gen=None).numpy(), s * D[mal].numpy())
    np.testing.assert_allclose(ATTACKS["ipm"].corrupt(D, mal, scale=s, gen=None).numpy(),
                               np.tile(-s * honest.mean(axis=0), (3, 1)), rtol=1e-12)
    mu, sigma = D.numpy().mean(axis=0), D.numpy().std(axis=0)
    np.testing.assert_allclose(ATTACKS["alie"].corrupt(D, mal, scale=s, gen=None).numpy(),
                               np.tile(mu - s * sigma, (3, 1)), rtol=1e-12)
    gen = torch.Generator().manual_seed(5)
    got = ATTACKS["gaussian"].corrupt(D, mal, scale=s, gen=gen)
    want = s * torch.randn((3, 17), generator=torch.Generator().manual_seed(5), dtype=D.dtype)
    assert torch.equal(got, want)


def test_alie_z_is_the_papers():
    # Baruch et al. 2019, §3: n = 50 workers, f = 12 -> s = 26 - 12 = 14, z = Phi^-1(36 / 50) ~ 0.58
    assert math.isclose(alie_z(50, 12), 0.5828, abs_tol=1e-3)
    # n = 10, f = 2: s = 4, Phi^-1(0.6)
    assert math.isclose(alie_z(10, 2), 0.2533, abs_tol=1e-3)


def test_corrupt_keeps_honest_rows_and_replaces_malicious_deltas():
    from types import SimpleNamespace

    from pfl_cli.fl.byzantine.threat import Threat

    cfg = SimpleNamespace(attack="sign-flip", seed=0, attack_scale=None, server_lr=1.0)
    store = SimpleNamespace(num_clients=6, client_id=np.arange(6))
    threat = Threat(cfg, store, np.array([1, 4]))
    ref = {"w": torch.randn(3, 2), "b": torch.randn(2)}
    theta = {k: v + torch.randn(5, *v.shape) for k, v in ref.items()}
    cohort = torch.tensor([0, 1, 2, 4, 5])
    out = threat.corrupt(0, cohort, ref, theta)
    for k in ref:
        for row, client in enumerate(cohort.tolist()):
            if client in (1, 4):
                torch.testing.assert_close(out[k][row], ref[k] - 4.0 * (theta[k][row] - ref[k]))
            else:
                assert torch.equal(out[k][row], theta[k][row])


# ------------------------------------------------------------------ the engine
def _data():
    from pfl_cli.data import load_dataset
    from pfl_cli.partition import PartitionConfig, partition_labels
    from pfl_cli.rng import make_rng

    ds = load_dataset("builtin:digits")
    part = partition_labels(ds.y, PartitionConfig(scheme="dirichlet", alpha=1.0, num_clients=10, test_fraction=0.3),
                            num_classes=ds.num_classes, rng=make_rng(0, "partition"), pool=ds.pool)
    return ds, part


SMALL = {"rounds": 2, "clients_per_round": 5, "local_steps": 2, "batch_size": 8, "eval_every": 2,
         "mlp_hidden": (8,), "lr": 0.05}


def _run(name="fedavg", **keys):
    from pfl_cli.fl.api import train_federated
    from pfl_cli.registry import train_config

    ds, part = _data()
    return train_federated(ds.x, ds.y, ds.num_classes, part, train_config(name, **{**SMALL, **keys}),
                           device=torch.device("cpu"))


def test_no_attack_and_mean_is_fedavg_bit_for_bit():
    base, explicit = _run(), _run(attack="none", aggregator="mean")
    for k, v in base.model["weights"]["client"].items():
        assert torch.equal(v, explicit.model["weights"]["client"][k])
    assert explicit.algorithm.byzantine is None


def test_label_flip_poisons_only_the_malicious_clients_fit_samples():
    from pfl_cli.fl.byzantine.poison import poison_fit
    from pfl_cli.fl.store import build_store
    from pfl_cli.rng import make_rng

    ds, part = _data()
    store = build_store(ds.x, ds.y, ds.num_classes, part, val_fraction=0.1, rng=make_rng(0, "v"), device="cpu")
    before = {s: (getattr(store, s).index.clone(), getattr(store, s).length.clone()) for s in ("fit", "val", "test")}
    y0, n0 = store.y.clone(), store.x.shape[0]
    poison_fit(store, np.array([2, 5]), "label-flip")
    for c in range(store.num_clients):
        idx0, len0 = before["fit"][0][c, :int(before["fit"][1][c])], int(before["fit"][1][c])
        idx = store.fit.index[c, :len0]
        if c in (2, 5):
            assert (idx >= n0).all()
            assert torch.equal(store.y[idx], 9 - y0[idx0])
            assert torch.equal(store.x[idx], store.x[idx0])
        else:
            assert torch.equal(idx, idx0)
    for s in ("val", "test"):
        assert torch.equal(getattr(store, s).index, before[s][0])
    assert torch.equal(store.y[:n0], y0)


def test_backdoor_trigger_marks_every_other_sample_with_the_target():
    from pfl_cli.fl.byzantine.poison import BACKDOOR_TARGET, poison_fit
    from pfl_cli.fl.store import build_store
    from pfl_cli.rng import make_rng

    ds, part = _data()
    store = build_store(ds.x, ds.y, ds.num_classes, part, val_fraction=0.0, rng=make_rng(0, "v"), device="cpu")
    n0, high = store.x.shape[0], store.x.max()
    idx0 = store.fit.index[3, :int(store.fit.length[3])].clone()
    poison_fit(store, np.array([3]), "backdoor")
    idx = store.fit.index[3, :len(idx0)]
    for pos in range(len(idx0)):
        if pos % 2:
            assert int(idx[pos]) == int(idx0[pos])
        else:
            img = store.x[idx[pos]].view(8, 8)
            assert int(idx[pos]) >= n0 and int(store.y[idx[pos]]) == BACKDOOR_TARGET
            assert (img[-2:, -2:] == high).all()
            assert torch.equal(img[:6], store.x[idx0[pos]].view(8, 8)[:6])


def test_attack_resumes_byte_identically():
    from pfl_cli.fl.api import train_federated
    from pfl_cli.registry import train_config

    ds, part = _data()
    cfg = train_config("fedavg", **{**SMALL, "rounds": 4, "eval_every": 2, "attack": "gaussian",
                                    "attack_fraction": 0.3, "aggregator": "trimmed-mean"})
    kept = []
    whole = train_federated(ds.x, ds.y, ds.num_classes, part, cfg, device=torch.device("cpu"),
                            on_checkpoint=lambda c: kept.append(c))
    resumed = train_federated(ds.x, ds.y, ds.num_classes, part, cfg, device=torch.device("cpu"), resume=kept[0])
    assert int(kept[0]["round"]) == 2
    for k, v in whole.model["weights"]["client"].items():
        assert torch.equal(v, resumed.model["weights"]["client"][k])
    assert whole.outcome.history == resumed.outcome.history


@pytest.mark.parametrize("keys, words", [
    ({"aggregator": "krum", "clients_per_round": 4, "robust_fraction": 0.25}, "needs at least 5 clients per round"),
    ({"attack": "sign-flip", "attack_scale": -1.0}, "attack_scale must be a finite number > 0"),
    ({"robust_clip": 1.0}, "robust_clip has no effect"),
    ({"attack_scale": 2.0, "attack": "label-flip"}, "attack_scale has no effect"),
])
def test_impossible_settings_are_refused_in_one_line(keys, words):
    from pfl_cli.registry import train_config

    with pytest.raises(ConfigError) as err:
        train_config("fedavg", **keys)
    assert words in str(err.value) and "\n" not in str(err.value)


def test_an_algorithm_that_averages_no_updates_refuses_update_attacks_and_aggregators():
    from pfl_cli.registry import train_config

    for keys in ({"aggregator": "median"}, {"attack": "alie"}):
        with pytest.raises(ConfigError, match="averages_updates"):
            train_config("pfedme", **keys)
    assert train_config("pfedme", attack="label-flip").attack == "label-flip"  # data poisoning: any algorithm


def test_the_sorting_network_sorts_every_cohort_size():
    from pfl_cli.fl.robust import sort_clients

    gen = torch.Generator().manual_seed(0)
    for n in (1, 2, 3, 4, 5, 7, 8, 9, 15, 16, 17, 31, 33, 50, 64, 65):
        X = torch.randn(n, 13, generator=gen)
        X[n // 2] = X[0]  # equal values
        assert torch.equal(sort_clients(X), X.sort(dim=0).values), n


def test_the_flower_app_refuses_attacks_and_aggregators_in_one_line():
    from pfl_cli.interop.flower_app import check_deployable
    from pfl_cli.registry import train_config

    for keys, words in (({"attack": "sign-flip"}, "attack simulates Byzantine clients"),
                        ({"aggregator": "median"}, "aggregator is not deployed on Flower")):
        with pytest.raises(ConfigError) as err:
            check_deployable(train_config("fedavg", val_fraction=0.0, **keys))
        assert words in str(err.value) and "\n" not in str(err.value)


def test_the_registries_bases_are_abstract_and_none_and_mean_are_entries():
    from pfl_cli.fl.byzantine import ATTACK_NAMES
    from pfl_cli.fl.byzantine.attacks import Attack, NoAttack
    from pfl_cli.fl.robust import AGGREGATOR_NAMES, Aggregator, Mean

    for base in (Attack, Aggregator):
        with pytest.raises(TypeError, match="abstract"):
            base()
    assert ATTACK_NAMES == ("none", "label-flip", "sign-flip", "gaussian", "backdoor", "alie", "ipm")
    assert AGGREGATOR_NAMES[0] == "mean" and isinstance(AGGREGATORS["mean"], Mean)
    none = ATTACKS["none"]
    assert isinstance(none, NoAttack) and not none.poisons_data and not none.corrupts_updates
    D, mal = torch.arange(6.0).view(3, 2), torch.tensor([False, True, False])
    for name in ("none", "label-flip"):  # uploads as trained
        assert torch.equal(ATTACKS[name].corrupt(D, mal, scale=1.0, gen=None), D[mal])


def test_docs_table_is_generated_from_the_registry():
    from pathlib import Path

    from pfl_cli import registry
    from pfl_cli.fl.robust import table_markdown

    doc = Path(__file__).resolve().parents[2] / "docs" / "robustness.md"
    algorithms = {name: registry.get(name).algorithm for name in registry.names()}
    assert table_markdown(algorithms) in doc.read_text(), (
        "docs/robustness.md's table is stale: paste pfl_cli.fl.robust.table_markdown(...) of the registry between "
        "its markers")
