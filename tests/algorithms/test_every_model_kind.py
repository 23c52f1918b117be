"""Every algorithm on every model kind (issue 46): trains, resumes after a kill and predicts, or refuses in one line.

Generated from the algorithm registry x the model kinds (:data:`pfl_cli.fl.config.MODEL_KINDS` and ``hf:DIR``), each kind with
its smallest net (:data:`NETS`) on a 40-image 3x16x16 npz at smoke size (2 rounds, 2 clients a round): a new
algorithm or kind is covered without new test code. A case either

1. trains (exit 0, a model.pt, finite accuracies), is killed right after its round-1 checkpoint and resumed to
   the uninterrupted run's bytes (model.pt, metrics.json), and ``predict --clients holdout`` serves the new
   clients; or
2. exits 2 before writing anything, with one line on stderr that names model_arch (FedBN's per-client
   statistics; tests/models/test_model_kinds.py checks the messages) or the backbone (HyperFL-LPM runs on its
   pre-trained backbones only).

The default tier runs :data:`DEFAULT_TIER`; the whole product (4 kinds x every algorithm, minutes) is ``slow``.
"""

from __future__ import annotations

import json
import math

import kind_nets
import numpy as np
import pytest

from pflx_testing import cli_args, dp_sets, smoke_sets

from pfl_cli import formats, registry
from pfl_cli.cli.app import main
from pfl_cli.fl.config import MODEL_KINDS

NETS = {"factory": f"factory:{kind_nets.FILE}:cnn", "torchvision": "torchvision:shufflenet_v2_x0_5",
        "timm": "timm:test_efficientnet_gn", "hf": "hf:{vit}"}  # hf: a tiny ViT checkpoint the fixture saves
KIND_MARKS = {"factory": [], "torchvision": [pytest.mark.models], "timm": [pytest.mark.models], "hf": [pytest.mark.peft]}
SMOKE = ["--rounds", "2", "--eval-every", "1", "--clients-per-round", "2", "--seed", "0", "--device", "cpu",
         "--format", "quiet"]
DEFAULT_TIER = {("fedrep", "factory"), ("ditto", "timm")}


def cases() -> list:
    assert set(NETS) == {*MODEL_KINDS, "hf"}, "a model kind without a smoke net here"
    return [pytest.param(name, kind, id=f"{name}-{kind}",
                         marks=[*KIND_MARKS[kind], *(() if (name, kind) in DEFAULT_TIER else [pytest.mark.slow])])
            for name in registry.names() for kind in NETS]


@pytest.fixture(scope="module")
def part(tmp_path_factory):
    root = tmp_path_factory.mktemp("kinds-every")
    rng = np.random.default_rng(0)
    np.savez(root / "x.npz", x=rng.standard_normal((40, 3, 16, 16)).astype(np.float32), y=np.arange(40) % 4)
    assert main(["partition", "--dataset", f"npz:{root / 'x.npz'}", "--num-clients", "6", "--holdout-clients", "2",
                 "--classes-per-client", "2", "--test-fraction", "0.3", "--out", str(root / "part"),
                 "--format", "quiet"]) == 0
    return root / "part"


@pytest.fixture(scope="module")
def vit(part):
    """A ViT image classifier for the partition's 3x16x16 images, saved with ``save_pretrained`` (hf: kind)."""
    from hf_checkpoints import tiny_vit

    return tiny_vit(part.parent / "vit", image=16, channels=3, num_labels=4)


def train(part, name, kind, out, *extra) -> int:
    arch = NETS[kind].format(vit=part.parent / "vit")
    return main(cli_args(["train", "--partition", part, "--algorithm", name, "--out", out, "--set",
                          f"model_arch={arch}", *SMOKE, *smoke_sets(name), *dp_sets(name), *extra], name))


@pytest.mark.parametrize("name, kind", cases())
def test_runs_resumes_and_predicts_or_refuses_in_one_line(part, name, kind, tmp_path, capsys, monkeypatch, cli,
                                                          request):
    if kind == "hf":
        request.getfixturevalue("vit")
    whole = tmp_path / "whole"
    code = train(part, name, kind, whole)
    err = capsys.readouterr().err
    if code == 2:
        lines = [line for line in err.splitlines() if line.startswith("pflx: error")]
        assert len(lines) == 1 and ("model_arch" in lines[0] or "backbone" in lines[0]) and not whole.exists(), err
        return
    assert code == 0, err
    metrics = json.loads((whole / "metrics.json").read_text())
    if not registry.get(name).algorithm.dp_required:
        got = [metrics["train"][k] for k in ("mean_accuracy", "pooled_accuracy") if k in metrics.get("train", {})]
        assert got and all(math.isfinite(v) and 0 <= v <= 1 for v in got), metrics
    killed, real = tmp_path / "killed", formats.write_atomic

    def write_then_die(path, data):
        real(path, data)
        if "checkpoint" in str(path):
            raise KeyboardInterrupt

    monkeypatch.setattr(formats, "write_atomic", write_then_die)
    code = train(part, name, kind, killed)
    monkeypatch.setattr(formats, "write_atomic", real)
    if registry.get(name).algorithm.federated:
        assert code == 130 and not killed.exists()
        assert train(part, name, kind, killed, "--resume") == 0
    for file in ("model.pt", "metrics.json"):
        assert (killed / file).read_bytes() == (whole / file).read_bytes(), file
    if registry.get(name).algorithm.dp_required:
        return
    run = cli("predict", "--model", whole, "--partition", part, "--clients", "holdout", "--out", tmp_path / "pred",
              "--format", "quiet")
    assert run.code == 0, run.err
    assert json.loads((tmp_path / "pred" / "metrics.json").read_text())["num_clients"] == 2
