"""pFedHN / pFedHN-PC (spec D.1 items 2-6, 9, 11): the server VJP, its sign, locality, batching, new clients."""

import dataclasses

import numpy as np
import pytest
import torch

from pfl_cli.algorithms import PFedHN, PFedHNPC
from pfl_cli.algorithms.base import descriptor_dim
from pfl_cli.fl.batches import sample_batches
from pfl_cli.fl.cohort import local_sgd_reference
from pflx_testing import small_config
from pfl_cli.fl.store import build_store
from pfl_cli.rng import make_rng

SMALL = dict(algorithm="pfedhn", mlp_hidden=(8,), hyper_hidden=16, batch_size=8, embed_rounds=2)
PLAIN = dict(momentum=0.0, client_clip=0.0, lambda_theta=0.0, hn_momentum=0.0, hn_weight_decay=0.0, server_clip=0.0)


@pytest.fixture(scope="module")
def store(digits_clients):
    ds, part = digits_clients
    return build_store(ds.x, ds.y, ds.num_classes, part, val_fraction=0.0, rng=make_rng(0, "v"), device="cpu")


def _params(alg):
    return [*alg.hnet.parameters(), *alg.table.parameters()]


def _snapshot(alg):
    return [p.detach().clone() for p in _params(alg)]


def test_embedding_dim_and_one_row_per_train_client(store):
    cfg = small_config(**SMALL)
    assert [descriptor_dim(cfg, n) for n in (10, 50, 100)] == [3, 13, 26]
    alg = PFedHN(cfg, store)
    # 16 train clients of 20; holdout clients have no row and do not count in e = int(1 + n/4) (spec A.8: n clients)
    assert alg.table.weight.shape == (16, int(1 + 16 / 4))
    assert not alg.has_state(store.clients(1)).any() and alg.has_state(store.clients(0)).all()


@pytest.mark.parametrize("cls", [PFedHN, PFedHNPC])
def test_server_step_is_the_chain_rule_at_one_local_step(store, cls):
    """D.1 item 3: K = 1, plain SGD: the update is alpha * eta * grad of L_i(h(v_i; phi)) for phi and v_i."""
    alpha, eta = 0.5, 0.1
    cfg = small_config(**{**SMALL, **PLAIN}, local_steps=1, lr=eta, server_lr=alpha)
    alg, ref = cls(cfg, store), cls(cfg, store)
    before = _snapshot(alg)
    cohort = torch.tensor([3])
    alg.run_round(0, cohort, torch.Generator().manual_seed(5))
    update = [b - p.detach() for b, p in zip(before, _params(alg))]

    index, mask = sample_batches(store.fit, cohort, 1, cfg.batch_size, torch.Generator().manual_seed(5))
    theta = ref.hnet(ref.table(ref.row_of[cohort]))
    init = dict(ref.net.named_parameters())
    full = {**{k: theta[k][0] for k in ref.names}, **{k: init[k].detach() for k in ref.head_names}}
    logits = torch.func.functional_call(ref.net, full, (store.inputs(index[0, 0]),))
    loss = torch.nn.functional.cross_entropy(logits, store.y[index[0, 0]])
    grads = torch.autograd.grad(alpha * eta * loss, _params(ref))
    for u, g in zip(update, grads):
        torch.testing.assert_close(u, g, rtol=1e-5, atol=1e-7)
    assert float(update[-1].abs().sum()) > 0  # v_i moved


def test_surrogate_identity(store):
    """D.1 item 4: J^T (h - theta~) is the gradient of 1/2 ||theta~ - h(v; phi)||^2."""
    alg = PFedHN(small_config(**SMALL), store)
    theta = alg.hnet(alg.table(torch.tensor([0, 4])))
    target = {k: torch.randn_like(theta[k]) for k in alg.names}
    vjp = torch.autograd.grad([theta[k] for k in alg.names], _params(alg),
                              grad_outputs=[theta[k].detach() - target[k] for k in alg.names], retain_graph=True)
    half = 0.5 * sum(((target[k] - theta[k]) ** 2).sum() for k in alg.names)
    for a, b in zip(vjp, torch.autograd.grad(half, _params(alg))):
        torch.testing.assert_close(a, b)


