"""Hypernetworks generating LoRA adapters (issue 46, item 2): PeFLL-LoRA.

What the hypernetwork generates is exactly the LoRA client net's parameters (the adapters of the targeted layers and
the classifier) over one frozen base; a client never seen in training gets them from one descriptor and one forward
pass (no optimizer step), equal to a per-client reference computed one sample at a time; and the adapters ``pflx
predict --save-models`` exports for such clients load in peft and give pflx's logits.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from pfl_cli import registry
from pfl_cli.fl.api import train_federated
from pfl_cli.fl.store import ROLE_HOLDOUT

TINY = dict(rounds=2, clients_per_round=3, local_steps=2, batch_size=8, eval_every=2, mlp_hidden=(16,), lr=0.05,
            lora_rank=2, hyper_hidden=16, embed_dim=4)


def train(digits_clients, name, **values):
    ds, part = digits_clients
    cfg = registry.train_config(name, **{**TINY, **values})
    return train_federated(ds.x, ds.y, ds.num_classes, part, cfg, device=torch.device("cpu"))


def test_pefll_lora_generates_the_adapters_and_classifier_and_serves_new_clients_in_one_pass(digits_clients):
    run = train(digits_clients, "pefll-lora")
    alg = run.algorithm
    params = dict(alg.net.named_parameters())
    # the hypernetwork's heads are the LoRA net's parameters, nothing of the frozen base
    assert list(alg.hnet.target_shapes) == list(params)
    assert {k.split(".")[-2] for k in params if ".lora_" in k} == {"lora_A", "lora_B"}
    assert sum(p.numel() for p in params.values()) == sum(h.out_features for h in alg.hnet.heads)
    base = dict(alg.net.named_buffers())
    assert "model.fc1.base_layer.weight" in base and "model.fc1.base_layer.weight" not in params
    # the base stays the seeded frozen net the run started from
    fresh = alg.client_net()
    for k, b in fresh.named_buffers():
        assert torch.equal(b, base[k]), k

    store = alg.store
    holdout = store.clients(ROLE_HOLDOUT)
    steps = alg.client_sgd_steps
    theta, personalized = alg.personalize(holdout, torch.Generator().manual_seed(0))
    assert personalized and alg.client_sgd_steps == steps  # no optimizer step for a new client (Alg. 7)
    rows, length = store.fit.rows(torch.as_tensor(holdout))
    for i, j in enumerate(holdout):
        n = int(length[i])
        idx = rows[i, :n]
        with torch.no_grad():
            per_sample = torch.stack([alg.embed(store.inputs(idx[s:s + 1]), store.onehot(idx[s:s + 1]))[0]
                                      for s in range(n)])
            v = alg._standardize(per_sample.mean(0))
            want = alg.hnet(v)
        for k in params:
            torch.testing.assert_close(theta[k][i], want[k], rtol=1e-5, atol=1e-6, msg=f"client {j} {k}")


@pytest.mark.peft
def test_pefll_lora_adapters_of_new_clients_load_in_peft_with_pflx_logits(tmp_path, cli):
    """predict --save-models on holdout clients: each client's generated adapter, loaded with PeftModel over the
    user's base net, gives the logits of pflx's LoRA net with the generated parameters and predict's probabilities."""
    from peft import PeftModel
    from torch.func import functional_call

    from pfl_cli.data import load_dataset
    from pfl_cli.models import build, client_spec

    base_file = tmp_path / "base.pt"
    base_spec = client_spec("mlp", (64,), 10, (16,))
    gen = torch.Generator().manual_seed(3)
    torch.save({k: torch.randn(v.shape, generator=gen) * 0.2 for k, v in build(base_spec).state_dict().items()},
               base_file)
    part = tmp_path / "part"
    assert cli("partition", "--dataset", "builtin:digits", "--classes-per-client", "2", "--num-clients", "6",
               "--holdout-clients", "2", "--out", part, "--format", "quiet").code == 0
    model = tmp_path / "model"
    run = cli("train", "--partition", part, "--algorithm", "pefll-lora", "--rounds", "2", "--clients-per-round", "2",
              "--set", "local_steps=2", "--set", "mlp_hidden=[16]", "--set", "lora_rank=3", "--set", "lora_alpha=6",
              "--set", f"lora_base_weights={base_file}", "--set", "normalize=false", "--set", "hyper_hidden=16",
              "--out", model, "--format", "quiet")
    assert run.code == 0, run.err
    out = tmp_path / "pred"
    run = cli("predict", "--model", model, "--partition", part, "--clients", "holdout", "--save-models", "--out", out,
              "--format", "quiet")
    assert run.code == 0, run.err
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["new_clients"] == 2 and metrics["optimizer_steps"] == 0
    pred = np.load(out / "predictions.npz")
    saved = torch.load(out / "models.pt", weights_only=True)
    spec = torch.load(model / "model.pt", weights_only=True)["arch"]["client"]
    ours = build(spec)
    x_all = torch.as_tensor(load_dataset("builtin:digits").x, dtype=torch.float32)
    assert sorted(p.name for p in (out / "adapters").iterdir()) == [f"client-{int(c)}" for c in saved["client_id"]]
    for i, cid in enumerate(saved["client_id"].tolist()):
        rows = pred["client_id"] == cid
        x = x_all[torch.as_tensor(pred["sample"][rows])]
        base = build(base_spec)
        base.load_state_dict(torch.load(base_file, weights_only=True))
        peft_model = PeftModel.from_pretrained(base, str(out / "adapters" / f"client-{cid}")).eval()
        with torch.no_grad():
            theirs = peft_model(x)
            mine = functional_call(ours, {k: v[i] for k, v in saved["weights"].items()}, (x,))
        torch.testing.assert_close(theirs, mine, rtol=0, atol=1e-5)
        np.testing.assert_allclose(torch.softmax(theirs.double(), -1).numpy(), pred["probabilities"][rows],
                                   rtol=0, atol=1e-5)
    # generated per client: the two new clients' adapters differ
    assert not torch.equal(*[saved["weights"]["model.fc1.lora_B.weight"][i] for i in range(2)])


