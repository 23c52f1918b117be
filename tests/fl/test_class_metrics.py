"""Balanced accuracy, macro-F1 and the global model's accuracy (pfl_cli.fl.evaluate) against scikit-learn.

The slow obvious reference: each client's scored predictions collected one by one, then
``sklearn.metrics.balanced_accuracy_score`` / ``f1_score(average="macro")`` per client, and on the
concatenation of every client's samples for the pooled values.
"""

import warnings

import numpy as np
import pytest
import torch
from sklearn.metrics import balanced_accuracy_score, f1_score

from pfl_cli.fl.evaluate import (GroupEval, _class_counts, balanced_accuracy, evaluate, macro_f1,
                                 personalize_and_evaluate)
from pfl_cli.fl.store import build_store
from pfl_cli.models import client_model
from pfl_cli.rng import make_rng


def _sk(y, p):
    with warnings.catch_warnings():  # a class only among the predictions: sklearn warns and drops it
        warnings.simplefilter("ignore")
        return balanced_accuracy_score(y, p), f1_score(y, p, average="macro")


def _random_chunk(seed: int, k: int = 7, width: int = 13, c: int = 5):
    g = np.random.default_rng(seed)
    y = g.integers(0, c, (k, width))
    y[0] = 2                                  # one class only
    pred = np.where(g.random((k, width)) < 0.5, y, g.integers(0, c, (k, width)))
    pred[1] = 4                               # class 4 predicted, maybe never a label
    y[1] = g.integers(0, 2, width)
    y[2, ::3] = -1                            # unlabeled samples are not scored
    length = g.integers(0, width + 1, k)
    length[3] = 0                             # a client without samples
    scored = (np.arange(width)[None, :] < length[:, None]) & (y >= 0)
    return y, pred, scored, c


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_class_counts_give_sklearns_metrics_per_client_and_pooled(seed):
    y, pred, scored, c = _random_chunk(seed)
    tp, support, predicted = _class_counts(torch.as_tensor(pred), torch.as_tensor(y), torch.as_tensor(scored), c)
    bal, f1 = balanced_accuracy(tp, support), macro_f1(tp, support, predicted)
    for j in range(len(y)):
        yj, pj = y[j][scored[j]], pred[j][scored[j]]
        if len(yj) == 0:
            assert np.isnan(bal[j]) and np.isnan(f1[j])
            continue
        ref_bal, ref_f1 = _sk(yj, pj)
        assert bal[j] == pytest.approx(ref_bal, abs=1e-12)
        assert f1[j] == pytest.approx(ref_f1, abs=1e-12)
    ref_bal, ref_f1 = _sk(y[scored], pred[scored])
    assert balanced_accuracy(tp.sum(0), support.sum(0)) == pytest.approx(ref_bal, abs=1e-12)
    assert macro_f1(tp.sum(0), support.sum(0), predicted.sum(0)) == pytest.approx(ref_f1, abs=1e-12)


def test_pooled_metrics_are_not_the_mean_of_per_client_ones():
    """Two clients: one all-class-0 client scored perfectly, one two-class client half right."""
    tp = np.array([[4, 0], [1, 1]])
    support = np.array([[4, 0], [2, 2]])
    predicted = np.array([[4, 0], [2, 2]])
    ev = GroupEval(np.arange(2), support.sum(1), tp.sum(1), tp.sum(1), np.zeros(2), tp, support, predicted)
    s = ev.summary()
    y = np.array([0, 0, 0, 0, 0, 0, 1, 1])
    p = np.array([0, 0, 0, 0, 0, 1, 1, 0])
    ref_bal, ref_f1 = _sk(y, p)
    assert s["pooled_balanced_accuracy"] == pytest.approx(ref_bal)   # (5/6 + 1/2) / 2
    assert s["pooled_macro_f1"] == pytest.approx(ref_f1)
    assert s["mean_balanced_accuracy"] == pytest.approx((1.0 + 0.5) / 2)
    assert s["pooled_balanced_accuracy"] != pytest.approx(s["mean_balanced_accuracy"])
    assert s["global_accuracy"] is None  # no global model counted


