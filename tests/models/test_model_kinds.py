"""Model kinds (issue 46, part 1): a user's factory, torchvision, timm and the papers' nets as client nets.

End to end through the CLI on a CIFAR-shaped npz fixture (3x32x32 random images): a run trains, ``predict``
rebuilds the net from the spec it recorded, a changed or missing factory / weights file is one line and exit
2, the head rule and its override are what the algorithms split, and a kind's BatchNorm / dropout behave the
same in the vmapped cohort path as in a per-client loop.
"""

from __future__ import annotations

import json
import textwrap

import numpy as np
import pytest
import torch

from pfl_cli.errors import InputError

FACTORY = textwrap.dedent("""
    from torch import nn

    def make_net(num_classes, input_shape, width=4):
        return nn.Sequential(nn.Conv2d(input_shape[0], width, 3, padding=1), nn.BatchNorm2d(width), nn.ReLU(),
                             nn.AdaptiveAvgPool2d(2), nn.Flatten(), nn.Linear(4 * width, 8), nn.ReLU(),
                             nn.Dropout(0.5), nn.Linear(8, num_classes))

    def conv_head(num_classes):
        return nn.Sequential(nn.Conv2d(3, num_classes, 1), nn.AdaptiveAvgPool2d(1), nn.Flatten())
""")
SMOKE = ["--rounds", "2", "--eval-every", "1", "--clients-per-round", "2", "--device", "cpu", "--seed", "0",
         "--format", "quiet"]


@pytest.fixture(scope="module")
def workdir(tmp_path_factory):
    """A 40-image 3x32x32 npz, its partition, and nets.py holding two factories."""
    from pfl_cli.cli.app import main

    root = tmp_path_factory.mktemp("kinds")
    rng = np.random.default_rng(0)
    np.savez(root / "cifar.npz", x=rng.standard_normal((40, 3, 32, 32)).astype(np.float32), y=np.arange(40) % 4)
    (root / "nets.py").write_text(FACTORY)
    assert main(["partition", "--dataset", f"npz:{root / 'cifar.npz'}", "--num-clients", "6", "--holdout-clients",
                 "2", "--classes-per-client", "2", "--test-fraction", "0.3", "--out", str(root / "part"),
                 "--format", "quiet"]) == 0
    return root


def factory(root, name="make_net") -> str:
    return f"factory:{root / 'nets.py'}:{name}"


def test_ditto_trains_on_a_user_factory_and_predict_rebuilds_it(workdir, cli, tmp_path):
    out = tmp_path / "ditto"
    run = cli("train", "--partition", workdir / "part", "--algorithm", "ditto", "--model-arch", factory(workdir),
              "--set", "model_kwargs={width: 3}", "--out", out, *SMOKE)
    assert run.code == 0, run.err
    weights = torch.load(out / "model.pt", weights_only=True)
    assert any(tuple(v.shape) == (3, 3, 3, 3) for v in _tensors(weights)), "model_kwargs width=3 not used"
    run = cli("predict", "--model", out, "--partition", workdir / "part", "--clients", "holdout", "--out",
              tmp_path / "pred", "--format", "quiet")
    assert run.code == 0, run.err
    assert 0.0 <= json.loads((tmp_path / "pred" / "metrics.json").read_text())["mean_accuracy"] <= 1.0


def _tensors(tree):
    if isinstance(tree, torch.Tensor):
        yield tree
    elif isinstance(tree, dict):
        for v in tree.values():
            yield from _tensors(v)


def test_a_changed_or_missing_factory_file_is_one_line_and_exit_2(workdir, cli, tmp_path):
    nets = tmp_path / "nets.py"
    nets.write_text(FACTORY)
    out = tmp_path / "run"
    assert cli("train", "--partition", workdir / "part", "--algorithm", "fedavg", "--model-arch",
               f"factory:{nets}:make_net", "--out", out, *SMOKE).code == 0
    nets.write_text(FACTORY + "\n# edited\n")
    run = cli("predict", "--model", out, "--partition", workdir / "part", "--out", tmp_path / "p1", "--format", "quiet")
    assert run.code == 2 and "changed since the model was built" in run.err, run.err
    assert len(run.err.strip().splitlines()[-1:]) == 1 and not (tmp_path / "p1").exists()
    nets.unlink()
    run = cli("predict", "--model", out, "--partition", workdir / "part", "--out", tmp_path / "p2", "--format", "quiet")
    assert run.code == 2 and "missing" in run.err and not (tmp_path / "p2").exists(), run.err


