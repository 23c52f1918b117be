"""A pflx train artifact's model.pt as a pre-trained checkpoint (issue 46, item 3): model_weights and
lora_base_weights read the one client net it holds; builtin:digits?classes= makes the disjoint public part."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest
import torch

from pfl_cli.data import load_dataset
from pfl_cli.errors import DatasetError, InputError
from pfl_cli.manifest import MODEL_FORMAT
from pfl_cli.models import build, client_spec
from pfl_cli.models.kinds import build_kind, kind_spec
from pfl_cli.models.lora import build_lora, lora_spec

BUILTIN_MLP = "factory:pfl_cli.models.client:client_model"


def payload(spec: dict, state: dict, algorithm: str = "centralized") -> dict:
    """What pflx train writes to model.pt for an algorithm that trains one client net (fl.api.model_payload)."""
    return {"format": MODEL_FORMAT, "algorithm": algorithm, "arch": {"client": spec}, "weights": {"client": state},
            "normalization": {"mean": torch.zeros(64), "std": torch.ones(64)}, "num_classes": torch.tensor(5)}


@pytest.fixture
def trained(tmp_path):
    """A model.pt of an MLP 64-16-5 whose weights differ from any seeded init, and those weights."""
    spec = client_spec("mlp", (64,), 5, (16,))
    torch.manual_seed(123)
    state = {k: torch.randn_like(v) for k, v in build(spec).state_dict().items()}
    path = tmp_path / "model.pt"
    torch.save(payload(spec, state), path)
    return path, spec, state


def test_lora_base_weights_reads_the_one_net_of_a_model_pt(trained):
    path, spec, state = trained
    net = build_lora(lora_spec(spec, build(spec), targets="*", rank=2, alpha=2.0, dropout=0.0, weights=str(path)),
                     build)
    base = {k.removeprefix("model.").replace(".base_layer", ""): v for k, v in net.state_dict().items()
            if "lora_" not in k}
    assert base.keys() == state.keys() and all(torch.equal(base[k], state[k]) for k in state)


def test_model_weights_reads_it_into_the_builtin_net_as_a_model_kind(trained):
    path, _, state = trained
    net = build_kind(kind_spec(BUILTIN_MLP, (64,), 5, kwargs={"arch": "mlp", "hidden": [16]}, weights=str(path)))
    got = net.model.state_dict()
    assert got.keys() == state.keys() and all(torch.equal(got[k], state[k]) for k in state)


def test_a_model_kind_trained_net_loads_without_its_wrapper_prefix(tmp_path, trained):
    _, _, state = trained
    spec = kind_spec(BUILTIN_MLP, (64,), 5, kwargs={"arch": "mlp", "hidden": [16]})
    path = tmp_path / "kind.pt"
    torch.save(payload(spec, {f"model.{k}": v for k, v in state.items()}, "fedavg"), path)
    net = build_kind(kind_spec(BUILTIN_MLP, (64,), 5, kwargs={"arch": "mlp", "hidden": [16]}, weights=str(path)))
    assert all(torch.equal(net.model.state_dict()[k], state[k]) for k in state)


def test_a_model_pt_without_one_client_net_is_refused(tmp_path, trained):
    _, spec, state = trained
    per_client = payload(spec, state, "fedrep")
    per_client["weights"] = {"client": state, "heads": {"weight": torch.zeros(3, 5, 16)}}
    path = tmp_path / "fedrep.pt"
    torch.save(per_client, path)
    with pytest.raises(InputError, match=r"lora_base_weights .*fedrep holds no single client net \(its weights: "
                                         r"client, heads\); give the model.pt of a run that trains one model"):
        build_lora(lora_spec(spec, build(spec), targets="*", rank=2, alpha=2.0, dropout=0.0, weights=str(path)), build)
    with pytest.raises(InputError, match="model_weights .*fedrep holds no single client net"):
        kind_spec(BUILTIN_MLP, (64,), 5, kwargs={"arch": "mlp", "hidden": [16]}, weights=str(path))


def test_digits_class_subsets_are_disjoint_and_relabeled():
    full = load_dataset("builtin:digits")
    public, private = load_dataset("builtin:digits?classes=5-9"), load_dataset("builtin:digits?classes=0,1,2,3,4")
    assert public.num_classes == private.num_classes == 5 and public.class_names == ("5", "6", "7", "8", "9")
    assert public.num_samples + private.num_samples == full.num_samples
    odd = load_dataset("builtin:digits?classes=1,3,5-5,7,9")
    rows = np.flatnonzero(full.y % 2 == 1)
    assert np.array_equal(odd.x, full.x[rows]) and np.array_equal(odd.y, (full.y[rows] - 1) // 2)
    for bad, rule in (("classes=4", "at least two digits"), ("classes=3-12", "digits 0-9"),
                      ("classes=a", "digits 0-9"), ("class=1,2", "unknown option")):
        with pytest.raises(DatasetError, match=rule):
            load_dataset(f"builtin:digits?{bad}")


@pytest.mark.slow
def test_the_pretrain_then_personalize_chain_adapts_the_pretrained_weights(tmp_path, monkeypatch):
    """The recipe's chain through the CLI: the LoRA run's frozen base and the fine-tuning run's start are the
    backbone `pflx train --algorithm centralized` wrote, weight for weight."""
    def pflx(*args):
        done = subprocess.run([sys.executable, "-m", "pfl_cli", *args, "--format", "quiet"], cwd=tmp_path,
                              capture_output=True, text=True)
        assert done.returncode == 0, done.stderr

    small = ["--set", "mlp_hidden=[16]", "--set", "local_steps=2", "--set", "eval_every=1", "--clients-per-round", "2"]
    pflx("partition", "--dataset", "builtin:digits?classes=5-9", "--num-clients", "4", "--out", "pub")
    pflx("partition", "--dataset", "builtin:digits?classes=0-4", "--num-clients", "4", "--out", "priv")
    pflx("train", "--partition", "pub", "--algorithm", "centralized", "--rounds", "3", *small, "--out", "pre")
    pflx("train", "--partition", "priv", "--algorithm", "fedsa-lora", "--rounds", "1", *small,
         "--set", "lora_base_weights=pre/model.pt", "--out", "lora")
    pflx("train", "--partition", "priv", "--algorithm", "fedavg", "--rounds", "1", *small[2:], "--model-arch",
         BUILTIN_MLP, "--set", "model_kwargs={arch: mlp, hidden: [16]}", "--set", "model_weights=pre/model.pt",
         "--out", "ft")
    backbone = torch.load(tmp_path / "pre/model.pt", weights_only=True)["weights"]["client"]
    spec = torch.load(tmp_path / "lora/model.pt", weights_only=True)["arch"]["client"]
    assert spec["arch"] == "lora" and spec["base_weights"].endswith("pre/model.pt")
    monkeypatch.chdir(tmp_path)  # the path as the run recorded it
    rebuilt = build(spec).state_dict()  # what predict and --resume rebuild: the base from the recorded file
    for k, v in backbone.items():
        name = f"model.{k}" if k.startswith("fc2.") else f"model.{k.replace('.', '.base_layer.', 1)}"
        assert torch.equal(rebuilt[name], v), k
    spec = torch.load(tmp_path / "ft/model.pt", weights_only=True)["arch"]["client"]
    assert spec["weights"] == str(tmp_path / "pre/model.pt")
    start = build(spec).model.state_dict()  # the net FedAvg started from, as predict and --resume rebuild it
    assert start.keys() == backbone.keys() and all(torch.equal(start[k], v) for k, v in backbone.items())