def test_one_server_step_moves_h_towards_the_client_solution(store):
    """D.1 item 5 (the sign erratum of Alg. 1): ||h(v_i) - theta~_i|| strictly decreases."""
    cfg = small_config(**{**SMALL, **PLAIN}, local_steps=10, lr=0.05, server_lr=1e-3)
    alg = PFedHN(cfg, store)
    seen = {}
    local = alg._local

    def spy(theta, clients, gen, heads=None, momentum=None, group=""):
        new, h, loss = local(theta, clients, gen, heads, momentum, group)
        seen["new"] = new
        return new, h, loss

    alg._local = spy
    cohort = torch.tensor([7])

    def gap():
        with torch.no_grad():
            theta = alg.hnet(alg.table(alg.row_of[cohort]))
        return float(torch.sqrt(sum(((theta[k] - seen["new"][k]) ** 2).sum() for k in alg.names)))

    alg.run_round(0, cohort, torch.Generator().manual_seed(1))
    after = gap()
    alg.load_state(PFedHN(cfg, store).state())  # back to the start, same theta~
    assert gap() > after


def test_a_step_touches_only_its_row_without_weight_decay_and_momentum(store):
    """D.1 item 6: rows j != i bit-identical with wd = momentum = 0; with the code defaults they move."""
    cohort = torch.tensor([2])
    plain = PFedHN(small_config(**{**SMALL, **PLAIN}, local_steps=3), store)
    before = plain.table.weight.detach().clone()
    for t in range(2):
        plain.run_round(t, cohort, torch.Generator().manual_seed(t))
    row = int(plain.row_of[2])
    others = torch.arange(before.shape[0]) != row
    assert torch.equal(plain.table.weight[others], before[others])
    assert not torch.equal(plain.table.weight[row], before[row])
    default = PFedHN(small_config(**SMALL, local_steps=3), store)
    before = default.table.weight.detach().clone()
    for t in range(2):
        default.run_round(t, cohort, torch.Generator().manual_seed(t))
    assert not torch.equal(default.table.weight[others], before[others])


@pytest.mark.parametrize("cls", [PFedHN, PFedHNPC])
def test_a_batched_cohort_equals_sequential_client_gradients_averaged(store, cls):
    """--clients-per-round c: one vmapped computation == the c single-client VJPs summed, / c."""
    cfg = small_config(**{**SMALL, **PLAIN}, local_steps=4, lr=0.05, server_lr=1.0)
    alg, ref = cls(cfg, store), cls(cfg, store)
    before = _snapshot(alg)
    cohort = torch.tensor([0, 5, 9])
    alg.run_round(0, cohort, torch.Generator().manual_seed(3))
    update = [b - p.detach() for b, p in zip(before, _params(alg))]

    index, mask = sample_batches(store.fit, cohort, cfg.local_steps, cfg.batch_size, torch.Generator().manual_seed(3))
    total = [torch.zeros_like(p) for p in _params(ref)]
    init = dict(ref.net.named_parameters())
    for i in range(3):
        theta = ref.hnet(ref.table(ref.row_of[cohort[i:i + 1]]))
        start = {k: (theta[k].detach() if k in ref.names else init[k].detach().unsqueeze(0))
                 for k in (*ref.names, *ref.head_names)}
        new, _ = local_sgd_reference(ref.net, start, store, index[i:i + 1], mask[i:i + 1], lr=cfg.lr)
        g = torch.autograd.grad([theta[k] for k in ref.names], _params(ref),
                                grad_outputs=[theta[k].detach() - new[k] for k in ref.names])
        total = [a + b for a, b in zip(total, g)]
    for u, g in zip(update, total):
        torch.testing.assert_close(u, g / 3, rtol=1e-4, atol=1e-6)


def test_pc_heads_are_private_persistent_and_not_generated(store):
    cfg = small_config(**{**SMALL, "algorithm": "pfedhn-pc"}, local_steps=3)
    alg = PFedHNPC(cfg, store)
    assert alg.head_names == ["fc2.weight", "fc2.bias"] and alg.names == ["fc1.weight", "fc1.bias"]
    head0 = alg.heads[""].gather(torch.tensor([4]))
    alg.run_round(0, torch.tensor([4]), torch.Generator().manual_seed(0))
    head1 = alg.heads[""].gather(torch.tensor([4]))
    assert not torch.equal(head0["fc2.weight"], head1["fc2.weight"])
    assert float(head1["momentum.fc2.weight"].abs().sum()) > 0  # the optimizer state persists
    untouched = alg.heads[""].gather(torch.tensor([5]))
    assert torch.equal(untouched["fc2.weight"], head0["fc2.weight"])
    # nothing of the head crosses the network
    assert not any("fc2" in k for k in (*alg.traffic.down, *alg.traffic.up))


