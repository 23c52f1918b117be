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


@pytest.fixture(scope="module")
def trained(digits_clients):
    """One tiny run (w = 0.9), each round's cohort, start and trained adapters recorded."""
    from pfl_cli.algorithms.feddpa import FedDPA

    seen = []
    real = FedDPA.local_update

    def spy(self, start, cohort, gen):
        theta, loss = real(self, start, cohort, gen)
        seen.append((cohort.clone(), {k: v.clone() for k, v in start.items()},
                     {k: v.clone() for k, v in theta.items()}))
        return theta, loss

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(FedDPA, "local_update", spy)
        alg = run(digits_clients, dpa_max_weight=0.9).algorithm
    return alg, seen


def test_feddpa_averages_the_global_adapter_and_keeps_the_local_one(trained):
    alg, seen = trained
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


def test_prediction_weights_each_instance_against_a_slow_reference(trained):
    from pfl_cli.fl.evaluate import forward_chunks

    alg, _ = trained
    store = alg.store
    clients = np.asarray(store.clients(0))[:1]
    params, personalized = alg.personalize(clients, torch.Generator().manual_seed(0))
    assert personalized and params["reference"].shape[0] == 1
    for rows, idx, valid, logits in forward_chunks(alg.predict_net, params, store, clients, "test",
                                                   personalized=True):
        for r in range(len(clients))[rows]:
            own = {k: v[r] for k, v in params.items()}
            fit_idx, n = store.fit.rows(torch.as_tensor(clients[r:r + 1]))
            train_x = store.inputs(fit_idx[0, :int(n[0])])
            test_x = store.inputs(idx[r - rows.start][valid[r - rows.start]])
            want = _reference_logits(alg, own, test_x, train_x)
            torch.testing.assert_close(logits[r - rows.start][valid[r - rows.start]], want, rtol=1e-4, atol=1e-5)


def test_a_new_client_without_epochs_gets_the_global_model(trained):
    alg, _ = trained
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


@pytest.mark.peft
@pytest.mark.slow
def test_predict_save_models_writes_both_adapters_that_peft_loads(tmp_path, cli):
    """``predict --save-models`` writes each client's global and local adapter in peft's format; peft loads both as
    named adapters of one model over the same base net, and each alone gives pflx's logits with that adapter alone."""
    import json

    from peft import PeftModel

    from pfl_cli.algorithms.base import seeded
    from pfl_cli.models import build
    from pfl_cli.models.lora import set_mix

    part, model, pred = tmp_path / "part", tmp_path / "model", tmp_path / "pred"
    assert cli("partition", "--dataset", "builtin:digits", "--classes-per-client", "2", "--num-clients", "4",
               "--holdout-clients", "1", "--out", part, "--format", "quiet").code == 0
    run_ = cli("train", "--partition", part, "--algorithm", "feddpa", "--rounds", "2", "--clients-per-round", "2",
               "--set", "local_steps=2", "--set", "lr=0.2", "--set", "mlp_hidden=[16]", "--set", "lora_rank=2",
               "--set", "new_client_epochs=0", "--out", model, "--format", "quiet")
    assert run_.code == 0, run_.err
    got = cli("predict", "--model", model, "--partition", part, "--clients", "train", "--save-models", "--out", pred,
              "--format", "quiet")
    assert got.code == 0, got.err
    saved = torch.load(pred / "models.pt", weights_only=True)
    spec = torch.load(model / "model.pt", weights_only=True)["arch"]["client"]
    i, cid = 0, int(saved["client_id"][0])
    folder = pred / "adapters" / f"client-{cid}"
    info = json.loads((folder / "feddpa.json").read_text())
    assert info["max_weight"] == 0.5 and len(info["reference"]) == 16
    ours = seeded(0, "init-client", lambda: build(spec))  # the frozen base: the run's seeded initialization
    with torch.no_grad():
        for k, p in ours.named_parameters():
            p.copy_(saved["weights"]["net." + k][i])
    base = build(spec["base"])
    state = {k.replace(".base_layer.", "."): v for k, v in ours.model.state_dict().items() if "lora_" not in k
             and "local_" not in k}
    base.load_state_dict(state)
    peft_model = PeftModel.from_pretrained(base, str(folder / "global"), adapter_name="global")
    peft_model.load_adapter(str(folder / "local"), adapter_name="local")
    x = torch.randn(6, 64)
    for name, mix in (("global", None), ("local", (0.0, 1.0))):
        peft_model.set_adapter(name)
        set_mix(ours, mix)
        with torch.no_grad():
            torch.testing.assert_close(peft_model(x), ours(x), rtol=0, atol=1e-5)
        set_mix(ours, None)
