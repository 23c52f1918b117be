"""Plugins (entry-point group ``pflx.algorithms``): the example of docs/tutorials/write-your-own-algorithm.md
(tests/plugins/pflx_fedavgm) trains, resumes byte-identically and predicts; broken plugins never stop the
built-ins.

A plugin is installed the way pip leaves it: its package on ``sys.path`` beside a ``*.dist-info``
directory whose ``entry_points.txt`` names it, which ``importlib.metadata`` reads.
"""

import json
import pathlib
import sys

import pytest
import torch
import yaml

from pfl_cli import registry
from pfl_cli.cli.app import main
from pfl_cli.fl.checkpoint import Checkpointer, checkpoint_dir

PLUGIN = pathlib.Path(__file__).resolve().parents[1] / "plugins" / "pflx_fedavgm"


def install(site: pathlib.Path, name: str, entry_points: dict[str, str]) -> None:
    """A distribution ``name`` with ``entry_points`` (entry name -> "module:Class") in the directory ``site``."""
    info = site / f"{name.replace('-', '_')}-0.1.0.dist-info"  # as a wheel names it
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: 0.1.0\n")
    lines = "\n".join(f"{k} = {v}" for k, v in entry_points.items())
    (info / "entry_points.txt").write_text(f"[pflx.algorithms]\n{lines}\n")


@pytest.fixture
def plugins(tmp_path, monkeypatch):
    """A site directory on sys.path holding the example plugin; the registry reads it afresh."""
    site = tmp_path / "site"
    install(site, "pflx-fedavgm", {"fedavgm": "pflx_fedavgm:FedAvgM"})
    monkeypatch.syspath_prepend(str(PLUGIN))
    monkeypatch.syspath_prepend(str(site))
    registry.reload()
    yield site
    monkeypatch.undo()
    sys.modules.pop("pflx_fedavgm", None)
    registry.reload()


@pytest.fixture(scope="module")
def part(tmp_path_factory):
    root = tmp_path_factory.mktemp("plugin")
    assert main(["partition", "--dataset", "builtin:digits", "--classes-per-client", "2", "--class-shares", "equal",
                 "--num-clients", "12", "--holdout-clients", "2", "--test-fraction", "0.3",
                 "--out", str(root / "part"), "--format", "quiet"]) == 0
    return root / "part"


TRAIN = ["--algorithm", "fedavgm", "--rounds", "6", "--eval-every", "2", "--local-steps", "3", "--lr", "0.05",
         "--set", "mlp_hidden=[8]", "--device", "cpu", "--format", "quiet"]


def test_the_example_trains_resumes_byte_identically_and_predicts(plugins, part, tmp_path, monkeypatch, capsys):
    assert "fedavgm" in registry.names() and registry.get("fedavgm").origin.startswith("plugin pflx-fedavgm")
    whole = tmp_path / "whole"
    assert main(["train", "--partition", str(part), *TRAIN, "--out", str(whole)]) == 0
    config = yaml.safe_load((whole / "config.yaml").read_text())
    assert config["algorithm"] == "fedavgm" and config["server_momentum"] == 0.9 and "mu" not in config

    # An interrupted run: the process stops right after its round-2 checkpoint (as a kill would).
    write = Checkpointer.write

    def write_then_stop(self, state):
        write(self, state)
        if int(state["round"]) == 2:
            raise KeyboardInterrupt

    killed = tmp_path / "killed"
    monkeypatch.setattr(Checkpointer, "write", write_then_stop)
    assert main(["train", "--partition", str(part), *TRAIN, "--out", str(killed)]) == 130
    monkeypatch.setattr(Checkpointer, "write", write)
    assert not killed.exists() and torch.load(checkpoint_dir(killed) / "state.pt", weights_only=True)["round"] == 2
    assert main(["train", "--partition", str(part), *TRAIN, "--out", str(killed), "--resume"]) == 0
    for name in ("model.pt", "metrics.csv", "clients.csv", "checkpoint/state.pt"):
        assert (killed / name).read_bytes() == (whole / name).read_bytes(), name

    pred = tmp_path / "pred"
    assert main(["predict", "--model", str(whole), "--partition", str(part), "--clients", "holdout",
                 "--out", str(pred), "--format", "json"]) == 0
    result = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert result["num_clients"] == 2 if "num_clients" in result else True
    metrics = json.loads((pred / "metrics.json").read_text())
    assert 0.0 <= metrics["mean_accuracy"] <= 1.0
    capsys.readouterr()
    assert main(["algorithms", "--format", "json"]) == 0
    listed = {r["algorithm"]: r for r in json.loads(capsys.readouterr().out)["algorithms"]}
    assert listed["fedavgm"]["paper"].startswith("FedAvgM") and listed["fedavgm"]["dp"] == "none"
    assert main(["show", str(whole), "--format", "json"]) == 0
    assert json.loads(capsys.readouterr().out)["config"] == config


def test_a_plugin_without_dp_refuses_dp(plugins, part, tmp_path, capsys):
    assert main(["train", "--partition", str(part), *TRAIN, "--dp", "eps=4,clip=1,population=100",
                 "--set", "normalize=false", "--out", str(tmp_path / "o")]) == 2
    assert "--dp is not supported by algorithm 'fedavgm'" in capsys.readouterr().err


def test_broken_plugins_are_named_in_one_line_each_and_the_builtins_still_work(tmp_path, monkeypatch, part, capsys):
    site = tmp_path / "site"
    (site / "brokenpkg").mkdir(parents=True)
    (site / "brokenpkg" / "__init__.py").write_text(
        "raise ImportError('no module named torch_geometric')\n")
    (site / "clashpkg.py").write_text(
        "from pflx_fedavgm import FedAvgM\nclass Clash(FedAvgM):\n    name = 'fedavg'\n    config = None\n"
        "class NoConfig(FedAvgM):\n    name = 'noconfig'\n")
    install(site, "pflx-broken", {"broken": "brokenpkg:Thing"})
    install(site, "pflx-clash", {"fedavg": "clashpkg:Clash", "noconfig": "clashpkg:NoConfig"})
    monkeypatch.syspath_prepend(str(PLUGIN))
    monkeypatch.syspath_prepend(str(site))
    try:
        registry.reload()
        problems = registry.plugin_problems()
        assert len(problems) == 3
        assert any("plugin 'broken' (pflx-broken: brokenpkg:Thing) left out: importing it failed (ImportError: no "
                   "module named torch_geometric)" in p for p in problems)
        assert any("plugin 'fedavg'" in p and "clashes with the built-in algorithm 'fedavg'" in p for p in problems)
        assert any("plugin 'noconfig'" in p and "declares no config" in p for p in problems)
        assert registry.get("fedavg").origin == "built-in" and "noconfig" not in registry.names()
        out = tmp_path / "fedavg"
        assert main(["train", "--partition", str(part), "--algorithm", "fedavg", "--rounds", "2", "--eval-every", "1",
                     "--local-steps", "2", "--set", "mlp_hidden=[8]", "--out", str(out)]) == 0
        err = capsys.readouterr().err
        assert sum("left out" in line for line in err.splitlines()) == 3 and (out / "model.pt").is_file()
    finally:
        monkeypatch.undo()
        for mod in ("pflx_fedavgm", "clashpkg", "brokenpkg"):
            sys.modules.pop(mod, None)
        registry.reload()
