"""`pflx train` / `pflx predict` / `pflx algorithms` end to end with FedPAC (issue 35)."""

import json

import pytest
import torch

from pfl_cli import registry
from pfl_cli.cli.app import main
from pfl_cli.cli.train_run import torch_bytes
from pfl_cli.fl import train_federated
from pflx_testing import small_config

FAST = ["--rounds", "6", "--eval-every", "3", "--lr", "0.05", "--clients-per-round", "16", "--batch-size", "16",
        "--set", "mlp_hidden=[16]", "--set", "new_client_epochs=5", "--set", "body_epochs=1"]


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    root = tmp_path_factory.mktemp("fedpac")
    assert main(["partition", "--dataset", "builtin:digits", "--classes-per-client", "2", "--class-shares", "equal",
                 "--num-clients", "20", "--holdout-clients", "4", "--test-fraction", "0.3",
                 "--out", str(root / "part"), "--format", "quiet"]) == 0
    return root


def load(path):
    return json.loads(path.read_text())


def test_train_then_predict_train_and_new_clients(root):
    out = root / "fedpac"
    assert main(["train", "--partition", str(root / "part"), "--algorithm", "fedpac", "--out", str(out),
                 "--format", "quiet", *FAST]) == 0
    metrics = load(out / "metrics.json")
    assert metrics["algorithm"] == "fedpac" and metrics["train"]["num_clients"] == 16
    assert metrics["train"]["mean_accuracy"] > 0.6
    comm = metrics["communication"]
    payload = torch.load(out / "model.pt", weights_only=True)
    floats = comm["floats_down_per_client_round"] + comm["floats_up_per_client_round"]
    assert floats == registry.get("fedpac").algorithm.floats_per_client_round(payload["arch"])
    assert set(comm["messages"]["up"]) == {"body", "head", "prototypes", "class_counts", "statistics_h",
                                           "statistics_v"}
    assert "private" in payload["weights"] and payload["weights"]["prototypes"]["seen"].all()
    for clients in ("train", "holdout"):
        pred = root / f"fedpac-{clients}"
        assert main(["predict", "--model", str(out), "--partition", str(root / "part"), "--clients", clients,
                     "--out", str(pred), "--format", "quiet"]) == 0
        m = load(pred / "metrics.json")
        assert m["num_clients"] == (16 if clients == "train" else 4) and m["personalized"]
        # train clients are served their combined heads; new ones train a head on the frozen body
        assert (m["optimizer_steps"] == 0) == (clients == "train")
        assert m["mean_accuracy"] > 0.5, (clients, m["mean_accuracy"])  # chance: 0.1


def test_resumed_run_writes_the_same_model(digits_clients):
    ds, part = digits_clients
    cfg = small_config("fedpac", rounds=6, eval_every=3, lr=0.05, batch_size=16, mlp_hidden=(16,), body_epochs=1,
                       new_client_epochs=1)
    saved = []
    whole = train_federated(ds.x, ds.y, 10, part, cfg, device="cpu", on_checkpoint=saved.append)
    resumed = train_federated(ds.x, ds.y, 10, part, cfg, device="cpu", resume=saved[0])
    assert saved[0]["round"] == 3
    assert torch_bytes(resumed.model) == torch_bytes(whole.model)
    assert resumed.outcome.history == whole.outcome.history


@pytest.mark.parametrize("extra,message", [
    (("--set", "fedpac_lambda=-1"), "fedpac_lambda must be a finite number >= 0 for fedpac; got -1"),
    (("--set", "head_lr=0"), "head_lr must be a finite number > 0"),
    (("--set", "head_epochs=-1"), "head_epochs must be an integer >= 0"),
    (("--set", "body_epochs=-1"), "body_epochs must be an integer >= 0"),
    (("--set", "new_client_epochs=-1"), "new_client_epochs must be an integer >= 0"),
    (("--set", "head_epochs=0", "--set", "body_epochs=0"), "fedpac needs local training"),
    (("--set", "gpfl_lambda=1"), "unknown --set key 'gpfl_lambda' for algorithm 'fedpac' (a key of gpfl)"),
    (("--set", "fedpac_lamda=1"), "did you mean 'fedpac_lambda'?"),
    (("--set", "mlp_hidden=[]"), "splits the client net into a body and a head"),
    (("--dp", "eps=1"), "--dp is not supported by algorithm 'fedpac'"),
])
def test_bad_input_is_one_line_and_exit_2(root, tmp_path, capsys, extra, message):
    code = main(["train", "--partition", str(root / "part"), "--algorithm", "fedpac", "--out", str(tmp_path / "bad"),
                 "--rounds", "2", *extra])
    err = capsys.readouterr().err
    assert code == 2 and message in err and err.count("\n") == 1, err
    assert not (tmp_path / "bad").exists()


def test_algorithms_lists_it_with_its_keys_and_sources(cli):
    rows = {r["algorithm"]: r for r in json.loads(cli("algorithms", "--format", "json").out)["algorithms"]}
    assert rows["fedpac"]["dp"] == "none" and "ICLR 2023" in rows["fedpac"]["paper"]
    assert rows["fedpac"]["new_clients"]
    doc = json.loads(cli("algorithms", "fedpac", "--format", "json").out)
    keys = {r["key"]: r for r in doc["keys"]}
    assert list(keys) == registry.get("fedpac").keys
    for own in ("fedpac_lambda", "head_epochs", "body_epochs", "head_lr"):
        assert keys[own]["source"] and keys[own]["source"] != "pflx", own
