"""``sam_rho``: sharpness-aware local steps as an option of FedAvg and FedProx (issue 40; :mod:`pfl_cli.fl.sam`).

FedAvg with ``sam_rho`` R trains the weights FedSAM with R trains, bit for bit (FedSAM's round is FedAvg's);
``sam_rho = 0`` is today's plain path, bit for bit (the engine's local SGD and FedAvg's aggregation called
directly, as ``FedAvg.run_round`` called them before the option); FedProx with it equals a per-client
reference written here (the SAM gradient of the data loss, the proximal gradient added after clipping at
``w``); stacked runs (:mod:`pfl_cli.fl.stack`) that differ in ``sam_rho`` equal their separate runs; bad
values and the paths that would run plain steps in its place (Flower, ``pflx attack``, ``--nproc``) are refused.
"""

import pytest
import torch
import torch.nn.functional as F
from torch.func import functional_call

from baseline_support import alg_factory, close, gen
from pfl_cli.algorithms.base import Algorithm
from pfl_cli.errors import ConfigError, InputError
from pfl_cli.fl.batches import sample_batches
from pfl_cli.fl.params import broadcast
from pfl_cli.fl.store import ROLE_TRAIN
from pfl_cli.registry import train_config
from pflx_testing import small_config

BASE = small_config(mlp_hidden=(16,), local_steps=4, batch_size=8, lr=0.05, clients_per_round=4, momentum=0.9,
                    client_clip=0.5, lambda_theta=1e-3)
alg_for = alg_factory(BASE)
COHORTS = ([0, 3, 5, 9], [3, 9, 1, 7])


def cohorts(store):
    train = store.clients(ROLE_TRAIN)
    return [torch.as_tensor(train[c]) for c in COHORTS]


def two_rounds(alg):
    for t, clients in enumerate(cohorts(alg.store)):
        alg.run_round(t, clients, gen(t))
    return alg.global_params


def assert_equal(a, b):
    assert a.keys() == b.keys()
    for k in a:
        assert torch.equal(a[k], b[k]), (k, float((a[k] - b[k]).abs().max()))


@pytest.mark.parametrize("how,epochs", [("vmap", None), ("loop", None), ("vmap", 1)])
def test_fedavg_with_sam_rho_is_fedsam_bit_for_bit(store, how, epochs):
    opts = dict(sam_rho=0.2, cohort_exec=how, local_epochs=epochs, server_lr=0.8)
    fedavg = two_rounds(alg_for(store, algorithm="fedavg", **opts))
    fedsam = two_rounds(alg_for(store, algorithm="fedsam", **opts))
    assert_equal(fedavg, fedsam)
    plain = two_rounds(alg_for(store, algorithm="fedavg", **{**opts, "sam_rho": 0.0}))
    assert float((plain["fc1.weight"] - fedavg["fc1.weight"]).abs().max()) > 1e-4  # the SAM steps acted


@pytest.mark.parametrize("name", ["fedavg", "fedprox"])
def test_sam_rho_0_is_the_plain_path_bit_for_bit(store, name):
    """The round before the option: the engine's local SGD (Algorithm.cohort_sgd) from the global model, then
    FedAvg's aggregation; sam_rho 0 (the default) must give exactly its weights."""
    alg = alg_for(store, algorithm=name, mu=0.1) if name == "fedprox" else alg_for(store, algorithm=name)
    assert alg.cfg.sam_rho == 0.0
    ref = alg_for(store, algorithm=name, **({"mu": 0.1} if name == "fedprox" else {}))
    for t, clients in enumerate(cohorts(store)):
        alg.run_round(t, clients, gen(t))
        prox = {"prox_mu": 0.1, "prox_anchor": ref.global_params} if name == "fedprox" else {}
        theta, _, _ = Algorithm.cohort_sgd(ref, broadcast(ref.global_params, len(clients)), clients, gen(t),
                                           steps=ref.cfg.local_steps, **prox)
        ref.aggregate(t, clients, theta)
        assert_equal(alg.global_params, ref.global_params)


