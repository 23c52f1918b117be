"""`pflx train` / `pflx predict` / `pflx algorithms` end to end with FedCP (issue 35)."""

import json

import pytest
import torch

from pfl_cli import registry
from pfl_cli.cli.app import main
from pfl_cli.cli.train_run import torch_bytes
from pfl_cli.fl import train_federated
from pflx_testing import small_config

FAST = ["--rounds", "12", "--eval-every", "6", "--local-steps", "3", "--lr", "0.05", "--clients-per-round", "16",
        "--set", "mlp_hidden=[16]", "--set", "new_client_epochs=5"]


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    root = tmp_path_factory.mktemp("fedcp")
    assert main(["partition", "--dataset", "builtin:digits", "--classes-per-client", "2", "--class-shares", "equal",
                 "--num-clients", "20", "--holdout-clients", "4", "--test-fraction", "0.3",
                 "--out", str(root / "part"), "--format", "quiet"]) == 0
    return root


def load(path):
    return json.loads(path.read_text())


def test_train_then_predict_train_and_new_clients(root):
    out = root / "fedcp"
    assert main(["train", "--partition", str(root / "part"), "--algorithm", "fedcp", "--out", str(out),
                 "--format", "quiet", *FAST]) == 0
    metrics = load(out / "metrics.json")
    assert metrics["algorithm"] == "fedcp" and metrics["train"]["num_clients"] == 16
    assert metrics["train"]["mean_accuracy"] > 0.5
    comm = metrics["communication"]
    payload = torch.load(out / "model.pt", weights_only=True)
    per_round = registry.get("fedcp").algorithm.floats_per_client_round(payload["arch"])
    assert comm["floats_down_per_client_round"] + comm["floats_up_per_client_round"] == pytest.approx(per_round)
    # f (64x16 + 16), the head (16x10 + 10) and the CPN (Linear(16, 32) + LayerNorm(32)), each way
    assert per_round == 2 * (64 * 16 + 16 + 16 * 10 + 10 + 16 * 32 + 32 + 2 * 32)
    assert "private" in payload["weights"]
    for clients in ("train", "holdout"):
        pred = root / f"fedcp-{clients}"
        assert main(["predict", "--model", str(out), "--partition", str(root / "part"), "--clients", clients,
                     "--out", str(pred), "--format", "quiet"]) == 0
        m = load(pred / "metrics.json")
        assert m["num_clients"] == (16 if clients == "train" else 4) and m["personalized"]
        assert (m["optimizer_steps"] == 0) == (clients == "train")
        assert m["mean_accuracy"] > 0.4, (clients, m["mean_accuracy"])  # chance: 0.1


def test_resumed_run_writes_the_same_model(digits_clients):
    ds, part = digits_clients
    cfg = small_config(algorithm="fedcp", rounds=8, eval_every=4, local_steps=2, lr=0.05, mlp_hidden=(16,),
                       new_client_epochs=1)
    saved = []
    whole = train_federated(ds.x, ds.y, 10, part, cfg, device="cpu", on_checkpoint=saved.append)
    resumed = train_federated(ds.x, ds.y, 10, part, cfg, device="cpu", resume=saved[0])
    assert saved[0]["round"] == 4
    assert torch_bytes(resumed.model) == torch_bytes(whole.model)
    assert resumed.outcome.history == whole.outcome.history


@pytest.mark.parametrize("extra,message", [
    (("--set", "fedcp_lambda=-1"), "fedcp_lambda must be a finite number >= 0 for fedcp"),
    (("--set", "fedcp_tau=0"), "fedcp_tau must be a finite number > 0 for fedcp"),
    (("--set", "new_client_epochs=-1"), "new_client_epochs must be an integer >= 0"),
    (("--set", "gpfl_lambda=1"), "unknown --set key 'gpfl_lambda' for algorithm 'fedcp'"),
    (("--set", "fedcp_lamda=1"), "did you mean 'fedcp_lambda'"),
    (("--set", "mlp_hidden=[]"), "splits the client net into a body and a head"),
    (("--dp", "eps=1"), "--dp is not supported by algorithm 'fedcp'"),
])
def test_bad_input_is_one_line_and_exit_2(root, tmp_path, capsys, extra, message):
    code = main(["train", "--partition", str(root / "part"), "--algorithm", "fedcp", "--out", str(tmp_path / "bad"),
                 "--rounds", "2", *extra])
    err = capsys.readouterr().err
    assert code == 2 and message in err and err.count("\n") == 1, err
    assert not (tmp_path / "bad").exists()


def test_algorithms_lists_it_with_its_keys_and_sources(cli):
    rows = {r["algorithm"]: r for r in json.loads(cli("algorithms", "--format", "json").out)["algorithms"]}
    assert rows["fedcp"]["dp"] == "none" and rows["fedcp"]["paper"] and rows["fedcp"]["new_clients"]
    doc = json.loads(cli("algorithms", "fedcp", "--format", "json").out)
    keys = {r["key"]: r for r in doc["keys"]}
    assert list(keys) == registry.get("fedcp").keys
    for own in ("fedcp_lambda", "fedcp_tau"):
        assert keys[own]["source"] and keys[own]["source"] != "pflx"
