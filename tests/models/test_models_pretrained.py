"""HyperFL-LPM's backbones (spec B.5): published key layouts, adapter counts, loading and its refusals."""

from __future__ import annotations

import sys

import pytest
import torch

from pfl_cli.errors import ConfigError, InputError
from pfl_cli.fl.split import split_names
from pfl_cli.models import build
from pfl_cli.models.pretrained import (
    BACKBONES,
    PretrainedNet,
    TokenAdapter,
    adapter_parameters,
    backbone_spec,
)


def timm_vit_keys(depth):
    """timm's ``vit_small_patch16_384`` state-dict keys, written out by hand (the ImageNet head left out)."""
    block = ["norm1.weight", "norm1.bias", "attn.qkv.weight", "attn.qkv.bias", "attn.proj.weight", "attn.proj.bias",
             "norm2.weight", "norm2.bias", "mlp.fc1.weight", "mlp.fc1.bias", "mlp.fc2.weight", "mlp.fc2.bias"]
    return (["cls_token", "pos_embed", "patch_embed.proj.weight", "patch_embed.proj.bias"]
            + [f"blocks.{i}.{k}" for i in range(depth) for k in block] + ["norm.weight", "norm.bias"])


def torchvision_resnet_keys(blocks):
    """torchvision's ``resnet18`` state-dict keys, written out by hand (``fc`` left out)."""
    bn = lambda p: [f"{p}.weight", f"{p}.bias", f"{p}.running_mean", f"{p}.running_var", f"{p}.num_batches_tracked"]  # noqa: E731
    keys = ["conv1.weight", *bn("bn1")]
    for i, n in enumerate(blocks, start=1):
        for j in range(n):
            p = f"layer{i}.{j}"
            keys += [f"{p}.conv1.weight", *bn(f"{p}.bn1"), f"{p}.conv2.weight", *bn(f"{p}.bn2")]
            if j == 0 and i > 1:
                keys += [f"{p}.downsample.0.weight", *bn(f"{p}.downsample.1")]
    return keys


def test_adapter_count_formula_matches_the_paper():
    """App. D.1: d = 384, reduction 16: 19,608 parameters per ViT-S block, 235,296 over its 12 blocks."""
    one = TokenAdapter(384, 24)
    assert sum(p.numel() for p in one.parameters()) == adapter_parameters(384) == 19_608
    assert 12 * adapter_parameters(384) == 235_296
    for name in ("vit-micro", "resnet-micro"):  # the built nets agree with the formula
        net = PretrainedNet(name, (3, 32, 32), 10)
        kind = "vit" if name.startswith("vit") else "resnet"
        counted = sum(p.numel() for k, p in net.named_parameters() if k.startswith("adapters."))
        assert counted == sum(adapter_parameters(w, kind) for w in net.backbone.adapter_widths())


def test_token_adapter_is_bottleneck_then_layernorm_then_residual():
    """HyperFL §3.3 / App. D.1 (the authors' adapter): x + LN(up(relu(down(x)))), the LayerNorm on the
    bottleneck's output, not on the adapter's input (issue 34, item 4). A hand-written forward pass with
    random weights is the reference; the pre-norm arrangement gives other numbers."""
    import torch.nn.functional as F

    torch.manual_seed(0)
    adapter = TokenAdapter(32, 4)
    with torch.no_grad():
        for p in adapter.parameters():
            p.normal_()
    x = torch.randn(2, 5, 32)
    w = dict(adapter.named_parameters())
    hidden = F.relu(x @ w["down.weight"].T + w["down.bias"])
    reference = x + F.layer_norm(hidden @ w["up.weight"].T + w["up.bias"], (32,), w["norm.weight"], w["norm.bias"],
                                 eps=1e-6)
    torch.testing.assert_close(adapter(x), reference)
    pre_norm = x + (F.relu(F.layer_norm(x, (32,), w["norm.weight"], w["norm.bias"], eps=1e-6) @ w["down.weight"].T
                           + w["down.bias"]) @ w["up.weight"].T + w["up.bias"])
    assert (adapter(x) - pre_norm).abs().max() > 0.1
    fresh = TokenAdapter(32, 4)  # starts as the identity, so a frozen backbone's features are kept at first
    torch.testing.assert_close(fresh(x), x)


