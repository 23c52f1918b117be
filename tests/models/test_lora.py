"""LoRA on a frozen base net (issue 46): peft's layer definitions, frozen base weights, targets and refusals."""

from __future__ import annotations

import copy

import pytest
import torch

from pfl_cli.errors import ConfigError, InputError
from pfl_cli.models import build, client_spec
from pfl_cli.models.lora import LoRANet, lora_parts, lora_spec, set_dropout


def lenet_spec():
    return client_spec("lenet", (1, 32, 32), 10)


def adapted(base: dict, **keys) -> dict:
    return lora_spec(base, build(base), **keys)


def test_base_weights_are_buffers_and_only_adapters_and_classifier_train():
    net = build(adapted(lenet_spec(), targets="*", rank=4, alpha=8.0, dropout=0.0))
    names = [k for k, _ in net.named_parameters()]
    parts = lora_parts(names)
    assert [k.rsplit(".lora_", 1)[0] for k in parts["A"]] == ["model.conv1", "model.conv2", "model.fc1", "model.fc2"]
    assert parts["head"] == ["model.fc3.weight", "model.fc3.bias"]
    assert "model.conv1.base_layer.weight" in dict(net.named_buffers())
    assert net.classifier == "model.fc3"
    # starts as its base: B is zero
    base = build(lenet_spec())
    base.load_state_dict({k.removeprefix("model.").replace(".base_layer", ""): v for k, v in net.state_dict().items()
                         if "lora_" not in k})
    x = torch.randn(3, 1, 32, 32)
    assert torch.equal(net(x), base(x))


def test_targets_patterns_and_refusals():
    spec = adapted(lenet_spec(), targets="conv*, fc2", rank=2, alpha=2.0, dropout=0.0)
    assert spec["targets"] == ["conv1", "conv2", "fc2"]
    with pytest.raises(ConfigError, match="matches none of the base net's linear or convolution layers"):
        adapted(lenet_spec(), targets="fc3", rank=2, alpha=2.0, dropout=0.0)  # the classifier trains in full
    with pytest.raises(InputError, match="plain client net"):
        lora_spec(client_spec("mlp-bn", (64,), 10), None, targets="*", rank=2, alpha=2.0, dropout=0.0)
    with pytest.raises(ConfigError, match="no such file"):
        adapted(lenet_spec(), targets="*", rank=2, alpha=2.0, dropout=0.0, weights="/nonexistent/base.pt")


def test_grouped_convolutions_take_adapters_only_where_their_groups_divide_the_rank():
    """peft's rule for a grouped (depthwise) convolution: its B is a grouped 1x1 convolution from r channels."""
    from torch import nn

    from pfl_cli.models.lora import match_targets

    class Depthwise(nn.Module):
        classifier = "fc"

        def __init__(self):
            super().__init__()
            self.stem, self.dw, self.pair = nn.Conv2d(3, 8, 3), nn.Conv2d(8, 8, 3, groups=8), nn.Conv2d(8, 8, 1, groups=2)
            self.fc = nn.Linear(8, 2)

        def forward(self, x):
            return self.fc(self.pair(self.dw(self.stem(x))).mean((2, 3)))

    net = Depthwise()
    assert match_targets(net, "*", rank=4) == ["stem", "pair"]
    assert match_targets(net, "*", rank=8) == ["stem", "dw", "pair"]
    with pytest.raises(ConfigError, match="'dw', a convolution of 8 groups, which an adapter of rank 4 cannot"):
        match_targets(net, "stem,dw", rank=4)
    LoRANet(net, match_targets(net, "*", rank=4), rank=4, alpha=4.0, dropout=0.0)(torch.randn(1, 3, 8, 8))


def test_user_base_weights_are_loaded_and_a_changed_file_refused(tmp_path):
    base = build(lenet_spec())
    state = {k: torch.full_like(v, 0.01) for k, v in base.state_dict().items()}
    path = tmp_path / "base.pt"
    torch.save(state, path)
    spec = adapted(lenet_spec(), targets="fc1", rank=2, alpha=2.0, dropout=0.0, weights=str(path))
    net = build(spec)
    assert torch.equal(net.model.fc1.base_layer.weight, state["fc1.weight"])
    torch.save({k: v * 2 for k, v in state.items()}, path)
    with pytest.raises(InputError, match="changed since the model was built"):
        build(spec)