@pytest.mark.parametrize("alg_name", ["pfedhn", "pfedhn-pc"])
def test_messages_are_theta_down_and_delta_up_only(digits_clients, alg_name):
    """D.1 items 9 and 12: |theta| floats each way per selected client; phi and V are never sent."""
    from pfl_cli.fl import train_federated
    from pfl_cli.models import build

    ds, part = digits_clients
    cfg = small_config(**{**SMALL, "algorithm": alg_name}, rounds=3, eval_every=3, local_steps=2, clients_per_round=2)
    run = train_federated(ds.x, ds.y, ds.num_classes, part, cfg, device="cpu")
    net, alg = build(run.model["arch"]["client"]), run.algorithm
    generated = {k: p.numel() for k, p in net.named_parameters() if k in alg.names}
    msgs = alg.exchanged()
    assert msgs["down"] == generated and msgs["up"] == {f"delta.{k}": n for k, n in generated.items()}
    comm = alg.traffic.summary()
    theta = sum(generated.values())
    assert comm["floats_down_per_client_round"] == theta == comm["floats_up_per_client_round"]
    assert comm["total_bytes"] == 2 * theta * 4 * 2 * 3  # 2 directions x 4 B x 2 clients x 3 rounds


@pytest.mark.slow  # default-tier budget (2026-11-29): minutes-long or a learning run
@pytest.mark.parametrize("alg_name", ["pfedhn", "pfedhn-pc"])
def test_new_clients_train_an_embedding_under_a_frozen_hypernetwork(digits_clients, alg_name):
    """D.1 item 11: phi byte-identical after predict; the trained v_new beats a random one."""
    from pfl_cli.fl.checkpoint import torch_bytes
    from pfl_cli.fl import PredictConfig, predict_clients, train_federated
    from pfl_cli.fl.evaluate import evaluate

    ds, part = digits_clients
    cfg = small_config(**{**SMALL, "algorithm": alg_name, "mlp_hidden": (32,)}, rounds=150, eval_every=150,
                      clients_per_round=1, lr=0.02, local_steps=20)
    run = train_federated(ds.x, ds.y, ds.num_classes, part, cfg, device="cpu")
    frozen = torch_bytes(run.model["weights"])
    out = predict_clients(run.model, cfg, ds.x, ds.y, ds.num_classes, part, PredictConfig(embed_rounds=10),
                          device="cpu")
    assert torch_bytes(run.model["weights"]) == frozen
    assert out.protocol["rounds"] == 10 and out.protocol["new_clients"] == 4
    assert out.optimizer_steps == 4 * 10 * (20 + 1)  # local steps + one embedding step per round
    # The same clients from the random embedding the protocol starts from (same generator draw).
    alg = run.algorithm
    alg.load_weights(run.model["weights"])
    holdout = alg.store.clients(1)
    gen = __import__("pfl_cli.rng", fromlist=["torch_generator"]).torch_generator(0, "predict")
    with torch.no_grad():
        theta = alg.hnet(torch.randn(len(holdout), alg.table.embedding_dim, generator=gen))
    heads = {k: v.detach().unsqueeze(0).expand(len(holdout), *v.shape) for k, v in alg.head_init[""].items()} \
        if alg.personal_head else {}
    rand = {**{k: theta[k] for k in alg.names}, **heads}
    kept = predict_clients(run.model, cfg, ds.x, ds.y, ds.num_classes, part,
                           PredictConfig(embed_rounds=10, save_models=True), device="cpu").params
    for split in ("fit", "test"):
        before = evaluate(alg.net, rand, alg.store, holdout, split, personalized=True).summary()
        after = evaluate(alg.net, kept, alg.store, holdout, split, personalized=True).summary()
        assert after["loss"] < before["loss"], (split, after, before)
    known = predict_clients(run.model, cfg, ds.x, ds.y, ds.num_classes, part, PredictConfig(clients="train"),
                            device="cpu")
    assert known.optimizer_steps == 0 and known.protocol["new_clients"] == 0


