"""FedBABU, FedRoD, FedBN, FedALA, FedDBE, GPFL and pFedLA (issue 35): their rounds against per-client references, resume, new clients, bad keys.

Each reference replays a round's random draws (same generator seed) one client at a time with
plain torch (``torch.optim.SGD`` or hand-written steps) and compares the batched result.
"""

import dataclasses

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch.func import functional_call

from pfl_cli.fl.batches import CohortBatches, sample_batches
from pfl_cli.fl.cohort import local_sgd_reference
from pfl_cli.fl.split import split_names
from pfl_cli.fl.store import ROLE_TRAIN
from pfl_cli.registry import entries, train_config
from baseline_support import TOL, alg_factory, assert_config_refused, assert_unknown_key, close, cohort, gen
from pflx_testing import replace, small_config

NAMES = ("fedbabu", "fedrod", "fedbn", "fedala", "feddbe", "gpfl", "pfedla")
BASE = small_config(mlp_hidden=(16,), local_steps=4, batch_size=8, lr=0.05, clients_per_round=4, new_client_epochs=1,
                    finetune_epochs=1, ala_max_start_epochs=6, ala_num_pre_loss=3, pfedla_hidden=16,
                    pfedla_embed_dim=8)
alg_for = alg_factory(BASE)


def mean(store, clients, theta, *, whole_train_split=False):
    w = (store.fit.length + store.val.length if whole_train_split else store.fit.length)[clients].double()
    w = w / w.sum()
    return {k: sum(float(w[i]) * v[i] for i in range(len(clients))) for k, v in theta.items()}


def flat(tree, prefix=""):
    for k, v in tree.items():
        yield from flat(v, f"{prefix}{k}/") if isinstance(v, dict) else [(prefix + k, v)]


# ----------------------------------------------------------------------------- FedBABU
@pytest.mark.slow  # default-tier budget (2026-11-29): minutes-long or a learning run
def test_fedbabu_round_trains_and_averages_the_body_and_never_moves_the_head(store):
    alg = alg_for(store, algorithm="fedbabu", momentum=0.0, client_clip=0.0)
    c = cohort(store)
    start = {k: v.clone() for k, v in alg.global_params.items()}
    body, head = split_names(alg.net, "fedbabu")
    g = gen()
    index, mask = sample_batches(store.fit, c, alg.cfg.local_steps, alg.cfg.batch_size, gen())
    alg.run_round(0, c, g)
    stacked = {k: v.unsqueeze(0).repeat(len(c), *([1] * v.dim())) for k, v in start.items()}
    ref = local_sgd_reference(alg.net, {k: stacked[k] for k in body}, store, index, mask,
                              fixed={k: stacked[k] for k in head}, **alg.sgd_options())[0]
    close(alg.global_params, mean(store, c, ref))
    for k in head:
        assert torch.equal(alg.global_params[k], start[k]), k


def test_fedbabu_personalizes_every_client_by_fine_tuning_body_and_head(store):
    alg = alg_for(store, algorithm="fedbabu", finetune_epochs=2)
    alg.run_round(0, cohort(store), gen())
    clients = store.clients(ROLE_TRAIN)[:3]
    params, personalized = alg.personalize(clients, gen(3))
    assert personalized and alg.client_sgd_steps > 0
    _, head = split_names(alg.net, "fedbabu")
    for k in alg.global_params:  # the whole net moved, the head included
        assert not torch.equal(params[k][0], alg.global_params[k]), k
    alg0 = alg_for(store, algorithm="fedbabu", finetune_epochs=0)
    assert alg0.personalize(clients, gen())[1] is False and not alg0.needs_labels_to_predict


