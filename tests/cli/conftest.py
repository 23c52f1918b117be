"""Fixtures of the end-to-end train tests of the personalized baselines (tests/cli/test_train_*.py)."""

import json

import pytest


@pytest.fixture(scope="session")
def digits_root(tmp_path_factory):
    """A folder holding ``part``: builtin:digits over 20 clients of 2 classes, 4 of them holdout; each test
    module writes its runs beside it under its algorithms' names."""
    from pfl_cli.cli.app import main

    root = tmp_path_factory.mktemp("digits")
    assert main(["partition", "--dataset", "builtin:digits", "--classes-per-client", "2", "--class-shares", "equal",
                 "--num-clients", "20", "--holdout-clients", "4", "--test-fraction", "0.3",
                 "--out", str(root / "part"), "--format", "quiet"]) == 0
    return root


def load(path):
    return json.loads(path.read_text())


@pytest.fixture
def train_predicts(digits_root):
    """``train_predicts(name, args, run=main)`` -> (metrics, payload, {"train": m, "holdout": m}): trains
    ``name`` on the digits partition, then predicts its train and holdout clients; both exit 0."""
    import torch

    from pfl_cli.cli.app import main

    def run(name, args, run=main):
        out, part = digits_root / name, str(digits_root / "part")
        assert run(["train", "--partition", part, "--algorithm", name, "--out", str(out), "--format", "quiet",
                    *args]) == 0
        preds = {}
        for clients in ("train", "holdout"):
            pred = digits_root / f"{name}-{clients}"
            assert run(["predict", "--model", str(out), "--partition", part, "--clients", clients,
                        "--out", str(pred), "--format", "quiet"]) == 0
            preds[clients] = load(pred / "metrics.json")
            assert preds[clients]["num_clients"] == (16 if clients == "train" else 4)
        metrics = load(out / "metrics.json")
        assert metrics["algorithm"] == name and metrics["train"]["num_clients"] == 16
        return metrics, torch.load(out / "model.pt", weights_only=True), preds

    return run


@pytest.fixture
def resume_matches(digits_clients):
    """``resume_matches(cfg, at)``: training ``cfg`` again from its first checkpoint (round ``at``) writes the
    same model bytes and history as the whole run."""
    from pfl_cli.fl.checkpoint import torch_bytes
    from pfl_cli.fl import train_federated

    def check(cfg, at):
        ds, part = digits_clients
        saved = []
        whole = train_federated(ds.x, ds.y, 10, part, cfg, device="cpu", on_checkpoint=saved.append)
        resumed = train_federated(ds.x, ds.y, 10, part, cfg, device="cpu", resume=saved[0])
        assert saved[0]["round"] == at
        assert torch_bytes(resumed.model) == torch_bytes(whole.model)
        assert resumed.outcome.history == whole.outcome.history

    return check


@pytest.fixture
def train_refused(digits_root, tmp_path, capsys):
    """``train_refused(args, message, run=main)``: ``pflx train`` on the digits partition with ``args`` exits 2
    with one line holding ``message`` and writes nothing."""
    from pfl_cli.cli.app import main

    def check(args, message, run=main):
        code = run(["train", "--partition", str(digits_root / "part"), "--out", str(tmp_path / "bad"), *args])
        err = capsys.readouterr().err
        assert code == 2 and message in err and err.count("\n") == 1, err
        assert not (tmp_path / "bad").exists()

    return check


@pytest.fixture
def listed_with_sources(cli):
    """``listed_with_sources(name, own)`` -> its ``pflx algorithms`` row: no DP variant, a paper, a new-client
    protocol; ``pflx algorithms NAME`` lists the registry's keys in order, each of ``own`` with a source other
    than pflx."""
    from pfl_cli import registry

    def check(name, own):
        rows = {r["algorithm"]: r for r in json.loads(cli("algorithms", "--format", "json").out)["algorithms"]}
        assert rows[name]["dp"] == "none" and rows[name]["paper"] and rows[name]["new_clients"]
        doc = json.loads(cli("algorithms", name, "--format", "json").out)
        keys = {r["key"]: r for r in doc["keys"]}
        assert list(keys) == registry.get(name).keys
        for key in own:
            assert keys[key]["source"] and keys[key]["source"] != "pflx", key
        return rows[name]

    return check