def test_pfedhn_lora_generates_adapters_from_embeddings_and_fits_new_clients_with_phi_frozen(digits_clients):
    from pfl_cli.fl.store import ROLE_TRAIN

    run = train(digits_clients, "pfedhn-lora", embed_rounds=2)
    alg = run.algorithm
    params = dict(alg.net.named_parameters())
    assert list(alg.hnet.target_shapes) == list(params) and all(".base_layer." not in k for k in params)
    train_clients = alg.store.clients(ROLE_TRAIN)[:3]
    theta, _ = alg.personalize(train_clients, torch.Generator().manual_seed(0))
    with torch.no_grad():  # a train client's adapters: h of its trained embedding row (Alg. 1)
        want = alg.hnet(alg.table.weight[alg.row_of[torch.as_tensor(train_clients)]])
    for k in params:
        assert torch.equal(theta[k], want[k]), k
    phi = {k: v.clone() for k, v in alg.hnet.state_dict().items()}
    holdout = alg.store.clients(ROLE_HOLDOUT)
    before = alg.new_client_steps
    theta, _ = alg.personalize(holdout, torch.Generator().manual_seed(0))
    assert alg.new_client_steps - before == 2 * len(holdout)  # embed_rounds server steps on each fresh embedding
    assert all(torch.equal(v, alg.hnet.state_dict()[k]) for k, v in phi.items())  # phi frozen
    assert all(theta[k].shape == (len(holdout), *params[k].shape) for k in params)
    assert not torch.equal(theta["model.fc1.lora_A.weight"][0], theta["model.fc1.lora_A.weight"][1])


@pytest.mark.slow
def test_hyperfl_lpm_lora_generates_lora_adapters_on_the_frozen_backbone(digits_clients):
    """The hypernetwork's outputs are the LoRA A and B of the backbone's layers (no bottleneck adapter), the
    classifier each client's own; the backbone stays its seeded frozen weights."""
    from pfl_cli.fl.store import ROLE_TRAIN

    ds, part = digits_clients
    x = np.kron(ds.x.reshape(-1, 1, 8, 8), np.ones((1, 1, 4, 4), dtype=ds.x.dtype))  # 1x32x32 images
    cfg = registry.train_config("hyperfl-lpm-lora", rounds=2, clients_per_round=2, eval_every=2, backbone="resnet-micro",
                                hyper_hidden=8, embed_dim=8, lora_rank=2, local_epochs=1)
    run = train_federated(x, ds.y, ds.num_classes, part, cfg, device=torch.device("cpu"))
    alg = run.algorithm
    params = dict(alg.net.named_parameters())
    assert alg.hnet.target_names == [k for k in params if ".lora_" in k] and alg.hnet.target_names
    assert alg.head_names == [k for k in params if ".lora_" not in k] == ["model.head.weight", "model.head.bias"]
    assert not any("adapters" in k for k, _ in alg.net.named_modules())
    for k, b in alg.client_net().named_buffers():
        assert torch.equal(b, dict(alg.net.named_buffers())[k]), k
    theta, personalized = alg.personalize(alg.store.clients(ROLE_TRAIN)[:2], torch.Generator().manual_seed(0))
    assert personalized and set(theta) == set(params)