# ----------------------------------------------------------------------------- FedRoD
def _rod_reference(alg, start, clients, g, steps):
    """One client at a time: BSM on the generic predictor, CE(g.detach() + p) on the personalized head."""
    batches = CohortBatches(alg.store.fit, clients, steps, alg.cfg.batch_size, g)
    index, mask, _ = batches.materialize()
    cfg = alg.cfg
    out = {k: [] for k in start}
    for i, client in enumerate(clients.tolist()):
        y_all = alg.store.y[alg.store.fit.index[client, :int(alg.store.fit.length[client])]]
        counts = torch.bincount(y_all, minlength=alg.store.num_classes).float()
        prior = torch.where(counts > 0, counts.clamp_min(1).log(), torch.full_like(counts, -1e4))
        p = {k: v[i].clone().requires_grad_(True) for k, v in start.items()}
        gen_names = [k for k in p if k.startswith("net.")]
        per_names = [k for k in p if k.startswith("personal.")]
        opt_g = torch.optim.SGD([p[k] for k in gen_names], lr=cfg.lr, momentum=cfg.momentum)
        opt_p = torch.optim.SGD([p[k] for k in per_names], lr=cfg.lr, momentum=cfg.momentum)
        for s in range(index.shape[1]):
            real = mask[i, s] > 0
            x, y = alg.store.inputs(index[i, s][real]), alg.store.y[index[i, s][real]]
            gl, pl = functional_call(alg.net, p, (x,), {"parts": True})
            opt_g.zero_grad(), opt_p.zero_grad()
            F.cross_entropy(gl + prior, y).backward(retain_graph=True)
            torch.nn.utils.clip_grad_norm_([p[k] for k in gen_names], cfg.client_clip)
            F.cross_entropy(gl.detach() + pl, y).backward()
            torch.nn.utils.clip_grad_norm_([p[k] for k in per_names], cfg.client_clip)
            opt_g.step(), opt_p.step()
        for k in out:
            out[k].append(p[k].detach())
    return {k: torch.stack(v) for k, v in out.items()}


def test_fedrod_round_equals_the_two_optimizer_per_client_loop(store):
    alg = alg_for(store, algorithm="fedrod", client_clip=0.5)
    c = cohort(store)
    start = {**{k: v.unsqueeze(0).repeat(len(c), *([1] * v.dim())) for k, v in alg.global_params.items()},
             **alg.private.gather(c)}
    ref = _rod_reference(alg, start, c, gen(), alg.cfg.local_steps)
    alg.run_round(0, c, gen())
    close(alg.global_params, mean(store, c, {k: ref[k] for k in alg.global_params}))
    close(alg.private.gather(c), {k: ref[k] for k in alg.personal})
    # the personalized prediction is generic logits + personalized logits
    x = store.inputs(store.test.index[int(c[0]), :3])
    params = {k: v[0] for k, v in alg.own_models(c[:1]).items()}
    gl, pl = functional_call(alg.net, params, (x,), {"parts": True})
    torch.testing.assert_close(functional_call(alg.net, params, (x,)), gl + pl)


def test_fedrod_new_clients_train_only_the_personalized_head(store):
    alg = alg_for(store, algorithm="fedrod", new_client_epochs=2)
    alg.run_round(0, cohort(store), gen())
    new = store.clients(1)[:2]
    params, personalized = alg.personalize(new, gen(1))
    assert personalized and alg.client_sgd_steps > 0
    for k in alg.generic:
        assert torch.equal(params[k][0], alg.global_params[k]), k
    assert not torch.equal(params["personal.weight"][0], alg.init_personal["personal.weight"])


def test_fedrod_refuses_a_net_without_a_feature_extractor():
    from pfl_cli.errors import InputError
    from pfl_cli.fl.heads import TwoHeadNet

    with pytest.raises(InputError, match="^model_arch: a second head needs a client net with a feature extractor"):
        TwoHeadNet(torch.nn.Linear(4, 2))


# ----------------------------------------------------------------------------- FedBN
def _torch_bn_mlp(net):
    """The same MLP-BN built from torch.nn.BatchNorm1d (the obviously correct reference)."""
    ref = torch.nn.Module()
    for i in range(1, net.num_layers + 1):
        fc = getattr(net, f"fc{i}")
        setattr(ref, f"fc{i}", torch.nn.Linear(fc.in_features, fc.out_features))
        if i < net.num_layers:
            setattr(ref, f"bn{i}", torch.nn.BatchNorm1d(fc.out_features))

    def forward(x):
        x = torch.flatten(x, 1)
        for i in range(1, net.num_layers):
            x = F.relu(getattr(ref, f"bn{i}")(getattr(ref, f"fc{i}")(x)))
        return getattr(ref, f"fc{net.num_layers}")(x)

    ref.forward = forward
    return ref


