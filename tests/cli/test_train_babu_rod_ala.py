"""`pflx train` / `pflx predict` / `pflx algorithms` end to end with FedBABU, FedRoD, FedBN, FedALA, FedDBE, GPFL and pFedLA (issue 35)."""

import json

import pytest
import torch

from pfl_cli import registry
from pfl_cli.cli.app import main as _main
from pflx_testing import cli_args, small_config

NAMES = ("fedbabu", "fedrod", "fedbn", "fedala", "feddbe", "gpfl", "pfedla")
PRIVATE = ("fedrod", "fedbn", "fedala", "feddbe", "gpfl", "pfedla")
FAST = ["--rounds", "12", "--eval-every", "6", "--local-steps", "3", "--lr", "0.05", "--clients-per-round", "16",
        "--set", "mlp_hidden=[16]", "--set", "new_client_epochs=2", "--set", "finetune_epochs=2",
        "--set", "ala_max_start_epochs=5"]


def main(argv):
    """pflx; a train command gets the shared small settings only where its algorithm takes them."""
    argv = [str(a) for a in argv]
    return _main(cli_args(argv) if argv[:1] == ["train"] else argv)


@pytest.mark.parametrize("name", NAMES)
def test_train_then_predict_train_and_new_clients(train_predicts, name):
    # new FedBN / FedDBE clients start from untrained normalization weights / a zero bias: 2 epochs leave them
    # near chance (their default: 20)
    extra = ["--set", "new_client_epochs=20"] if name in ("fedbn", "feddbe") else []
    metrics, payload, preds = train_predicts(name, [*FAST, *extra], run=main)
    assert metrics["train"]["mean_accuracy"] > 0.5
    floats = metrics["communication"]["floats_down_per_client_round"] + \
        metrics["communication"]["floats_up_per_client_round"]
    # feddbe's one-time consensus (2 x 16 means of the 16-unit representation) on top of its rounds
    once = 2 * 16 * 16 / metrics["communication"]["client_rounds"] if name == "feddbe" else 0
    assert floats == pytest.approx(registry.get(name).algorithm.floats_per_client_round(payload["arch"]) + once)
    assert ("private" in payload["weights"]) == (name in PRIVATE)
    for clients, m in preds.items():
        assert m["personalized"]
        # train clients of fedrod and fedala are served from their private state; fedbabu fine-tunes everyone
        assert (m["optimizer_steps"] == 0) == (clients == "train" and name in PRIVATE)
        assert m["mean_accuracy"] > 0.4, (name, clients, m["mean_accuracy"])  # chance: 0.1


@pytest.mark.parametrize("name", NAMES)
def test_resumed_run_writes_the_same_model(resume_matches, name):
    resume_matches(small_config(algorithm=name, rounds=8, eval_every=4, local_steps=2, lr=0.05, mlp_hidden=(16,),
                                new_client_epochs=1, finetune_epochs=1, ala_max_start_epochs=4), at=4)


@pytest.mark.parametrize("extra,message", [
    (("--algorithm", "fedbabu", "--set", "finetune_epochs=-1"), "finetune_epochs must be an integer >= 0"),
    (("--algorithm", "fedbabu", "--set", "mlp_hidden=[]"), "splits the client net into a body and a head"),
    (("--algorithm", "fedala", "--set", "ala_sample=2"), "ala_sample must be a fraction in (0, 1] for fedala"),
    (("--algorithm", "fedala", "--set", "ala_layers=0"), "ala_layers must be an integer >= 1 for fedala"),
    (("--algorithm", "fedrod", "--set", "ala_eta=1"), "unknown --set key 'ala_eta' for algorithm 'fedrod'"),
    (("--algorithm", "fedrod", "--dp", "eps=1"), "fedrod"),
    (("--algorithm", "feddbe", "--set", "dbe_momentum=2"), "dbe_momentum must be a number in (0, 1] for feddbe"),
    (("--algorithm", "gpfl", "--set", "gpfl_lambda=-1"), "gpfl_lambda must be a finite number >= 0 for gpfl"),
    (("--algorithm", "pfedla", "--set", "pfedla_hn_lr=0"), "pfedla_hn_lr must be a finite number > 0 for pfedla"),
    (("--algorithm", "pfedla", "--set", "pfedla_embed_dim=0"), "pfedla_embed_dim must be an integer >= 1 for pfedla"),
    (("--algorithm", "pfedla", "--set", "dbe_kappa=1"), "unknown --set key 'dbe_kappa' for algorithm 'pfedla'"),
    (("--algorithm", "pfedla", "--dp", "eps=1"), "pfedla"),
    (("--algorithm", "fedbn", "--set", "model_arch=mlp"), "model_arch: fedbn keeps the client net's normalization"),
    (("--algorithm", "fedavg", "--set", "model_arch=mlp-bn"), "model_arch 'mlp-bn' has batch-norm layers"),
])
def test_bad_input_is_one_line_and_exit_2(train_refused, extra, message):
    # pflx itself (not main above, which drops the keys an algorithm does not take)
    train_refused(["--rounds", "2", *extra], message, run=_main)


@pytest.mark.parametrize("name", NAMES)
def test_algorithms_lists_each_with_its_keys_and_sources(listed_with_sources, name):
    own = {"fedbabu": "finetune_epochs", "fedrod": "new_client_epochs", "fedbn": "model_arch", "fedala": "ala_eta",
           "feddbe": "dbe_kappa", "gpfl": "gpfl_lambda", "pfedla": "pfedla_hn_lr"}[name]
    listed_with_sources(name, (own,))


def test_fedbn_on_images_with_lenet_bn(tmp_path, cli):
    """lenet-bn: LeNet with a BatchNorm after Conv1, Conv2, FC1 and FC2; its parameter count in metrics.json."""
    import numpy as np

    rng = np.random.default_rng(0)
    y = np.repeat(np.arange(10), 12)
    x = (rng.integers(0, 96, size=(120, 1, 28, 28)) + 16 * y[:, None, None, None]).astype(np.uint8)
    np.savez(tmp_path / "img.npz", x=x, y=y)
    part, model, pred = tmp_path / "part", tmp_path / "fedbn", tmp_path / "pred"
    assert cli("partition", "--dataset", f"npz:{tmp_path / 'img.npz'}", "--classes-per-client", "2",
               "--class-shares", "equal", "--num-clients", "6", "--holdout-clients", "1", "--test-fraction", "0.25",
               "--out", part, "--format", "quiet").code == 0
    run = cli("train", "--partition", part, "--algorithm", "fedbn", "--set", "model_arch=lenet-bn", "--rounds", "2",
              "--local-steps", "2", "--batch-size", "8", "--set", "new_client_epochs=1",
              "--set", "eval_every=2", "--out", model, "--format", "quiet")
    assert run.code == 0, run.err
    metrics = json.loads((model / "metrics.json").read_text())
    bn = 2 * (16 + 32 + 120 + 84)  # the normalization layers' weights and biases, kept on the clients
    assert metrics["parameters"]["client"] == 120_332 + 85 * 10 - 800 + bn  # Table B.1's LeNet, 1 channel, + BN
    payload = torch.load(model / "model.pt", weights_only=True)
    assert payload["arch"]["client"]["arch"] == "lenet-bn"
    assert set(payload["weights"]["private"]["values"]) == {f"bn{i}.{k}" for i in range(1, 5)
                                                            for k in ("weight", "bias", "running_mean", "running_var")}
    out = cli("predict", "--model", model, "--partition", part, "--clients", "holdout", "--out", pred,
              "--format", "quiet")
    assert out.code == 0, out.err
