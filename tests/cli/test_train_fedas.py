"""`pflx train` / `pflx predict` / `pflx algorithms` end to end with FedAS (issue 35)."""

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
    root = tmp_path_factory.mktemp("fedas")
    assert main(["partition", "--dataset", "builtin:digits", "--classes-per-client", "2", "--class-shares", "equal",
                 "--num-clients", "20", "--holdout-clients", "4", "--test-fraction", "0.3",
                 "--out", str(root / "part"), "--format", "quiet"]) == 0
    return root


def load(path):
    return json.loads(path.read_text())


def test_train_then_predict_train_and_new_clients(root):
    out = root / "fedas"
    assert main(["train", "--partition", str(root / "part"), "--algorithm", "fedas", "--out", str(out),
                 "--format", "quiet", *FAST]) == 0
    metrics = load(out / "metrics.json")
    assert metrics["algorithm"] == "fedas" and metrics["train"]["num_clients"] == 16
    assert metrics["train"]["mean_accuracy"] > 0.5
    comm = metrics["communication"]
    payload = torch.load(out / "model.pt", weights_only=True)
    per_round = registry.get("fedas").algorithm.floats_per_client_round(payload["arch"])
    assert comm["floats_down_per_client_round"] + comm["floats_up_per_client_round"] == pytest.approx(per_round)
    # the body (64x16 + 16) each way and the Fisher trace up
    assert per_round == 2 * (64 * 16 + 16) + 1
    assert "private" in payload["weights"]
    for clients in ("train", "holdout"):
        pred = root / f"fedas-{clients}"
        assert main(["predict", "--model", str(out), "--partition", str(root / "part"), "--clients", clients,
                     "--out", str(pred), "--format", "quiet"]) == 0
        m = load(pred / "metrics.json")
        assert m["num_clients"] == (16 if clients == "train" else 4) and m["personalized"]
        assert (m["optimizer_steps"] == 0) == (clients == "train")
        assert m["mean_accuracy"] > 0.4, (clients, m["mean_accuracy"])  # chance: 0.1


def test_resumed_run_writes_the_same_model(digits_clients):
    ds, part = digits_clients
    cfg = small_config(algorithm="fedas", rounds=8, eval_every=4, local_steps=2, lr=0.05, mlp_hidden=(16,),
                       new_client_epochs=1)
    saved = []
    whole = train_federated(ds.x, ds.y, 10, part, cfg, device="cpu", on_checkpoint=saved.append)
    resumed = train_federated(ds.x, ds.y, 10, part, cfg, device="cpu", resume=saved[0])
    assert saved[0]["round"] == 4
    assert torch_bytes(resumed.model) == torch_bytes(whole.model)
    assert resumed.outcome.history == whole.outcome.history


@pytest.mark.parametrize("extra,message", [
    (("--set", "fedas_align_lr=0"), "fedas_align_lr must be a finite number > 0 for fedas"),
    (("--set", "fedas_align_epochs=-1"), "fedas_align_epochs must be an integer >= 0 for fedas"),
    (("--set", "fedas_align_batch=0"), "fedas_align_batch must be an integer >= 1 for fedas"),
    (("--set", "new_client_epochs=-1"), "new_client_epochs must be an integer >= 0"),
    (("--set", "fedcp_lambda=1"), "unknown --set key 'fedcp_lambda' for algorithm 'fedas'"),
    (("--set", "fedas_align_rate=1"), "did you mean 'fedas_align_lr'"),
    (("--set", "mlp_hidden=[]"), "splits the client net into a body and a head"),
    (("--dp", "eps=1"), "--dp is not supported by algorithm 'fedas'"),
])
def test_bad_input_is_one_line_and_exit_2(root, tmp_path, capsys, extra, message):
    code = main(["train", "--partition", str(root / "part"), "--algorithm", "fedas", "--out", str(tmp_path / "bad"),
                 "--rounds", "2", *extra])
    err = capsys.readouterr().err
    assert code == 2 and message in err and err.count("\n") == 1, err
    assert not (tmp_path / "bad").exists()


def test_algorithms_lists_it_with_its_keys_and_sources(cli):
    rows = {r["algorithm"]: r for r in json.loads(cli("algorithms", "--format", "json").out)["algorithms"]}
    assert rows["fedas"]["dp"] == "none" and rows["fedas"]["paper"] and rows["fedas"]["new_clients"]
    doc = json.loads(cli("algorithms", "fedas", "--format", "json").out)
    keys = {r["key"]: r for r in doc["keys"]}
    assert list(keys) == registry.get("fedas").keys
    for own in ("fedas_align_lr", "fedas_align_epochs", "fedas_align_batch"):
        assert keys[own]["source"] and keys[own]["source"] != "pflx"
