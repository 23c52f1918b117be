"""``adapters=lora`` (pfl_cli/fl/adapters.py): a full-weight method's personalized part as LoRA adapters on the frozen
base net. Tiny runs (digits, MLP 64-16-10): what each method then trains, keeps and exchanges; bad settings refused."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from pfl_cli import registry
from pfl_cli.errors import ConfigError
from pfl_cli.fl.api import train_federated

SMALL = dict(clients_per_round=3, batch_size=8, eval_every=2, mlp_hidden=(16,), lr=0.1, lora_rank=2,
             adapters="lora")


def run(name, digits_clients, **values):
    ds, part = digits_clients
    cfg = registry.train_config(name, **{**SMALL, **values})
    return train_federated(ds.x, ds.y, ds.num_classes, part, cfg, device=torch.device("cpu")).algorithm


def test_local_trains_only_the_adapters_and_classifier_on_the_frozen_base(digits_clients):
    from pfl_cli.models.lora import LoRANet

    alg = run("local", digits_clients, local_epochs=1)
    assert isinstance(alg.net, LoRANet)
    names = set(alg.init_params)
    assert names and all(".lora_A." in k or ".lora_B." in k or k.startswith(alg.net.classifier) for k in names)
    clients = np.asarray(alg.store.clients(0))[:2]
    params, personalized = alg.personalize(clients, torch.Generator().manual_seed(0))
    assert personalized and set(params) == names
    b = [k for k in names if ".lora_B." in k]
    assert all(torch.count_nonzero(params[k][0]) > 0 for k in b)  # B left zero: the adapters trained
    assert not torch.equal(params[b[0]][0], params[b[0]][1])       # each client its own
    frozen = [k for k, _ in alg.net.named_buffers() if "base_layer" in k]
    assert frozen and not set(frozen) & names                      # the base's weights are buffers, never trained


def test_fedrep_shares_the_adapters_and_keeps_the_classifier(digits_clients):
    alg = run("fedrep", digits_clients, rounds=2, head_epochs=1, new_client_epochs=0)
    adapters = [k for k in alg.global_params if ".lora_A." in k or ".lora_B." in k]
    assert adapters and set(alg.shared) == set(adapters)
    assert set(alg.private_names) == {k for k in alg.global_params if k.startswith(alg.net.classifier)}
    assert set(alg.exchanged()["up"]) == set(adapters)


@pytest.mark.parametrize("name, values, message", [
    ("local", {"lora_rank": 4}, "lora_rank has no effect on local with adapters=full"),
    ("fedrep", {"lora_targets": "fc1"}, "lora_targets has no effect on fedrep with adapters=full"),
    ("local", {"adapters": "lora", "backbone": "resnet-micro"}, "backbone has no effect on local with adapters=lora"),
    ("fedrep", {"adapters": "dora"}, "adapters must be one of full, lora"),
])
def test_bad_settings_are_refused(name, values, message):
    with pytest.raises(ConfigError, match=message):
        registry.train_config(name, **values)


@pytest.mark.parametrize("name", ["ditto", "apfl"])
def test_ditto_and_apfl_keep_personal_adapters_beside_the_global_ones(name, digits_clients):
    alg = run(name, digits_clients, rounds=2, local_steps=2, lr=0.02, new_client_epochs=0)
    names = {k for k, _ in alg.net.named_parameters()}
    assert all(".lora_A." in k or ".lora_B." in k or k.startswith(alg.net.classifier) for k in names)
    assert names <= set(alg.global_params)
    cohort = torch.as_tensor(np.asarray(alg.store.clients(0)))
    own = alg.private.gather(cohort)
    b = next(k for k in names if ".lora_B." in k)
    trained = [i for i in range(len(cohort)) if not torch.equal(own[b][i], torch.zeros_like(own[b][i]))]
    assert trained  # the sampled clients' personal B moved off zero, apart from the global one
    assert not torch.equal(own[b][trained[0]], alg.global_params[b])
