"""``finetune_adapters=lora`` (pfl_cli/fl/finetune.py): serving by fine-tuning fresh LoRA adapters and the classifier
over the frozen global model. A tiny FedAvg run (digits, MLP 64-16-10), then its fine-tuning watched weight by weight
and against a plain torch.optim.SGD loop over clients; bad settings refused in one line."""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch

from pfl_cli import registry
from pfl_cli.errors import ConfigError
from pfl_cli.fl.api import train_federated
from pfl_cli.fl.finetune import adapter_finetune, finetune, merge_adapters, served_adapter_net

STEPS = 6
SGD = dict(lr=0.1, momentum=0.9, lambda_theta=1e-3, client_clip=1.0)  # every client-optimizer setting acts


def _train(digits_clients, **values):
    ds, part = digits_clients
    cfg = registry.train_config("fedavg", rounds=2, clients_per_round=3, batch_size=8, eval_every=2, local_steps=3,
                                mlp_hidden=(16,), finetune_steps=STEPS, **SGD, **values)
    return train_federated(ds.x, ds.y, ds.num_classes, part, cfg, device=torch.device("cpu"))


@pytest.fixture(scope="module")
def fedavg_run(digits_clients):
    return _train(digits_clients, finetune_adapters="lora", lora_rank=2, lora_alpha=4.0)


@pytest.fixture(scope="module")
def fedavg(fedavg_run):
    return fedavg_run.algorithm


def test_federated_training_is_unchanged(fedavg, digits_clients):
    """The global model trains in full either way: the run with full fine-tuning ends at the same weights."""
    full = _train(digits_clients).algorithm
    assert set(full.global_params) == set(fedavg.global_params)
    for k, v in full.global_params.items():
        assert torch.equal(v, fedavg.global_params[k]), k


def _clients(alg, role=0, k=4):
    return np.asarray(alg.store.clients(role))[:k]


def test_the_base_stays_the_global_model_and_only_adapters_and_classifier_move(fedavg):
    alg = fedavg
    clients = _clients(alg)
    net, theta = adapter_finetune(alg, alg.global_params, clients, torch.Generator().manual_seed(0), STEPS)
    assert net.targets == ["fc1"]  # every hidden layer before the classifier ('*'); the classifier trains in full
    assert set(theta) == {"model.fc1.lora_A.weight", "model.fc1.lora_B.weight", "model.fc2.weight", "model.fc2.bias"}
    buffers = dict(net.named_buffers())
    for k in ("fc1.weight", "fc1.bias"):  # the frozen base: the global model's weights, bit for bit
        assert torch.equal(buffers[f"model.{k.replace('.', '.base_layer.')}"], alg.global_params[k])
    b = theta["model.fc1.lora_B.weight"]
    assert all(torch.count_nonzero(b[i]) > 0 for i in range(len(clients)))  # B left zero: the adapters trained
    assert not torch.equal(b[0], b[1])                                      # each client its own
    assert not torch.equal(theta["model.fc2.weight"][0], alg.global_params["fc2.weight"])

    merged = merge_adapters(net, alg.global_params, theta)
    assert set(merged) == set(alg.global_params)
    for i in range(len(clients)):
        assert torch.equal(merged["fc1.bias"][i], alg.global_params["fc1.bias"])  # the base's bias is not trained
        a = theta["model.fc1.lora_A.weight"][i]
        want = alg.global_params["fc1.weight"] + (4.0 / 2) * b[i] @ a  # W + (alpha / r) B A
        torch.testing.assert_close(merged["fc1.weight"][i], want, rtol=0, atol=1e-6)
        assert torch.equal(merged["fc2.weight"][i], theta["model.fc2.weight"][i])
        # the merged full weights compute what the adapted net computes
        x = alg.store.inputs(alg.store.fit.index[clients[i], :8])
        adapted = torch.func.functional_call(net, {k: v[i] for k, v in theta.items()}, (x,))
        full = torch.func.functional_call(alg.net, {k: v[i] for k, v in merged.items()}, (x,))
        torch.testing.assert_close(full, adapted, rtol=1e-5, atol=1e-5)
    # the run's own model is untouched by serving
    assert torch.equal(finetune(alg, alg.global_params, clients, torch.Generator().manual_seed(0), STEPS)["fc1.weight"],
                       merged["fc1.weight"])