def ref_fedprox_sam(alg, start, clients, g, rho, mu):
    """Each client alone: SAM's gradient of its batch loss (at w + rho g / ||g||), clipped, then weight decay and
    the proximal gradient mu (w - w^t) at w, SGD with momentum (pflx's client optimizer)."""
    cfg = alg.cfg
    index, mask = sample_batches(alg.store.fit, clients, cfg.local_steps, cfg.batch_size, g)

    def loss_of(p, idx, m):
        logits = functional_call(alg.net, p, (alg.store.inputs(idx),))
        return (F.cross_entropy(logits, alg.store.y[idx], reduction="none") * m).sum() / m.sum()

    def grad_at(p, idx, m):
        leaves = {k: v.clone().requires_grad_(True) for k, v in p.items()}
        return dict(zip(leaves, torch.autograd.grad(loss_of(leaves, idx, m), list(leaves.values()))))

    out = {k: [] for k in start}
    for i in range(len(clients)):
        w = {k: v.clone() for k, v in start.items()}
        buf = {k: torch.zeros_like(v) for k, v in w.items()}
        for s in range(cfg.local_steps):
            idx, m = index[i, s], mask[i, s]
            grads = grad_at(w, idx, m)
            norm = torch.sqrt(sum(gr.pow(2).sum() for gr in grads.values()))
            grads = grad_at({k: w[k] + rho * grads[k] / (norm + 1e-12) for k in w}, idx, m)   # Foret et al. Eq. 3
            norm = torch.sqrt(sum(gr.pow(2).sum() for gr in grads.values()))
            scale = min(1.0, cfg.client_clip / (float(norm) + 1e-6))
            for k in w:
                d = grads[k] * scale + 2 * cfg.lambda_theta * w[k] + mu * (w[k] - start[k])  # FedProx Eq. 2
                buf[k] = cfg.momentum * buf[k] + d
                w[k] = w[k] - cfg.lr * buf[k]
        for k in w:
            out[k].append(w[k])
    n = alg.store.fit.length[clients].to(torch.float32)
    return {k: torch.einsum("c,c...->...", n / n.sum(), torch.stack(v)) for k, v in out.items()}


@pytest.mark.parametrize("how", ["vmap", "loop"])
def test_fedprox_with_sam_rho_equals_the_per_client_reference(store, how):
    rho, mu = 0.2, 0.5
    alg = alg_for(store, algorithm="fedprox", sam_rho=rho, mu=mu, cohort_exec=how)
    w = {k: v.clone() for k, v in alg.global_params.items()}
    for t, clients in enumerate(cohorts(store)):
        alg.run_round(t, clients, gen(t))
        w = ref_fedprox_sam(alg, w, clients, gen(t), rho, mu)
        close(alg.global_params, w)
    fedsam = two_rounds(alg_for(store, algorithm="fedsam", sam_rho=rho, cohort_exec=how))
    assert float((fedsam["fc1.weight"] - w["fc1.weight"]).abs().max()) > 1e-4  # the proximal term acted


# Stacked against separate runs: tests/fl/test_stack.py's bound (max |diff| 0.0 measured on the digits MLP).
STACK_TOLERANCE = 1e-5


@pytest.mark.parametrize("name", ["fedavg", "fedprox"])
def test_stacked_runs_differing_in_sam_rho_equal_their_separate_runs(digits_clients, name):
    from pfl_cli.fl import train_federated
    from pfl_cli.fl.stack import stack_groups, train_stacked

    ds, part = digits_clients
    base = dict(rounds=2, eval_every=2, clients_per_round=4, local_steps=3, batch_size=8, device="cpu",
                mlp_hidden=(16,))
    cfgs = [small_config(name, seed=0, lr=0.05, sam_rho=0.1, **base),
            small_config(name, seed=3, lr=0.02, sam_rho=0.0, momentum=0.9, **base),
            small_config(name, seed=1, lr=0.05, sam_rho=0.3, client_clip=1.0, **base)]
    assert stack_groups(cfgs) == [[0, 1, 2]]  # one stack: sam_rho is a per-row setting
    stacked = train_stacked(ds.x, ds.y, ds.num_classes, part, cfgs)
    worst = 0.0
    for cfg, got in zip(cfgs, stacked):
        assert got.error is None, got.error
        alone = train_federated(ds.x, ds.y, ds.num_classes, part, cfg).model["weights"]["client"]
        mine = got.run.model["weights"]["client"]
        worst = max(worst, max(float((mine[k] - alone[k]).abs().max()) for k in alone))
    assert worst <= STACK_TOLERANCE, worst
    # the SAM rows really took SAM steps: the same run without sam_rho trains other weights
    plain = train_federated(ds.x, ds.y, ds.num_classes, part,
                            small_config(name, seed=0, lr=0.05, sam_rho=0.0, **base)).model["weights"]["client"]
    got = stacked[0].run.model["weights"]["client"]
    assert max(float((plain[k] - got[k]).abs().max()) for k in plain) > 1e-4