def test_full_size_backbones_have_the_published_layouts_and_sizes():
    vit = PretrainedNet("vit-s16", (3, 32, 32), 10)
    assert list(vit.backbone.state_dict()) == timm_vit_keys(12)
    assert sum(t.numel() for t in vit.backbone.state_dict().values()) == 21_811_584  # timm: 22.2M with its head
    assert sum(p.numel() for k, p in vit.named_parameters() if k.startswith("adapters.")) == 235_296
    assert vit.backbone.pos_embed.shape == (1, 577, 384)  # 384 px / 16 = 24 x 24 patches + the class token
    res = PretrainedNet("resnet18", (3, 32, 32), 10, tune="probe")
    assert sorted(res.backbone.state_dict()) == sorted(torchvision_resnet_keys((2, 2, 2, 2)))
    weights = sum(t.numel() for k, t in res.backbone.state_dict().items() if "running" not in k and "num_batches" not in k)
    assert weights == 11_689_512 - 513_000  # torchvision resnet18 less its 1000-way fc
    assert [k for k, _ in res.named_parameters()] == ["head.weight", "head.bias"]  # probe: the classifier only


def test_tunes_decide_what_is_a_parameter():
    adapters = PretrainedNet("vit-micro", (64,), 10)
    body, head = split_names(adapters)
    assert head == ["head.weight", "head.bias"] and body and all(k.startswith("adapters.") for k in body)
    full = PretrainedNet("resnet-micro", (64,), 10, tune="full")
    assert {k.split(".")[0] for k, _ in full.named_parameters()} == {"backbone", "head"}
    assert not any(k.startswith("adapters") for k, _ in full.named_parameters())


def test_input_is_resized_inside_the_model():
    net = PretrainedNet("vit-micro", (64,), 10)
    seen = {}
    net.backbone.patch_embed.register_forward_pre_hook(lambda m, a: seen.update(shape=tuple(a[0].shape)))
    x = torch.randn(5, 64)  # 8 x 8 digits, flat
    out = net(x)
    assert out.shape == (5, 10) and seen["shape"] == (5, 3, 32, 32)
    ref = torch.nn.functional.interpolate(x.reshape(5, 1, 8, 8).expand(-1, 3, -1, -1), size=(32, 32), mode="bilinear")
    torch.testing.assert_close(net.to_image(x), ref)


def _published(name, path, *, drop=None, reshape=None, extra=None, head=True):
    """A state dict written in the published layout, with random values, optionally broken."""
    shape = BACKBONES[name]
    g = torch.Generator().manual_seed(1)
    model = PretrainedNet(name, (3, 32, 32), 10, tune="full").backbone
    keys = timm_vit_keys(shape.depth) if name.startswith("vit") else torchvision_resnet_keys(shape.blocks)
    ref = model.state_dict()
    state = {k: (torch.rand(ref[k].shape, generator=g) + 0.5).to(ref[k].dtype) for k in keys}
    if head:  # the published files carry their ImageNet classifier
        state.update({"head.weight": torch.zeros(1000, 64), "head.bias": torch.zeros(1000)} if name.startswith("vit")
                     else {"fc.weight": torch.zeros(1000, 32), "fc.bias": torch.zeros(1000)})
    if drop:
        del state[drop]
    if reshape:
        state[reshape] = torch.zeros(3, 3)
    if extra:
        state[extra] = torch.zeros(1)
    torch.save(state, path)
    return state