def _fit_loss(alg, params, clients, stacked):
    losses = []
    for i, c in enumerate(clients):
        n = int(alg.store.fit.length[c])
        idx = alg.store.fit.index[c, :n]
        p = {k: v[i] for k, v in params.items()} if stacked else params
        logits = torch.func.functional_call(alg.net, p, (alg.store.inputs(idx),))
        losses.append(float(torch.nn.functional.cross_entropy(logits, alg.store.y[idx])))
    return np.array(losses)


def test_finetuning_lowers_each_clients_training_loss(fedavg):
    alg = fedavg
    clients = np.concatenate([_clients(alg, 0, 4), _clients(alg, 1, 2)])  # train and holdout clients
    params, personalized = alg.personalize(clients, torch.Generator().manual_seed(1))
    assert personalized and set(params) == set(alg.global_params)
    before = _fit_loss(alg, alg.global_params, clients, stacked=False)
    after = _fit_loss(alg, params, clients, stacked=True)
    assert np.all(after < before), (before, after)
    assert alg.protocol(True)["protocol"] == ("global model frozen, LoRA adapters (rank 2) and classifier fine-tuned "
                                              f"{STEPS} local steps")


def test_the_batched_cohort_equals_torch_sgd_one_client_at_a_time(fedavg):
    """A plain loop over clients, each a LoRANet over the global model trained by torch.optim.SGD (momentum, weight
    decay, clipping) on the same batches, gives the adapters and classifier of the batched path."""
    alg = fedavg
    clients = _clients(alg, 0, 4)
    _, fast = adapter_finetune(alg, alg.global_params, clients, torch.Generator().manual_seed(2), STEPS)
    net = served_adapter_net(alg, alg.global_params)
    index, mask, _ = alg.local_batches(torch.as_tensor(clients), torch.Generator().manual_seed(2),
                                       steps=STEPS).materialize()
    for i in range(len(clients)):
        ref = copy.deepcopy(net)
        params = [p for _, p in ref.named_parameters()]
        opt = torch.optim.SGD(params, lr=SGD["lr"], momentum=SGD["momentum"], weight_decay=2 * SGD["lambda_theta"])
        for s in range(STEPS):
            idx, m = index[i, s], mask[i, s]
            ce = torch.nn.functional.cross_entropy(ref(alg.store.inputs(idx)), alg.store.y[idx], reduction="none")
            loss = (ce * m).sum() / m.sum()
            opt.zero_grad()
            loss.backward()
            torch.nn.utils.clip_grad_norm_(params, SGD["client_clip"])
            opt.step()
        for k, p in ref.named_parameters():
            torch.testing.assert_close(fast[k][i], p.detach(), rtol=1e-5, atol=1e-6)


def test_predict_serves_new_clients_adapters_or_with_no_steps_the_global_model(fedavg_run, digits_clients):
    """``predict --clients holdout``: each new client's merged model (the base's bias the global one, its adapted
    weight its own); ``--finetune-steps 0`` serves the global model (no adapters to fine-tune)."""
    from pfl_cli.fl.api import predict_clients
    from pfl_cli.fl.config import PredictConfig

    ds, part = digits_clients
    cfg, g = fedavg_run.algorithm.cfg, fedavg_run.algorithm.global_params
    served = predict_clients(fedavg_run.model, cfg, ds.x, ds.y, ds.num_classes, part,
                             PredictConfig(clients="holdout", save_models=True), device="cpu")
    assert served.personalized and served.protocol["protocol"].startswith("global model frozen, LoRA adapters")
    assert served.optimizer_steps == STEPS * len(served.clients)
    p = served.params
    assert all(torch.equal(p["fc1.bias"][i], g["fc1.bias"]) for i in range(len(served.clients)))
    assert not torch.equal(p["fc1.weight"][0], g["fc1.weight"]) and not torch.equal(p["fc1.weight"][0],
                                                                                     p["fc1.weight"][1])
    plain = predict_clients(fedavg_run.model, cfg, ds.x, ds.y, ds.num_classes, part,
                            PredictConfig(clients="holdout", finetune_steps=0, save_models=True), device="cpu")
    assert plain.protocol["protocol"] == "global model" and not plain.personalized and plain.optimizer_steps == 0