@pytest.mark.parametrize("alg_name", ["pfedhn", "pfedhn-pc"])
def test_resumed_training_ends_where_the_uninterrupted_run_ends(digits_clients, alg_name):
    from pfl_cli.fl.checkpoint import torch_bytes
    from pfl_cli.fl import train_federated

    ds, part = digits_clients
    cfg = small_config(**{**SMALL, "algorithm": alg_name}, rounds=6, eval_every=2, local_steps=3, val_fraction=0.2,
                      clients_per_round=2)
    saved = []
    full = train_federated(ds.x, ds.y, ds.num_classes, part, cfg, device="cpu",
                           on_checkpoint=lambda ck: saved.append(torch_bytes(ck)))
    at2 = torch.load(__import__("io").BytesIO(saved[0]), weights_only=True)
    resumed = train_federated(ds.x, ds.y, ds.num_classes, part, cfg, device="cpu", resume=at2)
    assert resumed.outcome.history == full.outcome.history
    assert torch_bytes(resumed.model) == torch_bytes(full.model)
    assert torch_bytes(resumed.algorithm.state()) == torch_bytes(full.algorithm.state())


def test_prop1_linear_hypernetwork_is_uncentered_pca():
    """D.1 item 7 (Prop. 1): theta_i = W v_i, X_i^T X_i = I: the optimum is PCA without mean subtraction."""
    g = torch.Generator().manual_seed(0)
    n, d, k, m = 12, 8, 3, 40
    theta_star = torch.randn(d, 1, generator=g, dtype=torch.float64) * 2 + 1.5  # a nonzero mean
    X = [torch.linalg.qr(torch.randn(m, d, generator=g, dtype=torch.float64))[0] for _ in range(n)]
    y = [X[i] @ (theta_star[:, 0] + torch.randn(d, generator=g, dtype=torch.float64)) +
         0.1 * torch.randn(m, generator=g, dtype=torch.float64) for i in range(n)]
    W = torch.randn(d, k, generator=g, dtype=torch.float64, requires_grad=True)
    V = torch.randn(k, n, generator=g, dtype=torch.float64, requires_grad=True)

    def loss():
        return sum(((X[i] @ (W @ V[:, i]) - y[i]) ** 2).sum() for i in range(n))

    opt = torch.optim.LBFGS([W, V], max_iter=5000, tolerance_grad=1e-12, tolerance_change=1e-15,
                            line_search_fn="strong_wolfe")

    def closure():
        opt.zero_grad()
        value = loss()
        value.backward()
        return value

    for _ in range(5):
        opt.step(closure)
    theta_bar = torch.stack([X[i].T @ y[i] for i in range(n)], 1)           # local ERM solutions (d, n)
    const = sum(float((y[i] ** 2).sum() - (theta_bar[:, i] ** 2).sum()) for i in range(n))
    U, S, _ = torch.linalg.svd(theta_bar)
    uncentered = const + float((S[k:] ** 2).sum())
    centred = theta_bar - theta_bar.mean(1, keepdim=True)
    Uc = torch.linalg.svd(centred)[0][:, :k]
    centered_basis = const + float(((theta_bar - Uc @ Uc.T @ theta_bar) ** 2).sum())
    gd = float(loss().detach())
    assert abs(gd - uncentered) <= 1e-6 * uncentered
    assert centered_basis > uncentered * (1 + 1e-3)  # the test tells the two apart
    Q = torch.linalg.qr(W.detach())[0]
    cosines = torch.linalg.svdvals(Q.T @ U[:, :k])
    assert float(cosines.min()) > 0.9999


def test_a_client_updates_only_the_heads_of_its_size(store):
    """Mixed sizes: the VJP reaches the trunk and the client's size's heads, no other size's heads."""
    cfg = small_config(**{**SMALL, **PLAIN}, client_sizes="S,M,L", local_steps=2)
    alg = PFedHN(cfg, store)
    names = alg.hnet.target_names
    before = {k: p.detach().clone() for k, p in alg.hnet.named_parameters()}
    alg.run_round(0, torch.tensor([4]), torch.Generator().manual_seed(0))  # position 4: slot 4 mod 3 = M
    for i, name in enumerate(names):
        moved = not torch.equal(before[f"heads.{i}.weight"], alg.hnet.heads[i].weight)
        assert moved == name.startswith("M/"), name
    assert not torch.equal(before["body.0.weight"], alg.hnet.body[0].weight)
    assert alg.nets["S"].fc1.weight.shape == (4, 64) and alg.nets["L"].fc1.weight.shape == (16, 64)


