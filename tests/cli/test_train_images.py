"""The image path end to end: CIFAR-shaped uint8 images -> LeNet clients, label-plane CNN embedding."""

import json

import numpy as np
import torch


def test_partition_train_predict_on_cifar_shaped_images(tmp_path, cli):
    rng = np.random.default_rng(0)
    y = np.repeat(np.arange(10), 24)
    # class-dependent mean colour, so there is something to learn
    x = (rng.integers(0, 96, size=(240, 3, 32, 32)) + 16 * y[:, None, None, None]).astype(np.uint8)
    np.savez(tmp_path / "img.npz", x=x, y=y)
    part, model, pred = tmp_path / "part", tmp_path / "pefll", tmp_path / "pred"
    assert cli("partition", "--dataset", f"npz:{tmp_path / 'img.npz'}", "--classes-per-client", "2",
               "--class-shares", "equal", "--num-clients", "10", "--holdout-clients", "2", "--test-fraction", "0.25",
               "--out", part, "--format", "quiet").code == 0
    run = cli("train", "--partition", part, "--rounds", "4", "--eval-every", "2", "--local-steps", "2",
              "--batch-size", "8", "--set", "hyper_hidden=8", "--set", "descriptor_batch=8", "--out", model,
              "--format", "json")
    assert run.code == 0, run.err
    metrics = json.loads((model / "metrics.json").read_text())
    assert metrics["parameters"]["client"] == 121_182  # Table B.1 LeNet, chosen from the input shape
    # Table B.2 with 3 + 10 input channels (one-hot label planes) and l = int(1 + 10 / 4) = 3
    assert metrics["parameters"]["embedding"] == (13 * 16 * 25 + 16) + (16 * 32 * 25 + 32) + (800 * 120 + 120) \
        + (120 * 84 + 84) + (84 * 3 + 3) == 124_587
    payload = torch.load(model / "model.pt", weights_only=True)
    assert payload["arch"]["client"]["arch"] == "lenet" and payload["arch"]["embedding"]["arch"] == "cnn"
    assert payload["normalization"]["mean"].shape == (3, 1, 1)  # per-channel standardization
    out = cli("predict", "--model", model, "--partition", part, "--clients", "holdout", "--out", pred,
              "--format", "json")
    assert out.code == 0, out.err
    result = json.loads(out.out)
    assert result["num_clients"] == 2 and result["optimizer_steps"] == 0
