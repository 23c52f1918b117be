"""Client store layout, validation split, normalization, and evaluation against a slow reference."""

import numpy as np
import pytest
import torch

from pfl_cli.errors import InputError
from pfl_cli.fl.evaluate import evaluate
from pfl_cli.fl.store import ROLE_TRAIN, build_store, split_validation
from pfl_cli.models import client_model
from pfl_cli.rng import make_rng


@pytest.fixture(scope="module")
def store(digits_clients):
    ds, part = digits_clients
    return build_store(ds.x, ds.y, ds.num_classes, part, val_fraction=0.25, rng=make_rng(0, "v"), device="cpu")


def test_fit_and_val_split_each_train_client(store, digits_clients):
    ds, part = digits_clients
    for j in range(part.num_clients):
        fit = set(store.fit.index[j, : store.fit.length[j]].tolist())
        val = set(store.val.index[j, : store.val.length[j]].tolist())
        assert fit | val == set(part.train_of(j).tolist()) and not fit & val
        n = len(part.train_of(j))
        assert len(val) == (int(np.floor(0.25 * n)) if part.role[j] == ROLE_TRAIN else 0)
        assert set(store.test.index[j, : store.test.length[j]].tolist()) == set(part.test_of(j).tolist())
        present = np.unique(ds.y[part.train_of(j)])
        assert np.flatnonzero(store.classes[j].numpy()).tolist() == present.tolist()


def test_split_validation_keeps_one_sample_to_train_on():
    owner = np.array([0, 1, 1, 2, 2, 2, 2])
    held = split_validation(owner, np.array([True, True, False]), 0.9, np.random.default_rng(0).random(len(owner)))
    assert held[owner == 0].sum() == 0 and held[owner == 1].sum() == 1 and held[owner == 2].sum() == 0


def test_inputs_are_standardized_on_train_client_fit_samples(store):
    idx = torch.cat([store.fit.index[j, : store.fit.length[j]] for j in np.flatnonzero(store.role == ROLE_TRAIN)])
    x = store.inputs(idx)
    varying = x.std(0) > 0
    assert torch.allclose(x.mean(0), torch.zeros(64), atol=1e-4)
    assert torch.allclose(x.std(0, unbiased=False)[varying], torch.ones(int(varying.sum())), atol=1e-3)


def test_training_without_labeled_train_clients_is_refused(digits_clients):
    """A store without labels serves label-free prediction; training on it says what is missing."""
    from pfl_cli.fl import train_federated
    from pflx_testing import replace, small_config

    ds, part = digits_clients
    store = build_store(ds.x, None, 10, part, val_fraction=0.0, rng=None, device="cpu")
    assert not store.labeled.any() and int((store.y >= 0).sum()) == 0
    with pytest.raises(InputError, match="training needs train clients with labels; none of the 16 has any"):
        train_federated(ds.x, None, 10, part, small_config(rounds=1, eval_every=1, mlp_hidden=4), device="cpu")


def test_hidden_labels_are_invisible_to_training_and_scored_only_by_the_oracle(digits_clients):
    """Unlabeled clients: y is -1 for training (loss, label mask, one-hot), y_eval holds them only on request."""
    import dataclasses

    from pfl_cli.fl.evaluate import evaluate
    from pfl_cli.models import build, client_spec

    ds, part = digits_clients
    labeled = np.ones(part.num_clients, dtype=np.uint8)
    labeled[[0, 5]] = 0
    hidden = dataclasses.replace(part, labeled=labeled)
    plain = build_store(ds.x, ds.y, 10, hidden, val_fraction=0.0, rng=None, device="cpu")
    oracle = build_store(ds.x, ds.y, 10, hidden, val_fraction=0.0, rng=None, device="cpu", hidden_labels=True)
    samples = np.concatenate([part.train_of(0), part.test_of(0), part.train_of(5), part.test_of(5)])
    assert (plain.y[samples] == -1).all() and (oracle.y[samples] == -1).all()
    assert torch.equal(oracle.y_eval[samples], torch.as_tensor(ds.y[samples]))
    assert (plain.y_eval[samples] == -1).all()
    assert plain.labeled.tolist() == [j not in (0, 5) for j in range(part.num_clients)]
    assert not plain.classes[[0, 5]].any() and plain.classes[1].any()
    assert plain.onehot(torch.as_tensor(part.train_of(0))).sum() == 0
    net = build(client_spec("mlp", (64,), 10, (8,)))
    params = dict(net.named_parameters())
    clients = np.arange(part.num_clients)
    a = evaluate(net, params, plain, clients, personalized=False)
    b = evaluate(net, params, oracle, clients, personalized=False)
    assert a.n[[0, 5]].tolist() == [0, 0] and b.n[[0, 5]].tolist() == part.test_sizes[[0, 5]].tolist()
    others = np.setdiff1d(clients, [0, 5])
    assert a.correct[others].tolist() == b.correct[others].tolist()
    # model selection never reads a hidden label, oracle or not
    held = build_store(ds.x, ds.y, 10, hidden, val_fraction=0.5, rng=np.random.default_rng(0), device="cpu",
                       hidden_labels=True)
    val = evaluate(net, params, held, clients, "val", personalized=False)
    assert val.n[[0, 5]].tolist() == [0, 0] and val.n[others].sum() > 0


