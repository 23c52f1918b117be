"""FedAS (issue 35): its alignment loss and Fisher trace against slow references, a round against the
per-client loop, new clients, traffic and bad keys.

The round's reference replays the round's draws (alignment batches, local batches, the Fisher pass, in
that order from the same generator) one client at a time with plain torch: class prototypes by a loop,
``torch.nn.MSELoss`` per class and ``torch.optim.SGD`` as the authors' code, ``torch.autograd.grad``
per batch for the Fisher trace.
"""

import pytest
import torch
import torch.nn.functional as F
from torch.func import functional_call

from pfl_cli.algorithms.fedas import alignment_loss, fisher_trace, fisher_weights
from pfl_cli.fl.batches import CohortBatches
from pfl_cli.fl.store import ROLE_HOLDOUT
from pfl_cli.registry import train_config
from baseline_support import alg_factory, assert_config_refused, assert_unknown_key, close, cohort, gen
from pflx_testing import small_config

BASE = small_config(algorithm="fedas", mlp_hidden=(16,), local_steps=4, batch_size=8, lr=0.05, clients_per_round=4,
                    new_client_epochs=1)
alg_for = alg_factory(BASE)


def client_samples(store, client):
    return store.fit.index[client, :int(store.fit.length[client])]


# ----------------------------------------------------------------------------- numeric pieces
def test_alignment_loss_is_the_sum_over_classes_of_torch_mse_to_the_prototype():
    g = torch.Generator().manual_seed(0)
    h = torch.randn(2, 7, 3, generator=g, dtype=torch.float64)
    y = torch.tensor([[0, 2, 2, 1, 0, 2, -1], [4, 4, 4, 1, 1, 0, 0]])
    mask = torch.tensor([[1, 1, 1, 1, 1, 1, 1], [1, 1, 1, 1, 1, 0, 0]], dtype=torch.float64)
    protos = torch.randn(2, 5, 3, generator=g, dtype=torch.float64)
    got = alignment_loss(h, y, mask, protos)
    for i in range(2):
        real = (mask[i] > 0) & (y[i] >= 0)
        want = sum(torch.nn.MSELoss()(h[i][real & (y[i] == c)], protos[i, c].expand(int((real & (y[i] == c)).sum()), 3))
                   for c in y[i][real].unique().tolist())
        assert got[i].item() == pytest.approx(float(want), rel=1e-12)


def test_fisher_trace_is_the_sum_of_squared_batch_gradients(store):
    alg = alg_for(store)
    c = cohort(store)
    g0 = torch.Generator().manual_seed(4)
    params = {k: v.unsqueeze(0).repeat(len(c), *([1] * v.dim())) + 0.1 * torch.randn(len(c), *v.shape, generator=g0)
              for k, v in alg.global_params.items()}
    batches = CohortBatches(store.fit, c, None, 8, gen(), epochs=1)
    got = fisher_trace(alg.net, params, store, batches)
    index, mask, active = batches.materialize()
    for i in range(len(c)):
        p = {k: v[i].clone().requires_grad_(True) for k, v in params.items()}
        want = 0.0
        for s in range(index.shape[1]):
            if active is not None and not active[i, s]:
                continue
            real = mask[i, s] > 0
            out = functional_call(alg.net, p, (store.inputs(index[i, s][real]),))
            nll = -F.log_softmax(out, dim=1)[torch.arange(int(real.sum())), store.y[index[i, s][real]]].mean()
            want += sum(float((gr ** 2).sum()) for gr in torch.autograd.grad(nll, list(p.values())))
        assert got[i].item() == pytest.approx(want, rel=1e-5)


def test_fisher_weights_normalize_and_fall_back_to_sizes():
    torch.testing.assert_close(fisher_weights(torch.tensor([1.0, 3.0]), torch.tensor([5, 5])),
                               torch.tensor([0.25, 0.75], dtype=torch.float64))
    torch.testing.assert_close(fisher_weights(torch.zeros(2), torch.tensor([1, 3])),
                               torch.tensor([0.25, 0.75], dtype=torch.float64))