def test_batchnorm_layer_equals_torch_batchnorm_in_training_and_eval():
    from pfl_cli.models.normalized import BatchNorm

    torch.manual_seed(0)
    for shape, ref in (((6, 4), torch.nn.BatchNorm1d(4)), ((6, 3, 5, 5), torch.nn.BatchNorm2d(3))):
        ours = BatchNorm(shape[1])
        with torch.no_grad():
            for m in (ours, ref):
                m.weight.copy_(torch.linspace(0.5, 1.5, shape[1]))
                m.bias.copy_(torch.linspace(-1, 1, shape[1]))
        x = torch.randn(shape)
        stats = []
        torch.testing.assert_close(ours(x, None, stats), ref(x))
        mean, var = stats[0]
        torch.testing.assert_close(0.9 * torch.zeros(shape[1]) + 0.1 * mean, ref.running_mean)
        torch.testing.assert_close(0.9 * torch.ones(shape[1]) + 0.1 * var, ref.running_var)
        # the mask leaves padding rows out: the real rows normalize as a batch of their own
        pad = torch.cat([x, 100 * torch.randn(3, *shape[1:])])
        mask = torch.cat([torch.ones(shape[0]), torch.zeros(3)])
        torch.testing.assert_close(ours(pad, mask)[:shape[0]], ours(x), atol=1e-5, rtol=1e-5)
        ours.eval(), ref.eval()
        ours.running_mean.copy_(ref.running_mean), ours.running_var.copy_(ref.running_var)
        torch.testing.assert_close(ours(x), ref(x))


def test_fedbn_round_equals_the_torch_batchnorm_per_client_loop(store):
    alg = alg_for(store, algorithm="fedbn", client_clip=0.5)
    c = cohort(store)
    start = {**{k: v.unsqueeze(0).repeat(len(c), *([1] * v.dim())) for k, v in alg.global_params.items()},
             **alg.private.gather(c)}
    index, mask, _ = CohortBatches(store.fit, c, alg.cfg.local_steps, alg.cfg.batch_size, gen()).materialize()
    refs = []
    for i in range(len(c)):
        ref = _torch_bn_mlp(alg.net)
        ref.load_state_dict({k: v[i] for k, v in start.items()}, strict=False)
        ref.train()
        opt = torch.optim.SGD(list(ref.parameters()), lr=alg.cfg.lr, momentum=alg.cfg.momentum)
        for s in range(index.shape[1]):
            real = mask[i, s] > 0
            opt.zero_grad()
            F.cross_entropy(ref(store.inputs(index[i, s][real])), store.y[index[i, s][real]]).backward()
            torch.nn.utils.clip_grad_norm_(list(ref.parameters()), alg.cfg.client_clip)
            opt.step()
        refs.append({k: v.detach() for k, v in ref.state_dict().items() if "num_batches" not in k})
    alg.run_round(0, c, gen())
    ref = {k: torch.stack([r[k] for r in refs]) for k in refs[0]}
    close(alg.global_params, {k: ref[k].mean(0) for k in alg.shared})  # Alg. 1: the uniform mean
    close(alg.private.gather(c), {k: ref[k] for k in alg.init_local})
    # evaluation normalizes with the client's running statistics (eval mode), as torch's does
    x = store.inputs(store.test.index[int(c[0]), :5])
    own = {k: v[0] for k, v in alg.own_models(c[:1]).items()}
    check = _torch_bn_mlp(alg.net)
    check.load_state_dict(own, strict=False)
    check.eval()
    torch.testing.assert_close(functional_call(alg.predict_net, own, (x,)), check(x), **TOL)


def test_fedbn_rounds_with_changing_cohorts_equal_per_client_torch_models(store):
    """Four rounds, cohorts that leave clients out: every client keeps one torch net whose BatchNorm (weights
    and running statistics) is never overwritten; each round it takes the server's other layers, trains, and
    the server averages those layers uniformly. A client's pflx model must be that net, sampled or not."""
    alg = alg_for(store, algorithm="fedbn", momentum=0.0, client_clip=0.0)
    train = store.clients(ROLE_TRAIN)
    cohorts = [train[[0, 3, 5, 9]], train[[3, 5]], train[[0, 9, 1]], train[[5, 1]]]
    init = {**alg.global_params, **{k: v[0] for k, v in alg.private.gather(torch.as_tensor(train[:1])).items()}}
    nets = {}
    for i in map(int, train):
        nets[i] = _torch_bn_mlp(alg.net)
        nets[i].load_state_dict(init, strict=False)
    server = {k: v.clone() for k, v in alg.global_params.items()}
    for t, c in enumerate(cohorts):
        c = torch.as_tensor(c)
        index, mask, _ = CohortBatches(store.fit, c, alg.cfg.local_steps, alg.cfg.batch_size, gen(t)).materialize()
        for i, client in enumerate(map(int, c)):
            net = nets[client]
            net.load_state_dict(server, strict=False)  # the shared layers only; its BatchNorm stays
            net.train()
            opt = torch.optim.SGD(list(net.parameters()), lr=alg.cfg.lr)
            for s in range(index.shape[1]):
                real = mask[i, s] > 0
                opt.zero_grad()
                F.cross_entropy(net(store.inputs(index[i, s][real])), store.y[index[i, s][real]]).backward()
                opt.step()
        server = {k: torch.stack([nets[int(i)].state_dict()[k] for i in c]).mean(0) for k in server}
        alg.run_round(t, c, gen(t))
    close(alg.global_params, server)
    rows = torch.as_tensor(train)
    own = alg.own_models(rows)
    x = store.inputs(store.test.index[rows, :6])
    for r, client in enumerate(map(int, train)):
        nets[client].load_state_dict(server, strict=False)
        nets[client].eval()
        close({k: v[r] for k, v in own.items()},
              {k: v for k, v in nets[client].state_dict().items() if "num_batches" not in k})
        torch.testing.assert_close(functional_call(alg.predict_net, {k: v[r] for k, v in own.items()}, (x[r],)),
                                   nets[client](x[r]), **TOL)


