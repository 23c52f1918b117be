"""train_federated / predict_clients: what predict really does to the weights, and PeFLL's server rule."""


import numpy as np
import pytest
import torch

from pfl_cli.algorithms import PeFLL
from pfl_cli.fl import PredictConfig, predict_clients, train_federated
from pflx_testing import replace, small_config
from pfl_cli.fl.api import count_optimizer_steps

SMALL = dict(algorithm="pefll", mlp_hidden=(8,), hyper_hidden=16, embed_dim=4, descriptor_batch=8, batch_size=8,
             local_steps=3)


def _state(alg):
    return {**{f"h.{k}": v.detach().clone() for k, v in alg.hnet.state_dict().items()},
            **{f"e.{k}": v.detach().clone() for k, v in alg.embed.state_dict().items()}}


@pytest.fixture(scope="module")
def trained(digits_clients):
    ds, part = digits_clients
    cfg = small_config(**SMALL, rounds=4, eval_every=2)
    return cfg, train_federated(ds.x, ds.y, ds.num_classes, part, cfg, device="cpu")


def test_predict_takes_no_optimizer_step_and_leaves_the_weights_it_predicts_from(digits_clients, trained):
    """Spec §7.1 T5/T6 on the algorithm predict itself built: zero steps, its eta bit-identical to model.pt."""
    ds, part = digits_clients
    cfg, run = trained
    out = predict_clients(run.model, cfg, ds.x, ds.y, ds.num_classes, part, PredictConfig(), device="cpu")
    assert out.optimizer_steps == 0
    saved = run.model["weights"]
    after = _state(out.algorithm)
    expected = {**{f"h.{k}": v for k, v in saved["hypernetwork"].items()},
                **{f"e.{k}": v for k, v in saved["embedding"].items()}}
    assert after.keys() == expected.keys()
    assert all(torch.equal(after[k], expected[k]) for k in expected)
    assert torch.equal(out.algorithm.desc_stats, saved["descriptor_stats"])


def test_a_step_taken_while_predicting_is_counted_and_changes_the_weights(digits_clients, trained, monkeypatch):
    """The observation above can fail: an algorithm that steps its optimizer in personalize() is caught."""
    ds, part = digits_clients
    cfg, run = trained
    honest = PeFLL.personalize

    def stepping(self, clients, gen):
        self.opt.zero_grad()
        for p in self.hnet.parameters():
            p.grad = torch.ones_like(p)
        self.opt.step()
        return honest(self, clients, gen)

    monkeypatch.setattr(PeFLL, "personalize", stepping)
    out = predict_clients(run.model, cfg, ds.x, ds.y, ds.num_classes, part, PredictConfig(), device="cpu")
    assert out.optimizer_steps == 1  # one chunk of holdout clients, one step
    saved = run.model["weights"]["hypernetwork"]
    assert not all(torch.equal(v, saved[k]) for k, v in out.algorithm.hnet.state_dict().items())


def test_the_step_counter_counts_every_torch_optimizer():
    p = torch.nn.Parameter(torch.ones(2))
    opts = [torch.optim.SGD([p], lr=0.1), torch.optim.Adam([p], lr=0.1)]
    with count_optimizer_steps() as steps:
        for opt in opts:
            p.grad = torch.ones(2)
            opt.step()
    p.grad = torch.ones(2)
    opts[0].step()  # outside the block: not counted
    assert steps[0] == 2


def test_server_optimizer_sgd_is_algorithm_8s_rule_by_default(digits_clients):
    """--set server_optimizer=sgd: step size 1 on the averaged update and no clip, unless set."""
    from pfl_cli.fl.store import build_store
    from pfl_cli.rng import make_rng

    ds, part = digits_clients
    store = build_store(ds.x, ds.y, ds.num_classes, part, val_fraction=0.0, rng=make_rng(0, "v"), device="cpu")
    base = small_config(**SMALL, server_optimizer="sgd", lr=0.5)
    implicit = PeFLL(base, store)
    explicit = PeFLL(replace(base, server_lr=1.0, server_clip=0.0), store)
    clipped = PeFLL(replace(base, server_clip=1e-3), store)
    assert implicit.opt.param_groups[0]["lr"] == 1.0 and implicit.server_clip == 0.0
    adam = PeFLL(replace(base, server_optimizer="adam"), store)
    assert adam.opt.param_groups[0]["lr"] == 2e-4 and adam.server_clip == 50.0
    cohort = torch.tensor([0, 3, 7])
    before = _state(implicit)
    for alg in (implicit, explicit, clipped):
        alg.run_round(0, cohort, torch.Generator().manual_seed(5))
    a, b, c = _state(implicit), _state(explicit), _state(clipped)
    assert all(torch.equal(a[k], b[k]) for k in a)
    # the step is large (step size 1 on the averaged delta), and a set clip still applies
    moved = torch.sqrt(sum(((a[k] - before[k]) ** 2).sum() for k in a if k.endswith("weight")))
    moved_clipped = torch.sqrt(sum(((c[k] - before[k]) ** 2).sum() for k in c if k.endswith("weight")))
    assert moved > 1e-2 and moved_clipped <= 1e-3 * 1.01 + 1e-6


@pytest.mark.parametrize("num_clients,embed_dim", [(3, 0), (12, 1)])
def test_a_descriptor_of_dimension_one_trains_without_nan(num_clients, embed_dim):
    """l = int(1 + 3/4) = 1 for a 3-client partition, or --embed-dim 1: the standardization's std is undefined."""
    from pfl_cli.data import load_dataset
    from pfl_cli.partition import PartitionConfig, partition_labels
    from pfl_cli.rng import make_rng

    ds = load_dataset("builtin:digits")
    part = partition_labels(ds.y, PartitionConfig(scheme="iid", num_clients=num_clients, test_fraction=0.3),
                            num_classes=10, rng=make_rng(0, "partition"))
    cfg = small_config(**{**SMALL, "embed_dim": embed_dim}, rounds=3, eval_every=3, clients_per_round=3)
    run = train_federated(ds.x, ds.y, ds.num_classes, part, cfg, device="cpu")
    assert run.model["arch"]["hypernetwork"]["in_dim"] == 1
    assert all(torch.isfinite(v).all() for v in run.model["weights"]["hypernetwork"].values())
    summary = run.outcome.best.summaries()["train"]
    assert np.isfinite(summary["loss"]) and np.isfinite(summary["mean_accuracy"])
