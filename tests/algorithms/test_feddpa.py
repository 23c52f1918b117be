"""FedDPA (Yang et al., NeurIPS 2024) on a built-in net: what it averages and keeps, and its instance-wise weights.

Tiny runs (digits, MLP 64-16-10, 3 rounds of 3 steps). The server's global adapter and classifier after a round are
the size-weighted mean of the cohort's; each client keeps its local adapter; the prediction of every instance equals
a slow per-instance reference (a cosine against each of the client's training instances, one at a time).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from pfl_cli import registry
from pfl_cli.fl.api import train_federated

SMALL = dict(rounds=3, clients_per_round=3, local_steps=3, batch_size=8, eval_every=3, mlp_hidden=(16,),
             lr=0.1, lora_rank=2, new_client_epochs=0)


def run(digits_clients, **values):
    ds, part = digits_clients
    cfg = registry.train_config("feddpa", **{**SMALL, **values})
    return train_federated(ds.x, ds.y, ds.num_classes, part, cfg, device=torch.device("cpu"))


def size_mean(store, cohort, v):
    w = store.fit.length[cohort].to(torch.float32)
    return torch.einsum("c,c...->...", w / w.sum(), v)


def test_feddpa_averages_the_global_adapter_and_keeps_the_local_one(digits_clients, monkeypatch):
    from pfl_cli.algorithms.feddpa import FedDPA

    seen = []
    real = FedDPA.local_update

    def spy(self, start, cohort, gen):
        theta, loss = real(self, start, cohort, gen)
        seen.append((cohort.clone(), {k: v.clone() for k, v in start.items()},
                     {k: v.clone() for k, v in theta.items()}))
        return theta, loss

    monkeypatch.setattr(FedDPA, "local_update", spy)
    alg = run(digits_clients).algorithm
    assert len(seen) == 3
    local = [k for k in alg.global_params if ".local_A." in k or ".local_B." in k]
    assert local and set(alg.private_names) == set(local) and not set(alg.shared) & set(local)
    cohort, start, theta = seen[-1]
    for k in alg.shared:  # the last round's global adapter and classifier: the cohort's size-weighted mean
        torch.testing.assert_close(alg.global_params[k], size_mean(alg.store, cohort, theta[k]), rtol=0, atol=1e-6)
    mine = alg.private.gather(cohort)
    for k in local:  # each cohort client keeps its own, trained local adapter (round 2 on), distinct per client
        assert torch.equal(mine[k], theta[k]) and not torch.equal(theta[k][0], theta[k][1])
    assert any(not torch.equal(theta[k], start[k]) for k in local)
    # round 1 trains no local adapter (FedDPA-T's local phase starts in the second round)
    assert all(torch.equal(seen[0][2][k], seen[0][1][k]) for k in local)
    assert set(alg.exchanged()["up"]) == set(alg.shared)


def _reference_logits(alg, params: dict, x: torch.Tensor, train_x: torch.Tensor) -> torch.Tensor:
    """The slow reference of §4.3: for each instance alone, its cosine to each training instance one at a time
    (representations from the base net's own ``features`` under the local adapter alone), then its weighted net."""
    import copy

    from pfl_cli.models.lora import set_mix

    net = copy.deepcopy(alg.net)
    with torch.no_grad():
        for k, p in net.named_parameters():
            p.copy_(params["net." + k])
    w = float(params["max_weight"])

    def features(xi):
        set_mix(net, (0.0, 1.0))
        try:
            return net.model.features(xi[None])[0]
        finally:
            set_mix(net, None)

    rows = []
    with torch.no_grad():
        for xi in x:
            h = features(xi)
            sims = [float(torch.nn.functional.cosine_similarity(h, features(xj), dim=0)) for xj in train_x]
            lam = w * min(max(sum(sims) / len(sims), 0.0), 1.0)
            set_mix(net, (1.0 - lam, lam))
            try:
                rows.append(net(xi[None])[0])
            finally:
                set_mix(net, None)
    return torch.stack(rows)


def test_prediction_weights_each_instance_against_a_slow_reference(digits_clients):
    from pfl_cli.fl.evaluate import forward_chunks

    out = run(digits_clients, dpa_max_weight=0.9)
    alg = out.algorithm
    store = alg.store
    clients = np.asarray(store.clients(0))[:2]
    params, personalized = alg.personalize(clients, torch.Generator().manual_seed(0))
    assert personalized and params["reference"].shape[0] == 2
    for rows, idx, valid, logits in forward_chunks(alg.predict_net, params, store, clients, "test",
                                                   personalized=True):
        for r in range(len(clients))[rows]:
            own = {k: v[r] for k, v in params.items()}
            fit_idx, n = store.fit.rows(torch.as_tensor(clients[r:r + 1]))
            train_x = store.inputs(fit_idx[0, :int(n[0])])
            test_x = store.inputs(idx[r - rows.start][valid[r - rows.start]])
            want = _reference_logits(alg, own, test_x, train_x)
            torch.testing.assert_close(logits[r - rows.start][valid[r - rows.start]], want, rtol=1e-4, atol=1e-5)


def test_a_new_client_without_epochs_gets_the_global_model(digits_clients):
    alg = run(digits_clients).algorithm
    store = alg.store
    new = np.asarray(store.clients(1))[:1]
    params, _ = alg.personalize(new, torch.Generator().manual_seed(0))
    idx, n = store.test.rows(torch.as_tensor(new))
    x = store.inputs(idx[0, :int(n[0])])
    got = torch.func.functional_call(alg.predict_net, {k: v[0] for k, v in params.items()}, (x,))
    net, glob = alg.global_model()
    want = torch.func.functional_call(net, glob, (x,))
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("key, value, message", [
    ("dpa_train_weight", 0.0, r"dpa_train_weight must be a number in \(0, 1\]"),
    ("dpa_max_weight", 1.5, r"dpa_max_weight must be a number in \[0, 1\]"),
    ("lora_rank", 0, "lora_rank must be an integer >= 1"),
])
def test_bad_keys_are_refused(key, value, message):
    from pfl_cli.errors import ConfigError

    with pytest.raises(ConfigError, match=message):
        registry.train_config("feddpa", **{key: value})