@pytest.mark.parametrize("name", ["vit-micro", "resnet-micro"])
def test_a_published_layout_state_dict_loads_by_key(tmp_path, name):
    state = _published(name, tmp_path / "w.pth")
    spec = backbone_spec(name, (1, 28, 28), 10, weights=str(tmp_path / "w.pth"))
    net = build(spec)
    for k, t in net.backbone.state_dict().items():
        assert torch.equal(t, state[k]), k
    assert len(spec["weights_sha256"]) == 64
    _published(name, tmp_path / "w.pth", head=False)  # the file changed after the spec was written
    with pytest.raises(InputError, match="changed since the model was built"):
        build(spec)


@pytest.mark.parametrize("break_, message", [
    ({"drop": "blocks.1.mlp.fc2.bias"}, r"key 'blocks.1.mlp.fc2.bias' is missing; vit-micro needs timm ViT keys"),
    ({"reshape": "pos_embed"}, r"key 'pos_embed' has shape \(3, 3\); vit-micro expects \(1, 17, 64\)"),
    ({"extra": "fc_norm.weight"}, r"unexpected key 'fc_norm.weight'; not a vit-micro state dict in the timm ViT layout"),
])
def test_a_wrong_state_dict_is_refused_naming_the_first_mismatch(tmp_path, break_, message):
    _published("vit-micro", tmp_path / "w.pth", **break_)
    with pytest.raises(InputError, match=message):
        build(backbone_spec("vit-micro", (3, 32, 32), 10, weights=str(tmp_path / "w.pth")))


def test_resnet_keys_are_not_a_vit(tmp_path):
    _published("resnet-micro", tmp_path / "r.pth")
    with pytest.raises(InputError, match="key 'cls_token' is missing; vit-micro needs timm ViT keys"):
        build(backbone_spec("vit-micro", (3, 32, 32), 10, weights=str(tmp_path / "r.pth")))


def test_safetensors_without_the_package_and_other_bad_files(tmp_path, monkeypatch):
    (tmp_path / "w.safetensors").write_bytes(b"\x00" * 16)
    monkeypatch.setitem(sys.modules, "safetensors", None)
    monkeypatch.setitem(sys.modules, "safetensors.torch", None)
    with pytest.raises(ConfigError, match=r"reading .safetensors needs the safetensors package: pip install 'pflx\[lpm\]'"):
        build(backbone_spec("vit-micro", (3, 32, 32), 10, weights=str(tmp_path / "w.safetensors")))
    (tmp_path / "junk.pth").write_text("not a torch file")
    with pytest.raises(InputError, match="not a readable torch state dict"):
        build(backbone_spec("vit-micro", (3, 32, 32), 10, weights=str(tmp_path / "junk.pth")))
    with pytest.raises(ConfigError, match="backbone_weights: no such file"):
        backbone_spec("vit-micro", (3, 32, 32), 10, weights=str(tmp_path / "none.pth"))
    with pytest.raises(ConfigError, match="backbone must be one of vit-s16, resnet18, vit-micro, resnet-micro; got 'vit-b16'"):
        backbone_spec("vit-b16", (3, 32, 32), 10)
    with pytest.raises(InputError, match=r"input must be images \(1 or 3, H, W\) or square-length vectors; got \(10,\)"):
        backbone_spec("vit-micro", (10,), 10)


def test_safetensors_file_loads_when_the_package_is_there(tmp_path):
    import safetensors.torch as st

    state = _published("resnet-micro", tmp_path / "w.pth")
    st.save_file(state, str(tmp_path / "w.safetensors"))
    net = build(backbone_spec("resnet-micro", (3, 32, 32), 10, weights=str(tmp_path / "w.safetensors")))
    assert torch.equal(net.backbone.conv1.weight, state["conv1.weight"])


def test_the_config_schema_offers_exactly_the_models_tunes():
    from pfl_cli.fl.config import BACKBONE_TUNES
    from pfl_cli.models.pretrained import TUNES

    assert BACKBONE_TUNES == TUNES