def test_fedbn_needs_normalization_layers_and_the_others_refuse_them(store):
    from pfl_cli.errors import InputError

    with pytest.raises(InputError, match="^model_arch: fedbn keeps the client net's normalization layers local"):
        alg_for(store, algorithm="fedbn", model_arch="mlp")
    with pytest.raises(InputError, match="^model_arch 'mlp-bn' has batch-norm layers.*fedavg does not"):
        alg_for(store, algorithm="fedavg", model_arch="mlp-bn")
    alg = alg_for(store, algorithm="fedbn")
    assert set(alg.init_local) == {"bn1.weight", "bn1.bias", "bn1.running_mean", "bn1.running_var"}
    n_bn = 2 * 16
    assert entries()["fedbn"].algorithm.floats_per_client_round(alg.arch) == \
        2 * (sum(p.numel() for p in alg.net.parameters()) - n_bn)


# ----------------------------------------------------------------------------- FedALA
def test_ala_top_layers_and_weights_stay_in_the_unit_box(store):
    from pfl_cli.fl.ala import top_layers

    assert top_layers(["fc1.weight", "fc1.bias", "fc2.weight", "fc2.bias"], 1) == ["fc2.weight", "fc2.bias"]
    assert top_layers(["fc1.weight", "fc1.bias", "fc2.weight", "fc2.bias"], 5) == \
        ["fc1.weight", "fc1.bias", "fc2.weight", "fc2.bias"]
    alg = alg_for(store, algorithm="fedala")
    c = cohort(store)
    alg.run_round(0, c, gen(0))
    assert bool(alg.private.has[c].all()) and not bool((alg.private.gather(c)["ala_started"] > 0).any())
    before = alg.private.gather(c)
    glob = {k: v.clone() for k, v in alg.global_params.items()}
    alg.run_round(1, c, gen(1))
    after = alg.private.gather(c)
    assert bool((after["ala_started"] > 0).all())
    for k in alg.top:
        w = after[f"W.{k}"]
        assert float(w.min()) >= 0.0 and float(w.max()) <= 1.0 and not torch.equal(w, before[f"W.{k}"])
    del glob


def test_ala_pass_equals_the_per_client_loop(store):
    """One ALA pass (out of the start phase) against a hand-written loop over clients and batches."""
    from pfl_cli.fl.ala import adaptive_local_aggregation, sample_share

    alg = alg_for(store, algorithm="fedala")
    c = cohort(store, 3)
    alg.run_round(0, c, gen(0))
    local = {k: v for k, v in alg.private.gather(c).items() if k in alg.global_params}
    glob = {k: v + 0.1 * torch.randn(v.shape, generator=gen(5)) for k, v in alg.global_params.items()}
    w0 = {k: torch.full((len(c), *glob[k].shape), 0.5) for k in alg.top}
    opts = dict(top=alg.top, share=0.8, batch_size=8, eta=0.7, threshold=0.0, num_pre_loss=2, max_start_epochs=5)
    hat, w, passes = adaptive_local_aggregation(alg.net, local, glob, w0, torch.ones(len(c), dtype=torch.bool),
                                                store, c, gen(9), **opts)
    assert passes.tolist() == [1, 1, 1]
    # the reference: the same subset and batches, drawn from the same generator in the same order
    g = gen(9)
    subset = sample_share(store.fit, c, 0.8, g)
    index, mask, active = CohortBatches(subset, torch.arange(len(c)), None, 8, g, epochs=1).materialize()
    for i in range(len(c)):
        wi = {k: w0[k][i].clone() for k in alg.top}
        diff = {k: glob[k] - local[k][i] for k in alg.top}
        for s in range(index.shape[1]):
            if active is not None and not bool(active[i, s]):
                continue
            real = mask[i, s] > 0
            x, y = store.inputs(index[i, s][real]), store.y[index[i, s][real]]
            p = {k: (local[k][i] + diff[k] * wi[k]).requires_grad_(True) if k in alg.top else glob[k]
                 for k in glob}
            F.cross_entropy(functional_call(alg.net, p, (x,)), y).backward()
            wi = {k: (wi[k] - 0.7 * p[k].grad * diff[k]).clamp(0, 1) for k in alg.top}
        for k in alg.top:
            torch.testing.assert_close(w[k][i], wi[k], **TOL)
            torch.testing.assert_close(hat[k][i], local[k][i] + diff[k] * wi[k], **TOL)
        for k in glob:
            if k not in alg.top:
                assert torch.equal(hat[k][i], glob[k])  # the lower layers take the global model