def test_dropout_acts_in_training_mode_only():
    net = build(adapted(client_spec("mlp", (64,), 10, (16,)), targets="*", rank=4, alpha=4.0, dropout=0.5))
    with torch.no_grad():
        net.model.fc1.lora_B.weight.normal_()
    x = torch.randn(5, 64)
    assert torch.equal(net(x), net(x))  # built with dropout off
    set_dropout(net, True)
    torch.manual_seed(0)
    a = net(x)
    assert not torch.equal(a, net(x))
    set_dropout(net, False)


@pytest.mark.peft
@pytest.mark.parametrize("arch, shape, targets", [("lenet", (1, 32, 32), ["conv1", "conv2", "fc1"]),
                                                  ("mlp", (64,), ["fc1", "fc2"])])
def test_layers_equal_peft_on_the_same_weights(arch, shape, targets):
    """peft's LoRA (get_peft_model, LoraConfig with the same targets, r, alpha; the classifier in modules_to_save)
    on the same base weights and the same adapter weights gives pflx's LoRANet's logits."""
    from peft import LoraConfig, get_peft_model

    spec = client_spec(arch, shape, 10, (16, 12))
    base = build(spec)
    ours = LoRANet(copy.deepcopy(base), targets, rank=3, alpha=6.0, dropout=0.0)
    with torch.no_grad():
        for _, p in ours.named_parameters():
            p.normal_(0, 0.2)  # B nonzero: the adapters act
    config = LoraConfig(r=3, lora_alpha=6, lora_dropout=0.0, target_modules=targets,
                        modules_to_save=[base.classifier])
    theirs = get_peft_model(copy.deepcopy(base), config)
    mapped = {}
    for k, v in ours.named_parameters():
        k = k.removeprefix("model.")
        if ".lora_" in k:
            mapped[f"base_model.model.{k.replace('.weight', '.default.weight')}"] = v
        else:
            layer, leaf = k.rsplit(".", 1)
            mapped[f"base_model.model.{layer}.modules_to_save.default.{leaf}"] = v
    own = dict(theirs.named_parameters())
    assert set(mapped) <= set(own), sorted(set(mapped) - set(own))
    with torch.no_grad():
        for k, v in mapped.items():
            own[k].copy_(v)
    x = torch.randn(4, *shape)
    torch.testing.assert_close(ours(x), theirs(x), rtol=0, atol=1e-6)


@pytest.mark.peft
@pytest.mark.parametrize("arch, shape, targets, feedforward", [
    ("lenet", (1, 32, 32), ["conv1", "conv2", "fc1", "fc2"], ["conv2", "fc2"]),
    ("mlp", (64,), ["fc1", "fc2"], ["fc2"])])
def test_ia3_layers_equal_peft_on_the_same_weights(arch, shape, targets, feedforward):
    """peft's IA3 (get_peft_model, IA3Config with the same target and feed-forward modules; the classifier in
    modules_to_save) on the same base weights and the same vectors gives pflx's IA3 net's logits; the vectors
    start at one (the net starts as its base) and carry peft's names and shapes."""
    from peft import IA3Config, get_peft_model

    spec = client_spec(arch, shape, 10, (16, 12))
    base = build(spec)
    ours = LoRANet(copy.deepcopy(base), targets, adapter="ia3", feedforward=feedforward)
    x = torch.randn(4, *shape)
    assert torch.equal(ours(x), base(x))
    with torch.no_grad():
        for _, p in ours.named_parameters():
            p.normal_(1, 0.3)
    config = IA3Config(target_modules=targets, feedforward_modules=feedforward, modules_to_save=[base.classifier])
    theirs = get_peft_model(copy.deepcopy(base), config)
    mapped = {}
    for k, v in ours.named_parameters():
        k = k.removeprefix("model.")
        if k.endswith(".ia3_l"):
            mapped[f"base_model.model.{k}.default"] = v
        else:
            layer, leaf = k.rsplit(".", 1)
            mapped[f"base_model.model.{layer}.modules_to_save.default.{leaf}"] = v
    own = dict(theirs.named_parameters())
    assert set(mapped) <= set(own), sorted(set(mapped) - set(own))
    with torch.no_grad():
        for k, v in mapped.items():
            assert own[k].shape == v.shape, k
            own[k].copy_(v)
    torch.testing.assert_close(ours(x), theirs(x), rtol=0, atol=1e-6)
    assert lora_parts(k for k, _ in ours.named_parameters())["ia3"] == [f"model.{t}.ia3_l" for t in targets]