@pytest.mark.slow  # default-tier budget (2026-11-29): minutes-long or a learning run
@pytest.mark.models
def test_timm_weights_file_is_loaded_recorded_and_checked(workdir, cli, tmp_path):
    from pfl_cli.models.kinds._imports import import_timm

    source = import_timm().create_model("test_efficientnet_gn", pretrained=False, num_classes=1000)
    with torch.no_grad():
        for p in source.parameters():
            p.fill_(0.01)
    weights = tmp_path / "w.pth"
    torch.save(source.state_dict(), weights)
    from pfl_cli.models import build
    from pfl_cli.models.kinds import kind_spec

    spec = kind_spec("timm:test_efficientnet_gn", (3, 32, 32), 4, weights=str(weights))
    net = build(spec)
    head = net.classifier + "."
    body = {k: v for k, v in net.named_parameters() if not k.startswith(head)}
    assert all(torch.all(v == 0.01) for v in body.values())  # the file's weights, the 1000-class head skipped
    assert net.head().out_features == 4 and spec["weights_sha256"] and spec["head"] == "classifier"
    out = tmp_path / "fedper"
    run = cli("train", "--partition", workdir / "part", "--algorithm", "fedper", "--model-arch",
              "timm:test_efficientnet_gn", "--set", f"model_weights={weights}", "--out", out, *SMOKE)
    assert run.code == 0, run.err
    torch.save({k: v + 1 for k, v in source.state_dict().items()}, weights)
    run = cli("predict", "--model", out, "--partition", workdir / "part", "--out", tmp_path / "p", "--format", "quiet")
    assert run.code == 2 and "model_weights" in run.err and "changed" in run.err, run.err


@pytest.mark.models
def test_torchvision_spec_head_norm_layers_and_cohort_equals_loop():
    from pfl_cli.fl.cohort import cohort_forward
    from pfl_cli.models import build
    from pfl_cli.models.kinds import kind_spec

    spec = kind_spec("torchvision:shufflenet_v2_x0_5", (3, 32, 32), 4)
    assert spec["head"] == "fc" and "model.conv1.1" in spec["norm"] and "weights" not in spec
    with pytest.raises(InputError, match="never downloaded"):
        kind_spec("torchvision:resnet18", (3, 32, 32), 4, kwargs={"weights": "DEFAULT"})
    with pytest.raises(InputError, match="did you mean 'resnet18'"):
        kind_spec("torchvision:resnet17", (3, 32, 32), 4)
    net = build(spec)
    net.train()
    x = torch.randn(2, 3, 3, 32, 32, generator=torch.Generator().manual_seed(0))
    params = {k: torch.stack([v, 1.1 * v]) for k, v in net.named_parameters()}
    before = {k: v.clone() for k, v in net.named_buffers()}
    assert torch.allclose(cohort_forward(net, params, x, "vmap"), cohort_forward(net, params, x, "loop"), atol=1e-5)
    assert all(torch.equal(v, before[k]) for k, v in net.named_buffers())  # BatchNorm statistics never move


@pytest.mark.models
@pytest.mark.slow
def test_torchvision_net_runs_fedrep_and_resumes_byte_identically(workdir, cli, tmp_path, monkeypatch):
    from pfl_cli import formats

    args = ["train", "--partition", workdir / "part", "--algorithm", "fedrep", "--model-arch",
            "torchvision:shufflenet_v2_x0_5", *SMOKE]
    assert cli(*args, "--out", tmp_path / "whole").code == 0
    real = formats.write_atomic

    def write_then_die(path, data):
        real(path, data)
        if "checkpoint" in str(path):
            raise KeyboardInterrupt

    monkeypatch.setattr(formats, "write_atomic", write_then_die)
    assert cli(*args, "--out", tmp_path / "killed").code == 130
    monkeypatch.setattr(formats, "write_atomic", real)
    assert cli(*args, "--out", tmp_path / "killed", "--resume").code == 0
    for file in ("model.pt", "metrics.json"):
        assert (tmp_path / "killed" / file).read_bytes() == (tmp_path / "whole" / file).read_bytes(), file


@pytest.mark.models
@pytest.mark.slow
def test_fedrep_runs_on_torchvision_resnet18_with_cifar_shaped_data(workdir, cli, tmp_path):
    run = cli("train", "--partition", workdir / "part", "--algorithm", "fedrep", "--model-arch",
              "torchvision:resnet18", "--out", tmp_path / "r18", *SMOKE)
    assert run.code == 0, run.err
    run = cli("predict", "--model", tmp_path / "r18", "--partition", workdir / "part", "--out", tmp_path / "p",
              "--format", "quiet")
    assert run.code == 0, run.err


def test_head_rule_and_its_override(workdir):
    from pfl_cli.fl.split import split_names
    from pfl_cli.models import build
    from pfl_cli.models.kinds import kind_spec

    spec = kind_spec(factory(workdir), (3, 32, 32), 4)
    assert spec["head"] == "8" and spec["norm"] == ["model.1"]  # the last nn.Linear; the BatchNorm2d
    net = build(spec)
    body, head = split_names(net, "fedrep")
    assert head == ["model.8.weight", "model.8.bias"] and "model.5.weight" in body
    with pytest.raises(InputError, match="does not give the net's output"):
        kind_spec(factory(workdir), (3, 32, 32), 4, head="5")  # a Linear, but not the last layer
    with pytest.raises(InputError, match="model_head must name an nn.Linear"):
        kind_spec(factory(workdir), (3, 32, 32), 4, head="1")
    with pytest.raises(InputError, match="has none"):
        kind_spec(factory(workdir, "conv_head"), (3, 32, 32), 4)