def test_pc_mixed_sizes_keep_one_private_head_per_client_of_its_size(store):
    """pFedHN-PC with sizes: h generates only the feature extractors; a cohort of an S, an M and an L client
    moves exactly those clients' heads, each in its own size's store and shape, and no generated head of h
    is a classifier."""
    cfg = small_config(**{**SMALL, **PLAIN, "algorithm": "pfedhn-pc"}, client_sizes="S,M,L", local_steps=2)
    alg = PFedHNPC(cfg, store)
    assert {k.split("/", 1)[1] for k in alg.hnet.target_names} == {"fc1.weight", "fc1.bias"}
    assert {g: tuple(alg.heads[g].values["fc2.weight"].shape) for g in "SML"} == \
        {"S": (store.num_clients, 10, 4), "M": (store.num_clients, 10, 8), "L": (store.num_clients, 10, 16)}
    before = {g: alg.heads[g].values["fc2.weight"].clone() for g in "SML"}
    cohort = torch.tensor([3, 4, 5])                          # positions mod 3: S, M, L
    alg.run_round(0, cohort, torch.Generator().manual_seed(0))
    for g, mine in zip("SML", (3, 4, 5)):
        moved = (alg.heads[g].values["fc2.weight"] != before[g]).flatten(1).any(1)
        assert moved.nonzero().flatten().tolist() == [mine], g
    for g, client, width in zip("SML", (3, 4, 5), (4, 8, 16)):   # each predicts with its own size and head
        params, personalized = alg.personalize(np.array([client]), torch.Generator().manual_seed(1))
        assert personalized and params["fc1.weight"].shape == (1, width, 64)
        assert torch.equal(params["fc2.weight"][0], alg.heads[g].values["fc2.weight"][client])
        logits = torch.func.functional_call(alg.nets[g], {k: v[0] for k, v in params.items()},
                                            (store.x[:5].to(torch.float32).reshape(5, -1),))
        assert logits.shape == (5, 10) and torch.isfinite(logits).all()


def test_default_cohorts_follow_the_papers(store):
    from pfl_cli.algorithms import FedAvg, HyperFL

    assert PFedHN(small_config(**SMALL), store).cohort_size(0, 10, 16) == 1       # Alg. 1: one client per step
    assert HyperFL(small_config(**{**SMALL, "algorithm": "hyperfl"}), store).cohort_size(0, 10, 16) == 16
    assert FedAvg(small_config(algorithm="fedavg", mlp_hidden=(8,)), store).cohort_size(0, 10, 16) == 5
    assert PFedHN(small_config(**SMALL, clients_per_round=3), store).cohort_size(0, 10, 16) == 3


def test_mixed_lenet_sizes_train_and_predict_on_images():
    """Table 2's targets: LeNets with 8 / 16 / 32 first-layer filters from one hypernetwork."""
    from pfl_cli.fl import PredictConfig, predict_clients, train_federated
    from pfl_cli.models.util import count_parameters
    from pfl_cli.partition import PartitionConfig, partition_labels

    rng = np.random.default_rng(0)
    x = rng.integers(0, 255, size=(120, 3, 32, 32), dtype=np.uint8)
    y = np.repeat(np.arange(4), 30)
    part = partition_labels(y, PartitionConfig(scheme="iid", num_clients=6, holdout_clients=3, test_fraction=0.25),
                            num_classes=4, rng=make_rng(0, "p"))
    cfg = small_config(algorithm="pfedhn", model_arch="lenet", client_sizes="S,M,L", hyper_hidden=4, rounds=2,
                      eval_every=2, local_steps=2, clients_per_round=3, embed_rounds=1, val_fraction=0.0)
    run = train_federated(x, y, 4, part, cfg, device="cpu")
    nets = run.algorithm.nets
    assert [nets[s].conv1.weight.shape[0] for s in "SML"] == [8, 16, 32]
    assert count_parameters(nets["S"]) < count_parameters(nets["M"]) < count_parameters(nets["L"])
    for clients in ("train", "holdout"):
        out = predict_clients(run.model, cfg, x, y, 4, part, PredictConfig(clients=clients), device="cpu")
        assert out.evaluation.n.sum() > 0 and np.isfinite(out.evaluation.loss).all()