def test_ala_start_phase_runs_until_converged_or_capped(store):
    from pfl_cli.fl.ala import adaptive_local_aggregation

    alg = alg_for(store, algorithm="fedala")
    c = cohort(store, 2)
    alg.run_round(0, c, gen(0))
    local = {k: v for k, v in alg.private.gather(c).items() if k in alg.global_params}
    glob = {k: v + 0.1 for k, v in alg.global_params.items()}
    w0 = {k: torch.ones(len(c), *glob[k].shape) for k in alg.top}
    common = dict(top=alg.top, share=0.8, batch_size=8, eta=1.0, num_pre_loss=2)
    never = torch.zeros(len(c), dtype=torch.bool)
    _, _, capped = adaptive_local_aggregation(alg.net, local, glob, w0, never, store, c, gen(1), threshold=0.0,
                                              max_start_epochs=4, **common)
    assert capped.tolist() == [4, 4]  # std < 0 never holds: the cap
    _, _, quick = adaptive_local_aggregation(alg.net, local, glob, w0, never, store, c, gen(1), threshold=1e9,
                                             max_start_epochs=50, **common)
    assert quick.tolist() == [3, 3]  # converged as soon as num_pre_loss + 1 passes are recorded


# ----------------------------------------------------------------------------- shared
@pytest.mark.parametrize("name", NAMES)
def test_resumed_training_is_identical(store, name):
    whole, first = alg_for(store, algorithm=name), alg_for(store, algorithm=name)
    for t in range(4):
        whole.run_round(t, cohort(store), gen(t))
    for t in range(2):
        first.run_round(t, cohort(store), gen(t))
    second = alg_for(store, algorithm=name)
    second.load_state(first.state())
    for t in range(2, 4):
        second.run_round(t, cohort(store), gen(t))
    fa, fb = dict(flat(whole.state())), dict(flat(second.state()))
    assert fa.keys() == fb.keys()
    for k in fa:
        assert torch.equal(fa[k], fb[k]), k


@pytest.mark.parametrize("name", NAMES)
def test_new_clients_are_served_by_the_algorithms_protocol(store, name):
    alg = alg_for(store, algorithm=name)
    alg.run_round(0, cohort(store), gen())
    new = store.clients(1)
    before = alg.client_sgd_steps
    params, personalized = alg.personalize(new, gen(2))
    assert personalized and alg.client_sgd_steps > before
    assert all(v.shape[0] == len(new) and bool(torch.isfinite(v).all()) for v in params.values())
    assert alg.protocol(True)["protocol"]


@pytest.mark.parametrize("name", NAMES)
def test_recorded_traffic_equals_the_floats_each_algorithm_reports(store, name):
    alg = alg_for(store, algorithm=name)
    for t in range(2):
        c = cohort(store, 3 + t)
        alg.run_round(t, c, gen(t))
        alg.traffic.close_round(len(c))
    s = alg.traffic.summary()
    once = 0
    if name == "feddbe":  # the initialization period: every labeled train client's mean up, the consensus down
        n = int(store.labeled[store.clients(ROLE_TRAIN)].sum())
        once = 2 * n * alg.net.prbm.numel()
        assert s["messages"]["up"]["feature_mean"] == s["messages"]["down"]["global_mean"] == once / 2 / 7
    assert s["floats_down_per_client_round"] + s["floats_up_per_client_round"] == \
        entries()[name].algorithm.floats_per_client_round(alg.arch) + once / 7
    assert s["client_rounds"] == 7