def _reference(net, params, store, clients, personalized):
    out = []
    for i, j in enumerate(clients):
        idx = store.test.index[j, : store.test.length[j]]
        p = {k: v[i] for k, v in params.items()} if personalized else params
        logits = torch.func.functional_call(net, p, (store.inputs(idx),))
        y = store.y[idx]
        masked = logits.clone()
        masked[:, ~store.classes[j]] = -float("inf")
        out.append((len(idx), int((logits.argmax(1) == y).sum()), int((masked.argmax(1) == y).sum())))
    return np.array(out)


@pytest.mark.parametrize("personalized", [False, True])
def test_evaluate_matches_a_per_client_loop(store, personalized):
    net = client_model("mlp", (64,), 10, hidden=(8,))
    clients = np.arange(store.num_clients)
    g = torch.Generator().manual_seed(0)
    base = dict(net.named_parameters())
    params = ({k: v.detach() + torch.randn(len(clients), *v.shape, generator=g) for k, v in base.items()}
              if personalized else {k: v.detach() for k, v in base.items()})
    ev = evaluate(net, params, store, clients, "test", personalized=personalized, max_samples=64)
    ref = _reference(net, params, store, clients, personalized)
    assert ev.n.tolist() == ref[:, 0].tolist()
    assert ev.correct.tolist() == ref[:, 1].tolist()
    assert ev.correct_lm.tolist() == ref[:, 2].tolist()
    s = ev.summary()
    assert s["pooled_accuracy"] == pytest.approx(ref[:, 1].sum() / ref[:, 0].sum())
    assert s["mean_accuracy"] == pytest.approx(np.mean(ref[:, 1] / ref[:, 0]))


def test_label_masking_never_predicts_an_absent_class_even_with_negative_logits(store):
    """T8: the code's multiplicative mask fails when every present logit is negative; -inf does not."""
    net = client_model("mlp", (64,), 10, hidden=(4,))
    params = {k: torch.zeros_like(v) for k, v in net.named_parameters()}
    clients = np.arange(store.num_clients)
    for absent_winner in range(10):
        bias = torch.full((10,), -5.0)
        bias[absent_winner] = -1.0  # the largest logit everywhere
        params["fc2.bias"] = bias
        ev = evaluate(net, params, store, clients, "test", personalized=False)
        for j in clients:
            y = store.y[store.test.index[j, : store.test.length[j]]]
            own = torch.nonzero(store.classes[j]).flatten()
            if absent_winner in own.tolist():
                continue
            # every prediction is the client's lowest-index own class (all own logits tie at -5)
            assert ev.correct_lm[j] == int((y == own.min()).sum())
            assert ev.correct[j] == int((y == absent_winner).sum())