@pytest.fixture(scope="module")
def store(digits_clients):
    ds, part = digits_clients
    return build_store(ds.x, ds.y, ds.num_classes, part, val_fraction=0.25, rng=make_rng(0, "v"), device="cpu")


@pytest.mark.parametrize("personalized", [False, True])
def test_evaluate_counts_match_sklearn_on_a_per_client_loop(store, personalized):
    net = client_model("mlp", (64,), 10, hidden=(8,))
    clients = np.arange(store.num_clients)
    g = torch.Generator().manual_seed(1)
    base = {k: v.detach() for k, v in net.named_parameters()}
    params = ({k: v + torch.randn(len(clients), *v.shape, generator=g) for k, v in base.items()}
              if personalized else base)
    ev = evaluate(net, params, store, clients, "test", personalized=personalized, max_samples=64)
    ys, ps = [], []
    per = ev.client_metrics()
    for i, j in enumerate(clients):
        idx = store.test.index[j, : store.test.length[j]]
        p = {k: v[i] for k, v in params.items()} if personalized else params
        pred = torch.func.functional_call(net, p, (store.inputs(idx),)).argmax(1).numpy()
        y = store.y_eval[idx].numpy()
        ys.append(y)
        ps.append(pred)
        ref_bal, ref_f1 = _sk(y, pred)
        assert per["balanced_accuracy"][i] == pytest.approx(ref_bal)
        assert per["macro_f1"][i] == pytest.approx(ref_f1)
    assert ev.tp.sum(1).tolist() == ev.correct.tolist()  # the counts are the accuracy's
    s = ev.summary()
    ref_bal, ref_f1 = _sk(np.concatenate(ys), np.concatenate(ps))
    assert s["pooled_balanced_accuracy"] == pytest.approx(ref_bal)
    assert s["pooled_macro_f1"] == pytest.approx(ref_f1)
    assert s["mean_macro_f1"] == pytest.approx(np.mean(per["macro_f1"]))


def test_global_accuracy_is_the_global_models_on_the_pooled_test_splits(store):
    """Ditto serves personal models; its global model w is scored separately, on the same test samples."""
    from pflx_testing import small_config

    from pfl_cli.registry import get

    cfg = small_config("ditto", mlp_hidden=(8,), new_client_epochs=0)
    alg = get("ditto").algorithm(cfg, store)
    g = torch.Generator().manual_seed(0)
    alg.global_params = {k: v + torch.randn(v.shape, generator=g) for k, v in alg.global_params.items()}
    clients = np.arange(store.num_clients)
    alg.private.scatter(torch.as_tensor(clients), {k: torch.randn(len(clients), *v.shape, generator=g)
                                                   for k, v in alg.global_params.items()})  # each client's own v
    evals, _, personalized = personalize_and_evaluate(alg, clients, ("test", "val"), torch.Generator())
    assert personalized
    ev = evals["test"]
    assert evals["val"].global_tp is None  # the global test set is the test splits only
    ys, ps = [], []
    for j in clients:
        idx = store.test.index[j, : store.test.length[j]]
        ps.append(torch.func.functional_call(alg.net, alg.global_params, (store.inputs(idx),)).argmax(1).numpy())
        ys.append(store.y_eval[idx].numpy())
    y, p = np.concatenate(ys), np.concatenate(ps)
    s = ev.summary()
    assert s["global_accuracy"] == pytest.approx(float(np.mean(y == p)))
    ref_bal, ref_f1 = _sk(y, p)
    assert s["global_balanced_accuracy"] == pytest.approx(ref_bal)
    assert s["global_macro_f1"] == pytest.approx(ref_f1)
    # the personal models (Ditto's v) are other models: their accuracy differs
    assert s["global_accuracy"] != pytest.approx(s["pooled_accuracy"])
    per = ev.client_metrics()["global_accuracy"]
    assert per == pytest.approx([float(np.mean(a == b)) for a, b in zip(ys, ps)])