def test_fedbabu_exchanges_the_body_alone(store):
    alg = alg_for(store, algorithm="fedbabu")
    body, head = split_names(alg.net, "fedbabu")
    n_body = sum(alg.global_params[k].numel() for k in body)
    assert entries()["fedbabu"].algorithm.floats_per_client_round(alg.arch) == 2 * n_body
    assert n_body < sum(v.numel() for v in alg.global_params.values())


# ----------------------------------------------------------------------------- FedDBE
def test_dbe_steps_equal_the_per_client_loop(store):
    """Cross-entropy of h(f(x) + z^p) plus kappa * mean(0.5 (zbar - zbar^g)^2), zbar the running feature mean."""
    from pfl_cli.algorithms.feddbe import dbe_steps

    alg = alg_for(store, algorithm="feddbe", momentum=0.0, client_clip=0.0)
    c = cohort(store, 3)
    start = {**{k: v.unsqueeze(0).repeat(len(c), *([1] * v.dim())) for k, v in alg.global_params.items()},
             "prbm": 0.1 * torch.randn(len(c), alg.net.prbm.numel(), generator=gen(4))}
    g_mean = torch.randn(alg.net.prbm.numel(), generator=gen(5))
    kappa, mu, lr = 2.0, 0.5, alg.cfg.lr
    steps, _ = alg.draw_batches(c, gen(), steps=4)
    theta, running, _ = dbe_steps(alg.net, start, store, steps, g_mean, trainable=list(start), kappa=kappa,
                                  momentum=mu, sgd=alg.sgd_update_options())
    index, mask, _ = CohortBatches(store.fit, c, 4, alg.cfg.batch_size, gen()).materialize()
    for i in range(len(c)):
        p = {k: v[i].clone().requires_grad_(True) for k, v in start.items()}
        opt = torch.optim.SGD(list(p.values()), lr=lr)
        r = torch.zeros(alg.net.prbm.numel())
        for s_ in range(index.shape[1]):
            real = mask[i, s_] > 0
            x, y = store.inputs(index[i, s_][real]), store.y[index[i, s_][real]]
            logits, h = functional_call(alg.net, p, (x,), {"parts": True})
            r = (1 - mu) * r.detach() + mu * h.mean(0)
            loss = F.cross_entropy(logits, y) + kappa * (0.5 * (r - g_mean) ** 2).mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
        for k in p:
            torch.testing.assert_close(theta[k][i], p[k].detach(), **TOL, msg=k)
        torch.testing.assert_close(running[i], r.detach(), **TOL)


def test_feddbe_consensus_is_computed_once_and_resumed(store):
    alg = alg_for(store, algorithm="feddbe")
    assert alg.global_mean is None
    alg.run_round(0, cohort(store), gen(0))
    first = alg.global_mean.clone()
    alg.run_round(1, cohort(store), gen(1))
    assert torch.equal(alg.global_mean, first)
    again = alg_for(store, algorithm="feddbe")
    again.load_state(alg.state())
    assert torch.equal(again.global_mean, first)
    again.load_weights(alg.weights())
    assert torch.equal(again.global_mean, first)


# ----------------------------------------------------------------------------- GPFL
def test_gpfl_round_equals_the_per_client_loop(store):
    """CE(h(f_P)) + CE over cosines to the GCE + lambda ||f_G - e_y||, two SGD optimizers (GCE and CoV decayed)."""
    alg = alg_for(store, algorithm="gpfl", momentum=0.0, client_clip=0.0, gpfl_lambda=0.5, gpfl_mu=0.2)
    c = cohort(store)
    start = {**{k: v.unsqueeze(0).repeat(len(c), *([1] * v.dim())) for k, v in alg.global_params.items()},
             **alg.private.gather(c)}
    index, mask, _ = CohortBatches(store.fit, c, alg.cfg.local_steps, alg.cfg.batch_size, gen()).materialize()
    gce0 = alg.global_params["gce.weight"]
    refs = []
    for i, client in enumerate(c.tolist()):
        ys = store.y[store.fit.index[client, :int(store.fit.length[client])]]
        pi = torch.bincount(ys, minlength=10).float() / len(ys)
        ctx = {"context_p": pi @ gce0, "context_g": gce0.mean(0)}
        p = {k: v[i].clone().requires_grad_(True) for k, v in start.items()}
        decayed = [k for k in p if k.startswith(("cov_", "gce."))]
        opt = torch.optim.SGD([p[k] for k in p if k not in decayed], lr=alg.cfg.lr)
        opt_d = torch.optim.SGD([p[k] for k in decayed], lr=alg.cfg.lr, weight_decay=0.2)
        for s_ in range(index.shape[1]):
            real = mask[i, s_] > 0
            x, y = store.inputs(index[i, s_][real]), store.y[index[i, s_][real]]
            logits, feat_g = functional_call(alg.net, {**p, **ctx}, (x,), {"parts": True})
            cos = F.normalize(feat_g) @ F.normalize(p["gce.weight"]).T
            loss = F.cross_entropy(logits, y) + F.cross_entropy(cos, y) + 0.5 * torch.norm(feat_g - gce0[y], 2)
            opt.zero_grad(), opt_d.zero_grad()
            loss.backward()
            opt.step(), opt_d.step()
        refs.append({k: v.detach() for k, v in p.items()})
    alg.run_round(0, c, gen())
    ref = {k: torch.stack([r[k] for r in refs]) for k in refs[0]}
    close(alg.global_params, mean(store, c, {k: ref[k] for k in alg.shared}))
    close(alg.private.gather(c), {k: ref[k] for k in alg.head})