@pytest.mark.parametrize("algorithm", ["pefll", "fedavg", "local"])
def test_an_empty_client_trains_and_evaluates_without_nan(digits_clients, algorithm):
    """A client with no samples at all (train and test) neither breaks a round nor the metrics."""
    from pfl_cli.fl import train_federated
    from pflx_testing import replace, small_config
    from pfl_cli.partition.base import Partition

    ds, part = digits_clients
    arrays = part.to_arrays()
    # client 0 gives its samples away to client 1: it keeps none
    own = part.train_offsets[1] - part.train_offsets[0]
    arrays["train_offsets"] = np.concatenate([[0, 0], part.train_offsets[2:]])
    arrays["test_offsets"] = np.concatenate([[0, 0], part.test_offsets[2:]])
    empty = Partition.from_arrays(arrays)
    assert empty.train_sizes[0] == 0 and empty.train_sizes[1] == own + part.train_sizes[1]
    cfg = small_config(algorithm=algorithm, rounds=6, eval_every=3, local_steps=2, clients_per_round=20,
                      mlp_hidden=(8,), hyper_hidden=16, local_epochs=2)
    run = train_federated(ds.x, ds.y, ds.num_classes, empty, cfg, device="cpu")
    summary = run.outcome.best.summaries()["train"]
    assert np.isfinite(summary["mean_accuracy"]) and summary["num_clients"] == 16
    assert all(np.isfinite(row[3]) for row in run.outcome.history)
    assert part.role[0] == 0
    train = run.outcome.best.groups["train"]
    assert train.n[list(train.clients).index(0)] == 0


@pytest.mark.parametrize("algorithm", ["pefll", "fedavg"])
def test_chunked_personalization_equals_one_pass(store, algorithm):
    from pfl_cli.registry import entries
    REGISTRY = {n: e.algorithm for n, e in entries().items()}
    from pflx_testing import replace, small_config
    from pfl_cli.fl.evaluate import personalize_and_evaluate

    alg = REGISTRY[algorithm](small_config(algorithm=algorithm, mlp_hidden=(8,), hyper_hidden=16), store)
    clients = np.arange(store.num_clients)
    whole, p1, pers = personalize_and_evaluate(alg, clients, ("test", "val"), torch.Generator(), keep_params=True)
    parts, p2, _ = personalize_and_evaluate(alg, clients, ("test", "val"), torch.Generator(), chunk=3,
                                            keep_params=True)
    for split in ("test", "val"):
        for f in ("clients", "n", "correct", "correct_lm"):
            assert getattr(whole[split], f).tolist() == getattr(parts[split], f).tolist()
    assert pers is (algorithm == "pefll")
    shapes = dict(alg.net.named_parameters())
    for k in p1:
        torch.testing.assert_close(p1[k], p2[k])
        expected = (store.num_clients, *shapes[k].shape) if pers else shapes[k].shape  # a global model once
        assert p1[k].shape == expected


def test_a_rank_holds_only_its_own_clients_samples(digits_clients):
    """build_store(held=...): the held clients' samples only, the same values through renumbered indices,
    the others' rows unreadable; statistics and metadata as the whole store's."""
    from pfl_cli.fl.store import NOT_HERE

    ds, part = digits_clients
    whole = build_store(ds.x, ds.y, ds.num_classes, part, val_fraction=0.25, rng=make_rng(0, "v"), device="cpu")
    mine = np.arange(part.num_clients) % 2 == 0
    half = build_store(ds.x, ds.y, ds.num_classes, part, val_fraction=0.25, rng=make_rng(0, "v"), device="cpu",
                       held=mine)
    clients = np.flatnonzero(mine)
    own = np.unique(np.concatenate([
        np.asarray(part.train_indices)[np.isin(part.train_owner(), clients)],
        np.asarray(part.test_indices)[np.isin(part.test_owner(), clients)]]))
    assert len(half.x) == len(own) < len(whole.x)                     # memory falls with the share held
    torch.testing.assert_close(half.mean, whole.mean)                  # statistics of every train client
    assert torch.equal(half.classes, whole.classes) and np.array_equal(half.labeled, whole.labeled)
    for split in ("fit", "val", "test"):
        a, b = getattr(whole, split), getattr(half, split)
        assert torch.equal(a.length, b.length)                         # sizes are metadata: kept for all
        rows, length = b.rows(torch.as_tensor(clients))
        ref, _ = a.rows(torch.as_tensor(clients))
        valid = torch.arange(rows.shape[1]) < length[:, None]
        assert torch.equal(half.inputs(rows)[valid], whole.inputs(ref)[valid])
        assert torch.equal(half.y[rows][valid], whole.y[ref][valid])
        assert (b.index[torch.as_tensor(~mine)] == NOT_HERE).all()
    other = torch.as_tensor(np.flatnonzero(~mine))
    assert not half.holds(half.fit.rows(other)[0]).any() and half.holds(half.fit.rows(torch.as_tensor(clients))[0]).all()
    with pytest.raises(IndexError):
        half.inputs(half.fit.rows(other)[0])                           # another rank's client cannot be read
