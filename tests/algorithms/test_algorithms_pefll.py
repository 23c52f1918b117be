"""PeFLL (Alg. 7/8): split back-propagation is exact, descriptors are set functions, predict never steps."""


import numpy as np
import pytest
import torch

from pfl_cli.algorithms import PeFLL
from pfl_cli.fl.batches import sample_batches
from pflx_testing import replace, small_config
from pfl_cli.fl.store import build_store
from pfl_cli.rng import make_rng

SMALL = dict(algorithm="pefll", mlp_hidden=(8,), hyper_hidden=16, embed_dim=4, descriptor_batch=8, batch_size=8)


@pytest.fixture(scope="module")
def store(digits_clients):
    ds, part = digits_clients
    return build_store(ds.x, ds.y, ds.num_classes, part, val_fraction=0.0, rng=make_rng(0, "v"), device="cpu")


def _eta(alg):
    return [p.detach().clone() for p in (*alg.hnet.parameters(), *alg.embed.parameters())]


@pytest.mark.parametrize("embedding,standardize", [("mlp", True), ("linear", False), ("mlp-x", True)])
def test_split_backprop_equals_end_to_end_autograd(store, embedding, standardize):
    """Spec §7.1 T1: k = 1, plain SGD, lambda = 0: the Alg. 8 update is alpha x the composed gradient."""
    alpha = 0.05
    cfg = small_config(**SMALL, embedding=embedding, standardize_descriptor=standardize, local_steps=1, lr=alpha, momentum=0.0, client_clip=0.0,
                      lambda_h=0.0, lambda_v=0.0, server_optimizer="sgd", server_lr=1.0, server_clip=0.0)
    alg = PeFLL(cfg, store)
    before = _eta(alg)
    cohort = torch.tensor([0, 2, 5, 9])
    alg.run_round(0, cohort, torch.Generator().manual_seed(11))
    update = [b - p.detach() for b, p in zip(before, (*alg.hnet.parameters(), *alg.embed.parameters()))]

    # The same round end to end: one autograd pass through h(v(B; eta_v); eta_h) into the SGD batch loss.
    ref = PeFLL(cfg, store)
    gen = torch.Generator().manual_seed(11)
    d_index, d_mask = sample_batches(store.fit, cohort, 1, cfg.descriptor_batch, gen)
    index, mask = sample_batches(store.fit, cohort, 1, cfg.batch_size, gen)
    v = ref._standardize(ref._embed_mean(d_index[:, 0], d_mask[:, 0]))  # frozen scalars: constants
    theta = ref.hnet(v)
    total = 0.0
    for i in range(len(cohort)):
        p = {k: theta[k][i] for k in ref.names}
        idx = index[i, 0]
        logits = torch.func.functional_call(ref.net, p, (store.inputs(idx),))
        ce = torch.nn.functional.cross_entropy(logits, store.y[idx], reduction="none")
        total = total + (ce * mask[i, 0]).sum() / mask[i, 0].sum()
    params = [*ref.hnet.parameters(), *ref.embed.parameters()]
    grads = torch.autograd.grad(alpha * total / len(cohort), params, allow_unused=True)
    for u, g in zip(update, grads):
        g = torch.zeros_like(u) if g is None else g
        torch.testing.assert_close(u, g, rtol=1e-4, atol=1e-6)
    assert max(float(u.abs().max()) for u in update) > 0


def test_vectorized_round_equals_one_client_at_a_time(store):
    cfg = small_config(**SMALL, local_steps=6, lr=0.05, lambda_h=1e-3, lambda_v=1e-3, lambda_theta=1e-3,
                      client_clip=0.5, standardize_descriptor=True)
    fast, slow = PeFLL(cfg, store), PeFLL(cfg, store)
    for t in range(3):
        cohort = torch.tensor([1, 4, 6, 8, 12][: 3 + t])
        lf = fast.run_round(t, cohort, torch.Generator().manual_seed(t))
        ls = slow.run_round_sequential(t, cohort, torch.Generator().manual_seed(t))
        torch.testing.assert_close(lf, ls.to(lf.dtype), rtol=1e-4, atol=1e-5)
    for a, b in zip(_eta(fast), _eta(slow)):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(fast.desc_stats, slow.desc_stats)