@pytest.mark.parametrize("values, message", [
    ({"finetune_adapters": "lora"}, "finetune_adapters=lora has no effect on fedavg with finetune_steps 0"),
    ({"lora_rank": 4}, "lora_rank has no effect on fedavg with finetune_adapters=full"),
    ({"finetune_adapters": "lora", "finetune_steps": 3, "lora_rank": 0}, "lora_rank must be an integer >= 1 for "
                                                                         "fedavg; got 0"),
    ({"finetune_adapters": "lora", "finetune_steps": 3, "lora_alpha": -1.0},
     "lora_alpha must be a finite number > 0 for fedavg; got -1.0"),
    ({"finetune_adapters": "dora", "finetune_steps": 3}, "finetune_adapters must be one of full, lora"),
    ({"finetune_adapters": "lora", "finetune_steps": 3, "backbone": "resnet-micro"},
     "finetune_adapters=lora on fedavg adapts model_arch's net; got backbone 'resnet-micro'"),
])
def test_bad_settings_are_refused(values, message):
    with pytest.raises(ConfigError, match=message):
        registry.train_config("fedavg", **values)


def test_targets_matching_no_layer_are_refused_before_any_round(digits_clients):
    ds, part = digits_clients
    cfg = registry.train_config("fedbuff", rounds=1, mlp_hidden=(16,), finetune_steps=2, finetune_adapters="lora",
                                lora_targets="conv*")
    with pytest.raises(ConfigError, match="lora_targets 'conv\\*' matches none of the base net's linear"):
        train_federated(ds.x, ds.y, ds.num_classes, part, cfg, device=torch.device("cpu"))


def test_the_lora_algorithms_take_no_finetune_adapters():
    """FedIT's and FFA-LoRA's fine-tuning already trains their adapters: the key is theirs to refuse (unknown)."""
    for name in ("fedit", "ffa-lora"):
        assert "finetune_adapters" not in registry.get(name).keys


@pytest.mark.slow
def test_stacked_runs_fine_tune_as_their_separate_runs(digits_clients):
    """Runs stacked in threads (pfl_cli.fl.stack) evaluate after the same fine-tuning as each run alone: the adapters'
    start comes from each run's own generator, never torch's global one (a shared one raced between the threads)."""
    import dataclasses

    from pfl_cli.fl.stack import train_stacked

    ds, part = digits_clients
    base = registry.train_config("fedavg", rounds=2, clients_per_round=3, batch_size=8, eval_every=1, local_steps=3,
                                 mlp_hidden=(16,), finetune_steps=4, finetune_adapters="lora", lora_rank=2, lr=0.1)
    cfgs = [base, dataclasses.replace(base, seed=1, lr=0.05), dataclasses.replace(base, seed=2, lr=0.07)]
    stacked = train_stacked(ds.x, ds.y, ds.num_classes, part, cfgs, device=torch.device("cpu"))
    for cfg, got in zip(cfgs, stacked):
        assert got.error is None
        alone = train_federated(ds.x, ds.y, ds.num_classes, part, cfg, device=torch.device("cpu"))
        assert got.run.outcome.history == alone.outcome.history
        for k, v in alone.algorithm.global_params.items():
            assert torch.equal(got.run.algorithm.global_params[k], v)


def test_merged_convolution_adapters_compute_the_adapted_net():
    """LeNet's convolutions and linear layers: ``W + (alpha / r) B A`` (a convolution's ``A`` with the base's kernel,
    ``B`` 1x1) computes what the LoRA layers compute, for two clients' random adapters and classifiers."""
    from pfl_cli.models import client_model
    from pfl_cli.models.lora import LoRANet, match_targets

    torch.manual_seed(0)
    base = client_model("lenet", (3, 32, 32), 10)
    start = {k: v.detach().clone() for k, v in base.named_parameters()}
    net = LoRANet(copy.deepcopy(base), match_targets(base, "*", 2), rank=2, alpha=4.0)
    assert any(isinstance(base.get_submodule(t), torch.nn.Conv2d) for t in net.targets)
    theta = {k: torch.randn(2, *v.shape) * 0.1 for k, v in net.named_parameters()}
    merged = merge_adapters(net, start, theta)
    x = torch.randn(5, 3, 32, 32)
    for i in range(2):
        adapted = torch.func.functional_call(net, {k: v[i] for k, v in theta.items()}, (x,))
        full = torch.func.functional_call(base, {k: v[i] for k, v in merged.items()}, (x,))
        torch.testing.assert_close(full, adapted, rtol=1e-4, atol=1e-5)
