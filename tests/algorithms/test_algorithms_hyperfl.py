"""HyperFL (spec D.1 items 1, 9, 10): step order, what is uploaded, weighted averaging, private state, new clients."""

import numpy as np
import pytest
import torch

from pfl_cli.algorithms import HyperFL
from pfl_cli.algorithms.base import stack
from pfl_cli.errors import InputError
from pflx_testing import small_config
from pfl_cli.fl.store import build_store
from pfl_cli.rng import make_rng

SMALL = dict(algorithm="hyperfl", mlp_hidden=(8,), hyper_hidden=16, batch_size=16, lr=0.05, momentum=0.5,
             local_epochs=2, clients_per_round=4)


@pytest.fixture(scope="module")
def store(digits_clients):
    ds, part = digits_clients
    return build_store(ds.x, ds.y, ds.num_classes, part, val_fraction=0.0, rng=make_rng(0, "v"), device="cpu")


def _hn(alg):
    return {k: p.detach().clone() for k, p in alg.hnet.named_parameters()}


def test_architecture_embedding_dim_and_split(store):
    alg = HyperFL(small_config(**SMALL), store)
    assert alg.hnet.in_dim == 64 and alg.names == ["fc1.weight", "fc1.bias"]
    assert alg.head_names == ["fc2.weight", "fc2.bias"]
    assert isinstance(alg.hnet.body[-1], torch.nn.ReLU) and len(alg.hnet.body) == 2  # Linear(64, h) -> ReLU
    v = alg.private.gather(torch.arange(20))["embedding"]
    assert torch.equal(v, v[:1].expand_as(v))  # every client starts from the same embedding (App. D.2)


def test_step_order_classifier_then_generator(store):
    """D.1 item 10: step 1 changes only the classifier; step 2 leaves it bit-identical."""
    alg = HyperFL(small_config(**SMALL), store)
    cohort = torch.tensor([1, 6])
    private = alg.private.gather(cohort)
    v, head = private["embedding"], {k: private[k] for k in alg.head_names}
    phi0, v0 = _hn(alg), v.clone()
    head1, _ = alg.step_classifier(cohort, v, head, torch.Generator().manual_seed(0))
    assert all(torch.equal(phi0[k], p) for k, p in _hn(alg).items()) and torch.equal(v, v0)
    assert not torch.equal(head1["fc2.weight"], head["fc2.weight"])
    frozen = {k: t.clone() for k, t in head1.items()}
    phi, v1, _ = alg.step_generator(cohort, stack(dict(alg.hnet.named_parameters()), 2), v, head1,
                                    torch.Generator().manual_seed(1), 1)
    assert all(torch.equal(frozen[k], head1[k]) for k in frozen)
    assert not torch.equal(v1, v0) and not torch.equal(phi["heads.0.weight"][0], phi0["heads.0.weight"])


def test_only_step_two_is_clipped(store):
    """B.3 (the code): clip_grad_norm_(..., 50) sits in step 2 alone; the classifier's step 1 is never clipped."""
    tiny, off = (HyperFL(small_config(**{**SMALL, "client_clip": c, "lambda_theta": 0.0}), store) for c in (1e-6, 0.0))
    cohort = torch.tensor([1, 6])
    private = tiny.private.gather(cohort)
    v, head = private["embedding"], {k: private[k] for k in tiny.head_names}
    heads = [alg.step_classifier(cohort, v, head, torch.Generator().manual_seed(0))[0] for alg in (tiny, off)]
    assert all(torch.equal(heads[0][k], heads[1][k]) for k in heads[0])  # step 1: the clip changes nothing
    steps = [alg.step_generator(cohort, stack(dict(alg.hnet.named_parameters()), 2), v, heads[0],
                                torch.Generator().manual_seed(1), 1) for alg in (tiny, off)]
    moved = [float((s[1] - v).abs().max()) for s in steps]
    assert 0 < moved[0] < 1e-6 < 1e-3 < moved[1]  # step 2: a 1e-6 clip holds each embedding step to lr * 1e-6


def test_round_uploads_the_hypernetwork_only_and_averages_by_client_size(store):
    """D.1 item 9: upload keys == the HN's; phi = sum n_i phi_i / sum n_j; embeddings differ after the round."""
    alg = HyperFL(small_config(**SMALL), store)
    uploads = {}
    aggregate = alg.aggregate

    def spy(cohort, phi):
        uploads.update(phi=phi, cohort=cohort)
        aggregate(cohort, phi)

    alg.aggregate = spy
    cohort = torch.tensor([0, 3, 8, 11])
    alg.run_round(0, cohort, torch.Generator().manual_seed(2))
    alg.traffic.close_round(len(cohort))  # the round loop's part
    keys = {k for k, _ in alg.hnet.named_parameters()}
    assert {k.removeprefix("hypernetwork.") for k in alg.traffic.up} == keys == set(uploads["phi"])
    assert set(alg.traffic.down) == set(alg.traffic.up)  # the same hypernetwork comes down
    n = store.fit.length[cohort].double()
    for k, p in alg.hnet.named_parameters():
        expected = (uploads["phi"][k].double() * (n / n.sum()).view(-1, *[1] * p.dim())).sum(0)
        torch.testing.assert_close(p.detach().double(), expected, rtol=1e-5, atol=1e-6)
    v = alg.private.gather(cohort)["embedding"]
    assert all(not torch.equal(v[0], v[i]) for i in range(1, 4))
    assert alg.has_state(cohort.numpy()).all() and not alg.has_state(np.array([1, 2])).any()
    # one message size: the hypernetwork, per participant, each way
    floats = sum(p.numel() for p in alg.hnet.parameters())
    s = alg.traffic.summary()
    assert s["floats_down_per_client_round"] == s["floats_up_per_client_round"] == floats