@pytest.mark.parametrize("algorithm, has", [("fedavg", True), ("ditto", True), ("fedper", False), ("pefll", False)])
def test_which_methods_have_a_global_model(store, algorithm, has):
    """A method serving one model has it; Ditto keeps w beside each client's v; FedPer's server never trains
    the heads its clients keep; PeFLL's server holds a hypernetwork, no client model."""
    from pflx_testing import small_config

    from pfl_cli.train.files import has_global_model
    from pfl_cli.registry import get

    alg = get(algorithm).algorithm(small_config(algorithm, mlp_hidden=(8,), hyper_hidden=16), store)
    assert has_global_model(alg) is has
    evals, _, _ = personalize_and_evaluate(alg, np.arange(4), ("test",), torch.Generator())
    assert (evals["test"].summary()["global_accuracy"] is not None) is has


def _suite():
    from pfl_cli import registry

    default = {"fedavg", "ditto", "fedper", "pefll"}  # one per case: one model, beside personal ones, partial, none
    for name in registry.names():
        if name == "hyperfl-lpm":  # needs a backbone net: test_which_methods... covers the rule on the others
            continue
        yield pytest.param(name, marks=() if name in default else pytest.mark.slow)


@pytest.mark.parametrize("algorithm", list(_suite()))
def test_every_algorithms_global_model_is_the_model_it_declares(store, algorithm):
    """Generated from the registry: an algorithm's global_accuracy (when it declares a global model) is its
    declared model's pooled accuracy on the test splits, computed here sample by sample; its class counts
    reproduce its accuracy; a method without one reports null."""
    from pflx_testing import small_config

    from pfl_cli.train.files import has_global_model
    from pfl_cli.fl.evaluate import global_model_of
    from pfl_cli.registry import get

    alg = get(algorithm).algorithm(small_config(algorithm, mlp_hidden=(8,), hyper_hidden=16, local_epochs=1,
                                                new_client_epochs=0), store)
    clients = np.arange(store.num_clients)
    evals, params, personalized = personalize_and_evaluate(alg, clients, ("test",), torch.Generator(),
                                                           keep_params=True)
    ev = evals["test"]
    assert ev.tp.sum(1).tolist() == ev.correct.tolist() and ev.support.sum(1).tolist() == ev.n.tolist()
    s = ev.summary()
    if not has_global_model(alg):
        assert s["global_accuracy"] is None
        return
    net, glob = (alg.predict_net, params) if not personalized else global_model_of(alg)
    hits = total = 0
    for j in clients:
        idx = store.test.index[j, : store.test.length[j]]
        pred = torch.func.functional_call(net, glob, (store.inputs(idx),)).argmax(1)
        hits += int((pred == store.y_eval[idx]).sum())
        total += len(idx)
    assert s["global_accuracy"] == pytest.approx(hits / total)


def test_a_resumed_run_reports_the_class_metrics_of_the_uninterrupted_one(digits_clients):
    """The selected evaluation travels in the checkpoint with its class counts: resumed after round 2 of 4 (the
    best round may be one the resumed process never evaluated), the summaries equal the uninterrupted run's."""
    from pflx_testing import small_config

    from pfl_cli.fl import train_federated

    ds, part = digits_clients
    cfg = small_config("ditto", rounds=4, eval_every=1, local_steps=2, clients_per_round=8, mlp_hidden=(8,),
                       val_fraction=0.25, checkpoint_every=2)
    kept = []
    whole = train_federated(ds.x, ds.y, ds.num_classes, part, cfg, device="cpu", on_checkpoint=kept.append)
    again = train_federated(ds.x, ds.y, ds.num_classes, part, cfg, device="cpu", resume=kept[0])
    assert kept[0]["round"] == 2
    a, b = whole.outcome.best.summaries(), again.outcome.best.summaries()
    assert a["train"]["global_accuracy"] is not None and a["train"]["pooled_macro_f1"] is not None
    assert a == b
