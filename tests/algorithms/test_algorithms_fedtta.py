"""FedTTA ([YCW+24], the thesis's §5.6 baseline): ARM-LL's learned loss in a FedAvg round."""

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from pfl_cli.algorithms import FedTTA
from pfl_cli.algorithms.fedtta import adaptation_loss
from pfl_cli.fl.store import build_store
from pflx_testing import replace, small_config

SMALL = dict(algorithm="fedtta", mlp_hidden=(8,), batch_size=10, local_steps=1, lr=0.1, momentum=0.0,
             client_clip=0.0, adapt_lr=0.5, adapt_hidden=6)


@pytest.fixture(scope="module")
def store(digits_clients):
    """The digits clients with clients 0-5 unlabeled."""
    ds, part = digits_clients
    labeled = np.ones(part.num_clients, dtype=np.uint8)
    labeled[:6] = 0
    return build_store(ds.x, ds.y, ds.num_classes, replace(part, labeled=labeled), val_fraction=0.0, rng=None,
                       device="cpu")


def _net_logits(alg, theta, x):
    return torch.func.functional_call(alg.net, theta, (x,))


def _reference_adapt(alg, theta, phi, x, alpha, scale=1.0):
    """One adaptation step for one client, written out: theta - alpha grad ||phi(f(x; theta))||_2."""
    out = torch.func.functional_call(alg.adapt_net, phi, (_net_logits(alg, theta, x),))
    loss = scale * torch.sqrt(sum(o[0] ** 2 for o in out))
    grads = torch.autograd.grad(loss, list(theta.values()), create_graph=True)
    return {k: v - alpha * g for (k, v), g in zip(theta.items(), grads)}


def test_the_adaptation_loss_is_the_norm_of_phi_over_the_real_samples():
    out = torch.tensor([[[3.0], [4.0], [100.0]], [[1.0], [0.0], [0.0]]])
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 1.0, 1.0]])
    torch.testing.assert_close(adaptation_loss(out, mask), torch.tensor([5.0, 1.0]))
    torch.testing.assert_close(adaptation_loss(out, mask, torch.tensor([2.0, 0.5])), torch.tensor([10.0, 0.5]))


def test_a_local_step_is_the_arm_ll_meta_step_of_a_slow_reference(store):
    """theta and phi move against the cross-entropy of the *adapted* model (second-order through the step)."""
    alg = FedTTA(small_config(**SMALL), store)
    cohort = torch.tensor([7, 9])
    batches, _ = alg.draw_batches(cohort, torch.Generator().manual_seed(0), steps=1)
    (index, mask, _), = list(batches)
    start = {**{f"theta.{k}": v.unsqueeze(0).repeat(2, *[1] * v.dim()) for k, v in alg.global_params.items()},
             **{f"phi.{k}": v.unsqueeze(0).repeat(2, *[1] * v.dim()) for k, v in alg.phi.items()}}
    new, loss = alg._local_steps(start, batches)
    for j in range(2):
        real = mask[j] > 0
        x, y = store.inputs(index[j][real]), store.y[index[j][real]]
        theta = {k: v.clone().requires_grad_(True) for k, v in alg.global_params.items()}
        phi = {k: v.clone().requires_grad_(True) for k, v in alg.phi.items()}
        adapted = _reference_adapt(alg, theta, phi, x, 0.5)
        ce = F.cross_entropy(_net_logits(alg, adapted, x), y)
        grads = torch.autograd.grad(ce, [*theta.values(), *phi.values()])
        assert abs(float(loss[j]) - float(ce.detach())) < 1e-5
        for (k, v), g in zip([*(("theta." + k, v) for k, v in theta.items()), *(("phi." + k, v) for k, v in phi.items())],
                             grads):
            torch.testing.assert_close(new[k][j], (v - 0.1 * g).detach(), rtol=1e-4, atol=1e-6)
        assert any(not torch.equal(new[f"phi.{k}"][j], alg.phi[k]) for k in alg.phi)  # phi does learn


def test_a_new_client_adapts_on_its_unlabeled_samples_and_reads_no_labels(store):
    from pfl_cli.fl.api import count_optimizer_steps

    alg = FedTTA(small_config(**SMALL), store)
    alg.run_round(0, torch.tensor([7, 8, 9]), torch.Generator().manual_seed(1))
    clients = np.array([0, 1, 8])
    with count_optimizer_steps() as steps:
        params, personalized = alg.personalize(clients, None)
    assert personalized and not alg.needs_labels_to_predict and steps[0] == 0 and alg.client_sgd_steps == 3
    for j, c in enumerate(clients):
        idx = store.fit.index[c, :store.fit.length[c]]
        theta = {k: v.clone().requires_grad_(True) for k, v in alg.global_params.items()}
        ref = _reference_adapt(alg, theta, alg.phi, store.inputs(idx), 0.5, scale=(10 / len(idx)) ** 0.5)
        for k in params:
            torch.testing.assert_close(params[k][j], ref[k].detach(), rtol=1e-4, atol=1e-6)
        assert any(not torch.allclose(params[k][j], alg.global_params[k]) for k in params)
    # the same models when every label is hidden: the protocol never reads one
    saved = store.y.clone()
    try:
        store.y[:] = -1
        again, _ = alg.personalize(clients, None)
    finally:
        store.y.copy_(saved)
    assert all(torch.equal(again[k], params[k]) for k in params)


def test_a_resumed_run_ends_with_the_same_classifier_and_adaptation_model(digits_clients):
    from pfl_cli.fl import train_federated

    ds, part = digits_clients
    cfg = small_config(**SMALL, rounds=4, eval_every=2, val_fraction=0.2)
    checkpoints = []
    whole = train_federated(ds.x, ds.y, ds.num_classes, part, cfg, device="cpu", on_checkpoint=checkpoints.append)
    again = train_federated(ds.x, ds.y, ds.num_classes, part, cfg, device="cpu", resume=checkpoints[0])
    assert checkpoints[0]["round"] == 2 and again.outcome.history == whole.outcome.history
    for part_name in ("client", "adapt"):  # theta and phi
        a, b = whole.model["weights"][part_name], again.model["weights"][part_name]
        assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
