"""FedALA's every-client ALA and FedCP's global head as the authors' code (the one PFLlib ships) computes them.

Both were found by the conformance check against PFLlib (issue 39, defect 6): PFLlib's FedALA runs
ALA on every client each round and scores those models (``serverala.py`` ``send_models``), and its
FedCP uploads 0.5 h^p + 0.5 h^g for the next global head (``clientcp.py`` ``generate_upload_head``).
"""

import torch

from pfl_cli.fl.store import ROLE_TRAIN
from baseline_support import alg_factory, close, cohort, gen
from pflx_testing import small_config

BASE = small_config(mlp_hidden=(16,), local_steps=4, batch_size=8, lr=0.05, clients_per_round=4, new_client_epochs=1,
                    ala_max_start_epochs=6, ala_num_pre_loss=3, momentum=0.0, client_clip=0.0)
alg_for = alg_factory(BASE)


def test_every_client_ala_aggregates_every_train_client_with_the_new_global_model(store):
    """Round 1 trains the cohort from the global model; then every train client, in the cohort or not,
    holds ALA(its local model, the new global model): the lower layers are the new global model's, the
    top layer lies between its local model and the global one. Round 2's cohort trains from those."""
    alg = alg_for(store, algorithm="fedala", ala_every_client=True)
    train = torch.as_tensor(store.clients(ROLE_TRAIN))
    c = cohort(store)
    init = {k: v.clone() for k, v in alg.global_params.items()}
    alg.run_round(0, c, gen(0))
    assert bool(alg.private.has[train].all())  # every train client now has a local model, not only the cohort
    glob = alg.global_params
    assert not torch.equal(glob[alg.top[0]], init[alg.top[0]])
    rows = alg.private.gather(train)
    outside = torch.as_tensor([int(i) for i in train if int(i) not in set(c.tolist())])
    out_rows = alg.private.gather(outside)
    for k in glob:
        if k not in alg.top:  # the layers below the top take the new global model, for every train client
            torch.testing.assert_close(rows[k], glob[k].expand_as(rows[k]), rtol=0, atol=0)
    for k in alg.top:  # a client outside the cohort: its local model is the initial one, mixed by W in [0, 1]
        w = out_rows[f"W.{k}"]
        assert float(w.min()) >= 0 and float(w.max()) <= 1
        torch.testing.assert_close(out_rows[k], init[k] + (glob[k] - init[k]) * w)
    assert bool((rows["ala_started"] > 0).all())
    # round 2: the cohort starts from its stored (ALA-aggregated) model, not from the global model
    stored = {k: v.clone() for k, v in alg.private.gather(c).items() if k in glob}
    ref = alg_for(store, algorithm="fedala", ala_every_client=True)
    ref.load_state(alg.state())
    g = gen(1)
    theta, _, _ = ref.cohort_sgd({k: v.clone() for k, v in stored.items()}, c, g, **ref.round_schedule())
    alg.run_round(1, c, gen(1))
    w = store.fit.length[c].double()
    w = w / w.sum()
    close(alg.global_params, {k: sum(float(w[i]) * v[i] for i in range(len(c))) for k, v in theta.items()})
    # the served personalized model of a train client is its ALA-aggregated model
    own = alg.own_models(train)
    close({k: own[k] for k in glob}, {k: v for k, v in alg.private.gather(train).items() if k in glob})


def test_cohort_only_ala_stays_the_default_and_leaves_other_clients_alone(store):
    alg = alg_for(store, algorithm="fedala")
    assert alg.cfg.ala_every_client is False
    train = torch.as_tensor(store.clients(ROLE_TRAIN))
    c = cohort(store)
    alg.run_round(0, c, gen(0))
    outside = torch.as_tensor([int(i) for i in train if int(i) not in set(c.tolist())])
    assert not bool(alg.private.has[outside].any())
    every = alg_for(store, algorithm="fedala", ala_every_client=True)
    every.run_round(0, c, gen(0))
    assert bool(every.private.has[outside].all())


def test_fedcp_next_global_head_averages_half_personalized_half_global(store):
    """h^g_{t+1} = sum_i w_i (0.5 h^p_i + 0.5 h^g_t) (the authors' clientcp.py generate_upload_head, then the
    size-weighted mean of servercp.py global_head), not the mean of the personalized heads alone."""
    alg = alg_for(store, algorithm="fedcp")
    c = cohort(store)
    g0 = torch.Generator().manual_seed(3)  # a global head unlike the personalized ones
    alg.global_params = {k: (v + 0.5 * torch.randn(v.shape, generator=g0) if k.startswith("head_g.") else v)
                         for k, v in alg.global_params.items()}
    before = {k: v.clone() for k, v in alg.global_params.items()}
    alg.run_round(0, c, gen())
    heads = alg.private.gather(c)
    w = store.fit.length[c].double()
    w = w / w.sum()
    for g_, p in alg.pairs.items():
        mean_p = sum(float(w[i]) * heads[p][i] for i in range(len(c)))
        torch.testing.assert_close(alg.global_params[g_], 0.5 * mean_p + 0.5 * before[g_])
        assert not torch.allclose(alg.global_params[g_], mean_p, atol=1e-3)


def test_pfedla_flbench_direction_is_pflx_step_negated(store):
    """benchmarks/pfedla_hn_lr.py's FL-bench direction: from the same state, one round moves every client's
    hypernetwork by exactly minus pflx's step (pflx: descent on 1/2 ||theta' - theta_bar||^2, pFedHN §3), and
    leaves local training alone (the same trained models)."""
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
    try:
        import pfedla_hn_lr
    finally:
        sys.path.pop(0)
    from pfl_cli.algorithms import pfedla

    make = alg_factory(small_config(mlp_hidden=(16,), local_steps=4, batch_size=8, lr=0.05, clients_per_round=4,
                                    pfedla_hidden=16, pfedla_embed_dim=8, pfedla_hn_lr=10.0, momentum=0.0,
                                    client_clip=0.0))
    c = cohort(store)
    ours, theirs = make(store, algorithm="pfedla"), make(store, algorithm="pfedla")
    start = {k: v.clone() for k, v in ours.private.gather(c).items()}
    ours.run_round(0, c, gen(0))
    original = pfedla.PFedLA.run_round
    try:
        pfedla_hn_lr.flbench_direction()
        theirs.run_round(0, c, gen(0))
    finally:
        pfedla.PFedLA.run_round = original
    a, b = ours.private.gather(c), theirs.private.gather(c)
    moved = 0
    for k in start:
        if k.startswith(("hn.", "v")):
            torch.testing.assert_close(b[k] - start[k], -(a[k] - start[k]), rtol=1e-4, atol=1e-6)
            moved += int(not torch.equal(a[k], start[k]))
        else:  # theta: the trained models do not depend on the hypernetwork's step of this round
            torch.testing.assert_close(a[k], b[k], rtol=0, atol=0)
    assert moved > 0