def test_features_are_the_heads_input_and_cohort_equals_loop(workdir):
    """BatchNorm (fixed statistics) and dropout (off) give vmap's cohort the per-client loop's numbers."""
    from pfl_cli.fl.cohort import cohort_forward
    from pfl_cli.models import build
    from pfl_cli.models.kinds import kind_spec

    torch.manual_seed(0)
    net = build(kind_spec(factory(workdir), (3, 32, 32), 4))
    net.train()
    x = torch.randn(3, 5, 3, 32, 32)
    params = {k: torch.stack([v + 0.1 * i for i in range(3)]) for k, v in net.named_parameters()}
    vmapped = cohort_forward(net, params, x, "vmap")
    looped = cohort_forward(net, params, x, "loop")
    assert torch.allclose(vmapped, looped, atol=1e-6)
    assert torch.equal(net(x[0]), net(x[0]))  # no dropout mask drawn
    assert torch.allclose(net.head()(net.features(x[0])), net(x[0]))
    assert net(x[0][:2]).allclose(net(x[0])[:2], atol=1e-6)  # a sample's output does not depend on its batch


def test_the_papers_nets():
    from pfl_cli.models import client_spec, num_parameters

    assert num_parameters(client_spec("pfllib-cnn", (3, 32, 32), 10)) == 878_538  # PFLlib's FedAvgCNN on CIFAR-10
    assert num_parameters(client_spec("pfllib-cnn", (1, 28, 28), 10)) == 582_026  # ... on MNIST (fc1 1024 -> 512)
    assert num_parameters(client_spec("resnet18-cifar", (3, 32, 32), 10)) == 11_173_962


def test_kind_keys_without_a_kind_and_unknown_names_are_refused(cli, workdir, tmp_path):
    run = cli("train", "--partition", workdir / "part", "--algorithm", "fedavg", "--set", "model_head=fc",
              "--out", tmp_path / "a", *SMOKE)
    assert run.code == 2 and "model_head has no effect without a model kind" in run.err, run.err
    run = cli("train", "--partition", workdir / "part", "--algorithm", "pfedhn", "--model-arch", factory(workdir),
              "--set", "client_sizes=S,L", "--out", tmp_path / "b", *SMOKE)
    assert run.code == 2 and "is a model kind's net, of one size" in run.err, run.err
    run = cli("train", "--partition", workdir / "part", "--algorithm", "fedbn", "--model-arch", factory(workdir),
              "--out", tmp_path / "c", *SMOKE)
    assert run.code == 2 and "fedbn keeps each client's batch-norm statistics" in run.err, run.err
    run = cli("train", "--partition", workdir / "part", "--algorithm", "fedavg", "--model-arch",
              f"factory:{workdir / 'nets.py'}:nothing", "--out", tmp_path / "d", *SMOKE)
    assert run.code == 2 and "has no callable 'nothing'" in run.err, run.err
    # a hypernetwork generates every parameter of the net: a state dict to start it from is never read (pFedHN-PC's
    # head is not generated, so there it acts; tests/algorithms/test_no_ignored_key.py)
    run = cli("train", "--partition", workdir / "part", "--algorithm", "pefll", "--model-arch", factory(workdir),
              "--set", f"model_weights={tmp_path / 'mlp.pth'}", "--out", tmp_path / "e", *SMOKE)
    assert run.code == 2 and "model_weights has no effect on algorithm 'pefll'" in run.err, run.err
    assert not any((tmp_path / d).exists() for d in "abcde")


def test_resume_refuses_a_factory_changed_since_the_checkpoint(workdir, cli, tmp_path, monkeypatch):
    from pfl_cli import formats

    nets = tmp_path / "nets.py"
    nets.write_text(FACTORY)
    args = ["train", "--partition", workdir / "part", "--algorithm", "fedavg", "--model-arch",
            f"factory:{nets}:make_net", "--out", tmp_path / "run", *SMOKE]
    real = formats.write_atomic

    def write_then_die(path, data):
        real(path, data)
        if "checkpoint" in str(path):
            raise KeyboardInterrupt

    monkeypatch.setattr(formats, "write_atomic", write_then_die)
    assert cli(*args).code == 130
    monkeypatch.setattr(formats, "write_atomic", real)
    nets.write_text(FACTORY.replace("width=4", "width=5"))
    run = cli(*args, "--resume")
    assert run.code == 2 and "--resume" in run.err and not (tmp_path / "run" / "manifest.json").exists(), run.err


def test_a_relative_factory_path_is_rebuilt_from_another_directory(workdir, cli, tmp_path, monkeypatch):
    monkeypatch.chdir(workdir)
    out = tmp_path / "run"
    assert cli("train", "--partition", "part", "--algorithm", "fedavg", "--model-arch", "factory:nets.py:make_net",
               "--out", out, *SMOKE).code == 0
    monkeypatch.chdir(tmp_path)
    run = cli("predict", "--model", out, "--partition", workdir / "part", "--out", "pred", "--format", "quiet")
    assert run.code == 0, run.err