@pytest.mark.parametrize("embedding", ["mlp", "linear", "mlp-x"])
def test_descriptor_is_a_permutation_invariant_mean(store, embedding):
    """Spec §7.1 T2."""
    alg = PeFLL(small_config(**SMALL, embedding=embedding), store)
    idx = store.fit.index[3, : store.fit.length[3]][:8]
    ones = torch.ones(1, 8)
    with torch.no_grad():
        v = alg._embed_mean(idx[None], ones)
        perm = alg._embed_mean(idx[torch.randperm(8, generator=torch.Generator().manual_seed(0))][None], ones)
        halves = alg._embed_mean(torch.stack([idx[:4], idx[4:]]), torch.ones(2, 4))
    assert v.shape == (1, 4)
    torch.testing.assert_close(v, perm, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(v[0], halves.mean(0), rtol=1e-5, atol=1e-6)


def test_label_free_descriptor_ignores_labels_and_labelled_one_does_not(store):
    idx = store.fit.index[3, :8][None]
    x, y = store.inputs(idx).flatten(0, 1), store.onehot(idx).flatten(0, 1)
    y2 = torch.roll(y, 1, dims=1)
    for kind, changes in (("mlp", True), ("linear", True), ("mlp-x", False)):
        alg = PeFLL(small_config(**SMALL, embedding=kind), store)
        with torch.no_grad():
            same = torch.equal(alg.embed(x, y), alg.embed(x, y2))
        assert same is not changes, kind


def test_regularizers_shrink_eta_by_one_minus_two_beta_lambda(store):
    """Spec §7.1 T7: with the data terms zeroed, one SGD server step is eta <- (1 - 2 beta lambda) eta."""
    beta, lam = 0.1, 0.05
    cfg = small_config(**SMALL, lr=1e-30, lambda_h=lam, lambda_v=lam, server_optimizer="sgd", server_lr=beta,
                      server_clip=0.0, local_steps=1)
    alg = PeFLL(cfg, store)
    before = _eta(alg)
    alg.run_round(0, torch.tensor([0, 1]), torch.Generator().manual_seed(0))
    for b, p in zip(before, _eta(alg)):
        torch.testing.assert_close(p, (1 - 2 * beta * lam) * b, rtol=1e-5, atol=1e-7)


def test_predict_generates_models_without_any_optimizer_step(digits_clients):
    """Spec §7.1 T5/T6: generating models for unseen clients takes no step and leaves eta bit-identical."""
    from pfl_cli.fl import PredictConfig, predict_clients, train_federated

    ds, part = digits_clients
    cfg = small_config(**SMALL, rounds=4, eval_every=2, local_steps=3)
    run = train_federated(ds.x, ds.y, ds.num_classes, part, cfg, device="cpu")
    out = predict_clients(run.model, cfg, ds.x, ds.y, ds.num_classes, part, PredictConfig(save_models=True),
                          device="cpu")
    assert out.optimizer_steps == 0 and out.personalized  # the weights themselves: tests/fl/test_api.py
    holdout = np.flatnonzero(part.role == 1)
    assert out.clients.tolist() == holdout.tolist()
    # the same code path as evaluation in training: identical holdout accuracy at the selected round
    assert out.evaluation.correct.tolist() == run.outcome.best.groups["holdout"].correct.tolist()
    assert out.params["fc1.weight"].shape == (len(holdout), 8, 64)
    # statelessness: the server state holds eta (and optimizer state) only, nothing per client
    assert set(run.algorithm.state()) <= {"hypernetwork", "embedding", "optimizer", "descriptor_stats"}


def test_resumed_training_ends_where_the_uninterrupted_run_ends(digits_clients):
    from pfl_cli.fl import train_federated

    ds, part = digits_clients
    cfg = small_config(**SMALL, rounds=8, eval_every=2, local_steps=3, val_fraction=0.2)
    full = train_federated(ds.x, ds.y, ds.num_classes, part, cfg, device="cpu")
    saved = []
    train_federated(ds.x, ds.y, ds.num_classes, part, replace(cfg, rounds=8), device="cpu",
                    on_checkpoint=lambda ck: saved.append(_clone(ck)))
    at4 = next(ck for ck in saved if ck["round"] == 4)
    resumed = train_federated(ds.x, ds.y, ds.num_classes, part, cfg, device="cpu", resume=at4)
    assert resumed.outcome.history == full.outcome.history
    for k, v in full.model["weights"]["hypernetwork"].items():
        assert torch.equal(v, resumed.model["weights"]["hypernetwork"][k])


def _clone(obj):
    import copy

    return copy.deepcopy(obj)


def test_predict_counts_the_local_steps_of_baselines(digits_clients):
    """FedAvg fine-tuning and Local do train at prediction time; only PeFLL reports zero steps."""
    from pfl_cli.fl import PredictConfig, predict_clients, train_federated

    ds, part = digits_clients
    cfg = small_config(algorithm="fedavg", mlp_hidden=8, rounds=2, eval_every=2, local_steps=2)  # an int hidden size
    run = train_federated(ds.x, ds.y, ds.num_classes, part, cfg, device="cpu")
    out = predict_clients(run.model, cfg, ds.x, ds.y, ds.num_classes, part, PredictConfig(finetune_steps=3),
                          device="cpu")
    assert out.optimizer_steps == 3 * 4 and out.personalized  # 4 holdout clients x 3 steps
    plain = predict_clients(run.model, cfg, ds.x, ds.y, ds.num_classes, part, PredictConfig(), device="cpu")
    assert plain.optimizer_steps == 0 and not plain.personalized


def test_communication_per_client_round_is_about_twice_fedavg_on_cifar10():
    """Spec §7.1 T4 / §5: 2(d + |eta_v| + l) = 495,500 floats vs FedAvg's 2d = 242,364 (ratio 2.04)."""
    from pfl_cli.algorithms import FedAvg, Local
    from pfl_cli.models import client_spec, embedding_spec, hyper_spec

    client = client_spec("lenet", (3, 32, 32), 10)
    arch = {"client": client, "embedding": embedding_spec("cnn", (3, 32, 32), 10, 26),
            "hypernetwork": hyper_spec(26, client, "M", 100)}
    pefll, fedavg = PeFLL.floats_per_client_round(arch), FedAvg.floats_per_client_round(arch)
    assert (pefll, fedavg, Local.floats_per_client_round(arch)) == (495_500, 242_364, 0)
    assert 1.9 <= pefll / fedavg <= 2.3