@pytest.mark.parametrize("opts,message", [
    ({"algorithm": "fedbabu", "finetune_epochs": -1}, "finetune_epochs must be an integer >= 0 for fedbabu"),
    ({"algorithm": "fedrod", "new_client_epochs": -2}, "new_client_epochs must be an integer >= 0"),
    ({"algorithm": "fedala", "ala_eta": 0.0}, "ala_eta must be a finite number > 0 for fedala; got 0.0"),
    ({"algorithm": "fedala", "ala_sample": 1.5}, "ala_sample must be a fraction in (0, 1] for fedala; got 1.5"),
    ({"algorithm": "fedala", "ala_layers": 0}, "ala_layers must be an integer >= 1 for fedala; got 0"),
    ({"algorithm": "fedala", "ala_threshold": float("nan")}, "ala_threshold must be a finite number"),
    ({"algorithm": "fedala", "ala_threshold": -0.1}, "ala_threshold must be a finite number >= 0 for fedala"),
    ({"algorithm": "fedala", "ala_num_pre_loss": 0}, "ala_num_pre_loss must be an integer >= 1"),
    ({"algorithm": "fedala", "ala_max_start_epochs": 0}, "ala_max_start_epochs must be an integer >= 1"),
    ({"algorithm": "feddbe", "dbe_kappa": -1.0}, "dbe_kappa must be a finite number >= 0 for feddbe; got -1.0"),
    ({"algorithm": "feddbe", "dbe_momentum": 0.0}, "dbe_momentum must be a number in (0, 1] for feddbe; got 0.0"),
    ({"algorithm": "feddbe", "new_client_epochs": -1}, "new_client_epochs must be an integer >= 0"),
    ({"algorithm": "gpfl", "gpfl_lambda": -0.1}, "gpfl_lambda must be a finite number >= 0 for gpfl; got -0.1"),
    ({"algorithm": "gpfl", "gpfl_mu": float("inf")}, "gpfl_mu must be a finite number"),
])
def test_bad_values_are_refused_naming_the_key(opts, message):
    opts = dict(opts)
    assert_config_refused(opts.pop("algorithm"), opts, message)


def test_a_key_of_another_algorithm_is_refused_with_did_you_mean():
    assert_unknown_key("fedbabu", "finetune_epoch", ".*did you mean 'finetune_epochs'")
    assert_unknown_key("fedrod", "ala_eta")


def test_configs_are_frozen_and_declare_their_sources():
    for name in NAMES:
        cfg = train_config(name)
        with pytest.raises(dataclasses.FrozenInstanceError):
            cfg.lr = 1.0
        own = [f for f in dataclasses.fields(cfg) if f.name.startswith(("ala_", "finetune_epochs"))]
        assert all(f.metadata["doc"] for f in own)
    assert np.isclose(train_config("fedala").ala_sample, 0.8) and train_config("fedala").ala_layers == 1
    assert train_config("fedbabu").finetune_epochs == 5