def test_last_round_takes_every_client(store):
    alg = HyperFL(small_config(**SMALL), store)
    assert [alg.cohort_size(t, 5, 16) for t in range(5)] == [4, 4, 4, 4, 16]


def test_a_net_without_a_feature_extractor_is_refused(store):
    with pytest.raises(InputError, match="a feature extractor before the classifier is needed"):
        HyperFL(small_config(**{**SMALL, "mlp_hidden": ()}), store)


def test_new_clients_keep_the_global_hypernetwork_and_train_locally(digits_clients):
    from pfl_cli.fl.checkpoint import torch_bytes
    from pfl_cli.fl import PredictConfig, predict_clients, train_federated

    ds, part = digits_clients
    cfg = small_config(**SMALL, rounds=6, eval_every=6)
    run = train_federated(ds.x, ds.y, ds.num_classes, part, cfg, device="cpu")
    frozen = torch_bytes(run.model["weights"])
    out = predict_clients(run.model, cfg, ds.x, ds.y, ds.num_classes, part, PredictConfig(local_epochs=3),
                          device="cpu")
    assert torch_bytes(run.model["weights"]) == frozen
    n = run.store.fit.length[torch.as_tensor(run.store.clients(1))]
    assert out.optimizer_steps == 3 * 2 * int(torch.ceil(n / 16).sum())  # 3 x (classifier + embedding epoch)
    assert out.protocol["new_clients"] == 4 and "frozen" in out.protocol["protocol"]
    train = predict_clients(run.model, cfg, ds.x, ds.y, ds.num_classes, part, PredictConfig(clients="train"),
                            device="cpu")
    assert train.optimizer_steps == 0 and train.protocol["new_clients"] == 0  # the last round took everyone
    best = run.outcome.best.groups["train"]
    assert np.array_equal(train.evaluation.correct, best.correct)


def assert_resume_ends_where_the_run_ends(ds, part, cfg):
    """Train, then resume from the first checkpoint: same history, byte-identical model. Returns the full run."""
    import io

    from pfl_cli.fl.checkpoint import torch_bytes
    from pfl_cli.fl import train_federated

    saved = []
    full = train_federated(ds.x, ds.y, ds.num_classes, part, cfg, device="cpu",
                           on_checkpoint=lambda ck: saved.append(torch_bytes(ck)))
    resumed = train_federated(ds.x, ds.y, ds.num_classes, part, cfg, device="cpu",
                              resume=torch.load(io.BytesIO(saved[0]), weights_only=True))
    assert resumed.outcome.history == full.outcome.history
    assert torch_bytes(resumed.model) == torch_bytes(full.model)
    return full


def test_resumed_training_ends_where_the_uninterrupted_run_ends(digits_clients):
    ds, part = digits_clients
    assert_resume_ends_where_the_run_ends(ds, part, small_config(**SMALL, rounds=5, eval_every=2, val_fraction=0.2))


@pytest.mark.parametrize("shape,features", [((3, 32, 32), 106_400), ((1, 28, 28), 115_776)])
def test_the_papers_cnns_train_through_the_generated_convolutions(shape, features):
    """B.4: the CIFAR CNN (3 convolutions) and the (E)MNIST CNN (2), LeakyReLU, fc2 as the classifier."""
    from pfl_cli.fl import train_federated
    from pfl_cli.partition import PartitionConfig, partition_labels

    rng = np.random.default_rng(0)
    x = rng.integers(0, 255, size=(80, *shape), dtype=np.uint8)
    y = np.repeat(np.arange(4), 20)
    part = partition_labels(y, PartitionConfig(scheme="iid", num_clients=4, test_fraction=0.25), num_classes=4,
                            rng=make_rng(0, "p"))
    cfg = small_config(algorithm="hyperfl", model_arch="hyperfl-cnn", hyper_hidden=4, rounds=1, eval_every=1,
                      local_epochs=1, batch_size=8, val_fraction=0.0)
    run = train_federated(x, y, 4, part, cfg, device="cpu")
    alg = run.algorithm
    assert alg.head_names == ["fc2.weight", "fc2.bias"]
    assert sum(t.numel() for k, t in alg.net.named_parameters() if k in alg.names) == features
    assert np.isfinite(run.outcome.best.summaries()["train"]["loss"])
    init = HyperFL(cfg, alg.store).hnet.state_dict()  # the same seeded initialization
    assert all(not torch.equal(init[k], v) for k, v in alg.hnet.state_dict().items())