# ----------------------------------------------------------------------------- the round
def test_fedas_round_equals_the_per_client_loop(store):
    alg = alg_for(store, momentum=0.0, client_clip=0.0, lambda_theta=0.0, fedas_align_lr=0.05)
    c = cohort(store)
    # distinct previous local models (the round aligns the global body to their prototypes)
    g0 = torch.Generator().manual_seed(3)
    alg.private.scatter(c, {k: v + 0.3 * torch.randn(v.shape, generator=g0) for k, v in alg.private.gather(c).items()})
    local = alg.private.gather(c)
    glob = {k: v.clone() for k, v in alg.global_params.items()}
    g = gen()
    align = CohortBatches(store.fit, c, None, 16, g, epochs=1).materialize()
    train = CohortBatches(store.fit, c, alg.cfg.local_steps, alg.cfg.batch_size, g).materialize()
    fim_b = CohortBatches(store.fit, c, None, alg.cfg.batch_size, g, epochs=1).materialize()
    body, cfg = alg.body, alg.cfg
    feats = lambda p, x: F.relu(F.linear(x.flatten(1), p["fc1.weight"], p["fc1.bias"]))  # noqa: E731
    refs, fims = [], []
    for i, client in enumerate(c.tolist()):
        xs, ys = store.inputs(client_samples(store, client)), store.y[client_samples(store, client)]
        with torch.no_grad():
            h_local = feats({k: local[k][i] for k in body}, xs)
        protos = {cls: h_local[ys == cls].mean(0) for cls in ys.unique().tolist()}
        p = {k: glob[k].clone().requires_grad_(k in body) for k in glob}
        opt = torch.optim.SGD([p[k] for k in body], lr=0.05)
        for s in range(align[0].shape[1]):
            if align[2] is not None and not align[2][i, s]:
                continue
            real = align[1][i, s] > 0
            x, y = store.inputs(align[0][i, s][real]), store.y[align[0][i, s][real]]
            h = feats(p, x)
            loss = sum(torch.nn.MSELoss()(h[y == cls], protos[cls].expand(int((y == cls).sum()), -1))
                       for cls in y.unique().tolist())
            opt.zero_grad()
            loss.backward()
            opt.step()
        p = {**{k: p[k].detach().clone() for k in body}, **{k: local[k][i].clone() for k in alg.head}}
        p = {k: v.requires_grad_(True) for k, v in p.items()}
        opt = torch.optim.SGD(list(p.values()), lr=cfg.lr)
        for s in range(train[0].shape[1]):
            real = train[1][i, s] > 0
            x, y = store.inputs(train[0][i, s][real]), store.y[train[0][i, s][real]]
            loss = F.cross_entropy(functional_call(alg.net, p, (x,)), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
        fim = 0.0
        for s in range(fim_b[0].shape[1]):
            if fim_b[2] is not None and not fim_b[2][i, s]:
                continue
            real = fim_b[1][i, s] > 0
            x, y = store.inputs(fim_b[0][i, s][real]), store.y[fim_b[0][i, s][real]]
            nll = F.cross_entropy(functional_call(alg.net, p, (x,)), y)
            fim += sum(float((gr ** 2).sum()) for gr in torch.autograd.grad(nll, list(p.values())))
        refs.append({k: v.detach() for k, v in p.items()})
        fims.append(fim)
    alg.run_round(0, c, gen())
    w = torch.tensor(fims) / sum(fims)
    close(alg.global_params, {k: sum(float(w[i]) * refs[i][k] for i in range(len(c))) for k in body})
    close(alg.global_params, {k: glob[k] for k in alg.head})  # the global head is never trained
    close(alg.private.gather(c), {k: torch.stack([r[k] for r in refs]) for k in refs[0]})


def test_exchange_is_the_body_each_way_and_the_fisher_trace_up(store):
    alg = alg_for(store)
    c = cohort(store)
    alg.run_round(0, c, gen())
    alg.traffic.close_round(len(c))
    ex = alg.exchanged()
    assert ex["up"]["fisher_trace"] == 1
    total = sum(ex["down"].values()) + sum(ex["up"].values())
    assert total == alg.floats_per_client_round(alg.arch) == 2 * (64 * 16 + 16) + 1


def test_train_clients_use_their_model_and_new_clients_train_the_initial_head(store):
    alg = alg_for(store, new_client_epochs=2)
    c = cohort(store)
    alg.run_round(0, c, gen())
    own, personalized = alg.personalize(c.numpy(), gen(1))
    assert personalized and alg.client_sgd_steps == 0
    close(own, alg.private.gather(c))
    holdout = store.clients(ROLE_HOLDOUT)[:3]
    new, _ = alg.personalize(holdout, gen(2))
    assert alg.client_sgd_steps > 0
    for k in alg.body:
        torch.testing.assert_close(new[k], alg.global_params[k].expand_as(new[k]))
    for k in alg.head:
        assert not torch.allclose(new[k][0], alg.init_head[k])
    zero = alg_for(store, new_client_epochs=0)
    served, _ = zero.personalize(holdout, gen())
    close(served, {k: v.expand(3, *v.shape) for k, v in {**zero.global_params}.items()})


def test_no_alignment_keeps_the_global_body(store):
    alg = alg_for(store, fedas_align_epochs=0)
    c = cohort(store)
    glob = {k: v.expand(len(c), *v.shape) for k, v in alg.global_params.items() if k in alg.body}
    assert alg.align(glob, alg.private.gather(c), c, gen()) is glob


@pytest.mark.parametrize("opts,message", [
    ({"fedas_align_lr": 0.0}, "fedas_align_lr must be a finite number > 0 for fedas; got 0.0"),
    ({"fedas_align_lr": -1.0}, "fedas_align_lr must be a finite number > 0 for fedas; got -1.0"),
    ({"fedas_align_epochs": -1}, "fedas_align_epochs must be an integer >= 0 for fedas; got -1"),
    ({"fedas_align_batch": 0}, "fedas_align_batch must be an integer >= 1 for fedas; got 0"),
    ({"new_client_epochs": -1}, "new_client_epochs must be an integer >= 0"),
])
def test_bad_values_are_refused_naming_the_key(opts, message):
    assert_config_refused("fedas", opts, message)


def test_a_key_of_another_algorithm_is_refused_with_did_you_mean():
    assert_unknown_key("fedas", "fedas_align_rate", ".*did you mean 'fedas_align_lr'")
    assert_unknown_key("fedas", "fedcp_lambda")


def test_defaults_are_the_authors():
    cfg = train_config("fedas")
    assert (cfg.fedas_align_lr, cfg.fedas_align_epochs, cfg.fedas_align_batch, cfg.new_client_epochs) == (0.01, 1,
                                                                                                          16, 20)