# ----------------------------------------------------------------------------- pFedLA
def test_pfedla_round_equals_the_per_client_hypernetwork_loop(store):
    """Per client: alpha from its own hypernetwork (a plain module), theta_bar layer by layer over the train
    clients' stored models, torch.optim.SGD on theta_bar, then one SGD step of psi_i and v_i on
    <theta_bar, stopgrad(theta_bar - theta')> (the chain rule of the paper's step 3)."""
    import copy

    alg = alg_for(store, algorithm="pfedla", pfedla_hn_lr=50.0, client_clip=0.0)
    train = store.clients(ROLE_TRAIN)
    c0 = cohort(store)
    alg.run_round(0, c0, gen(0))  # the stored models differ from one another after a round
    c = torch.as_tensor(train[[0, 1, 7]])
    models = {k: alg.private.values["theta." + k][torch.as_tensor(train)].clone() for k in alg.names}
    rows = alg.private.gather(c)
    index, mask = sample_batches(store.fit, c, alg.cfg.local_steps, alg.cfg.batch_size, gen(1))
    refs = []
    for i, client in enumerate(c.tolist()):
        hn = copy.deepcopy(alg.hnet)
        hn.load_state_dict({k: rows["hn." + k][i] for k in alg.hn_names})
        v = rows["v"][i].clone().requires_grad_(True)
        raw = hn(v)
        me = int(np.flatnonzero(train == client)[0])
        bar = {}
        for k in alg.names:
            w = torch.relu(raw[k.rsplit(".", 1)[0]])
            w = w / w.sum() if float(w.sum().detach()) > 0 else F.one_hot(torch.tensor(me), len(train)).float()
            bar[k] = sum(w[j] * models[k][j] for j in range(len(train)))
        start = {k: b.detach().unsqueeze(0) for k, b in bar.items()}
        trained = local_sgd_reference(alg.net, start, store, index[i:i + 1], mask[i:i + 1], **alg.sgd_options())[0]
        surrogate = sum((bar[k] * (bar[k].detach() - trained[k][0])).sum() for k in alg.names)
        leaves = [*hn.parameters(), v]
        grads = torch.autograd.grad(surrogate, leaves)
        stepped = [p.detach() - 50.0 * g for p, g in zip(leaves, grads)]
        refs.append(({k: trained[k][0] for k in alg.names}, dict(zip(alg.hn_names, stepped[:-1])), stepped[-1]))
    alg.run_round(1, c, gen(1))
    after = alg.private.gather(c)
    for i, (theta, hn, v) in enumerate(refs):
        close({k: after["theta." + k][i] for k in alg.names}, theta)
        close({k: after["hn." + k][i] for k in alg.hn_names}, hn)
        torch.testing.assert_close(after["v"][i], v, **TOL)
        assert not torch.equal(after["v"][i], rows["v"][i])  # the embedding moved
    # a train client's model is theta_bar from its (new) hypernetwork; weights are >= 0 and sum to one
    own = alg.own_models(c[:1])
    assert set(own) == set(alg.names) and all(v.shape[0] == 1 for v in own.values())


def test_pfedla_layer_weights_normalize_and_fall_back_to_the_own_model():
    from pfl_cli.algorithms.pfedla import aggregate_layers, layer_groups, layer_weights

    raw = {"fc1": torch.tensor([[1.0, 3.0, -2.0], [-1.0, -5.0, -0.5]])}
    own = F.one_hot(torch.tensor([0, 2]), 3).float()
    alpha = layer_weights(raw, own)
    torch.testing.assert_close(alpha["fc1"], torch.tensor([[0.25, 0.75, 0.0], [0.0, 0.0, 1.0]]))
    models = {"fc1.weight": torch.arange(6.0).reshape(3, 2), "fc1.bias": torch.tensor([1.0, 2.0, 3.0])}
    bar = aggregate_layers(alpha, models, {"fc1.weight": "fc1", "fc1.bias": "fc1"})
    torch.testing.assert_close(bar["fc1.weight"], torch.tensor([[0.25 * 0 + 0.75 * 2, 0.25 * 1 + 0.75 * 3], [4.0, 5.0]]))
    torch.testing.assert_close(bar["fc1.bias"], torch.tensor([1.75, 3.0]))
    assert layer_groups(["a.w", "a.b", "b.w"]) == {"a": ["a.w", "a.b"], "b": ["b.w"]}


def test_pfedla_new_clients_start_from_the_train_clients_mean(store):
    alg = alg_for(store, algorithm="pfedla", new_client_epochs=0)
    alg.run_round(0, cohort(store), gen())
    new = store.clients(1)[:2]
    params, personalized = alg.personalize(new, gen(1))
    assert personalized and alg.client_sgd_steps == 0
    train = torch.as_tensor(store.clients(ROLE_TRAIN))
    # weighted by fit + validation samples: predict, which carves no validation split, rebuilds the same mean
    assert int(store.val.length[train].sum()) > 0
    ref = mean(store, train, {k: alg.private.values["theta." + k][train] for k in alg.names}, whole_train_split=True)
    for k in alg.names:
        torch.testing.assert_close(params[k][1], ref[k].float(), **TOL)