def test_stacked_sam_runs_equal_their_separate_runs_bit_for_bit(digits_clients):
    """``train --seeds`` writes each seed's model.pt as ``train --seed`` writes it, bit-identical on the digits MLP
    (docs/commands/train.md, compare.md): SAM's steps too. The perturbation's ``rho / ||g||`` was a Python number
    over a tensor alone (reciprocal, then multiply) and a true division stacked: 3e-8 apart after 20 rounds
    (``pflx train --algorithm fedavg --set sam_rho=0.05 --seeds 0,1`` against ``--seed 0``)."""
    from pfl_cli.fl import train_federated
    from pfl_cli.fl.stack import train_stacked

    ds, part = digits_clients
    base = dict(rounds=3, eval_every=3, clients_per_round=4, local_steps=3, batch_size=8, device="cpu",
                mlp_hidden=(16,), lr=0.05, sam_rho=0.05, cohort_exec="vmap")
    cfgs = [small_config("fedavg", seed=s, **base) for s in (0, 1)]
    for cfg, got in zip(cfgs, train_stacked(ds.x, ds.y, ds.num_classes, part, cfgs)):
        assert got.error is None, got.error
        assert_equal(got.run.model["weights"]["client"],
                     train_federated(ds.x, ds.y, ds.num_classes, part, cfg).model["weights"]["client"])


@pytest.mark.parametrize("name", ["fedavg", "fedprox"])
def test_bad_sam_rho_is_refused_in_one_line(name):
    """A negative radius: the rule, the value and the fix; a value that is no finite number is refused by the
    config's typing layer before (its own one line)."""
    with pytest.raises(ConfigError) as err:
        train_config(name, sam_rho=-0.1)
    assert str(err.value) == (f"sam_rho must be a finite number >= 0 for {name} (the SAM radius of every local "
                              "step); got -0.1. Use 0 for plain local SGD, or a radius such as SAM's 0.05 (Foret et "
                              "al. 2021).")
    for value in (float("inf"), float("nan"), True, "0.1x"):
        with pytest.raises(ConfigError, match=r"^sam_rho must be a (finite )?number; got [^\n]*\.$"):
            train_config(name, sam_rho=value)


def test_fedsam_keeps_its_papers_radius_and_refuses_0():
    assert train_config("fedsam").sam_rho == 0.05 and train_config("fedavg").sam_rho == 0.0
    assert train_config("fedprox").sam_rho == 0.0
    with pytest.raises(ConfigError, match=r"^sam_rho must be a finite number > 0 for fedsam; got 0.0\.$"):
        train_config("fedsam", sam_rho=0.0)


def test_the_paths_that_would_take_plain_steps_refuse_sam_rho(store, monkeypatch):
    from pfl_cli.interop.flower_app import check_deployable

    with pytest.raises(ConfigError, match=r"^flower app: sam_rho is not deployed on Flower \(its nodes take plain "
                                          r"SGD steps\); got 0.1; drop it\.$"):
        check_deployable(train_config("fedavg", sam_rho=0.1, val_fraction=0.0))
    check_deployable(train_config("fedavg", val_fraction=0.0))  # 0: plain steps, deployed as before
    alg = alg_for(store, algorithm="fedavg", sam_rho=0.1)
    idx = torch.arange(4).view(1, 4)  # one client, one batch of 4
    x, y = store.inputs(idx), store.y[idx]
    with pytest.raises(InputError, match=r"uploads SAM steps, which pflx attack does not model"):
        alg.upload(x, y, steps=2)
    assert set(alg.upload(x, y, steps=0)[0]) == {f"grad/{k}" for k in alg.global_params}  # FedSGD: no local step
    from pfl_cli.fl.distributed import check_world_size

    with pytest.raises(InputError, match=r"^--nproc / torchrun: --algorithm fedprox runs in one process only: its "
                                         r"SAM local steps \(sam_rho 0.1\) are not split across ranks "
                                         r"\(sam_rho=0's plain steps are\); drop --nproc"):
        check_world_size(train_config("fedprox", sam_rho=0.1), 2, torch.device("cpu"))  # before any rank starts
    check_world_size(train_config("fedprox"), 2, torch.device("cpu"))
    monkeypatch.setattr("pfl_cli.fl.distributed.world", lambda: (0, 2))  # a rank of a library caller's world
    with pytest.raises(InputError, match=r"^--nproc / torchrun: fedavg with sam_rho 0.1 runs in one process only"):
        alg_for(store, algorithm="fedavg", sam_rho=0.1)
    alg_for(store, algorithm="fedavg")  # without SAM it builds under a world of 2 as before
