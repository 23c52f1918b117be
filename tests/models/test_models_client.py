"""Client networks: Table B.1 LeNet, the MLP and the ``auto`` architecture choice."""

import pytest
import torch

from pfl_cli.errors import InputError
from pfl_cli.models import MLP, LeNet, client_model, count_parameters

LAYERS = ("conv1", "conv2", "fc1", "fc2", "fc3")
LENET_NAMES = [f"{layer}.{p}" for layer in LAYERS for p in ("weight", "bias")]


@pytest.mark.parametrize(
    ("input_shape", "num_classes", "expected"),
    [
        ((3, 32, 32), 10, 121_182),  # CIFAR-10, §2.1
        ((3, 32, 32), 100, 128_832),  # CIFAR-100
        ((1, 28, 28), 62, 124_802),  # FEMNIST: padded to 32x32, FC1 stays 800
    ],
)
def test_lenet_parameter_count(input_shape, num_classes, expected):
    model = client_model("lenet", input_shape, num_classes)
    assert isinstance(model, LeNet)
    assert count_parameters(model) == expected
    assert model.fc1.in_features == 800


def test_lenet_names_and_no_buffers():
    model = LeNet(3, 10, 32)
    assert list(dict(model.named_parameters())) == LENET_NAMES
    assert list(model.named_buffers()) == []


@pytest.mark.parametrize(("shape", "channels"), [((5, 3, 32, 32), 3), ((7, 1, 28, 28), 1)])
def test_lenet_output_shape(shape, channels):
    model = LeNet(channels, 10, shape[-2:])
    assert model(torch.randn(*shape)).shape == (shape[0], 10)


def test_lenet_pads_small_images_with_zeros():
    torch.manual_seed(0)
    model = LeNet(1, 10, 28)
    x = torch.randn(3, 1, 28, 28)
    padded = torch.nn.functional.pad(x, (2, 2, 2, 2))
    big = LeNet(1, 10, 32)
    big.load_state_dict(model.state_dict())
    torch.testing.assert_close(model(x), big(padded))


def test_lenet_larger_images_size_fc1_from_shape():
    model = LeNet(3, 10, (40, 36))
    # 40 -> 36 -> 18 -> 14 -> 7 ; 36 -> 32 -> 16 -> 12 -> 6
    assert model.fc1.in_features == 32 * 7 * 6
    assert model(torch.randn(2, 3, 40, 36)).shape == (2, 10)


def test_mlp_digits_count_and_names():
    model = client_model("auto", (64,), 10)
    assert isinstance(model, MLP)
    assert count_parameters(model) == 2_410  # 64 -> 32 -> 10, §7.2
    assert list(dict(model.named_parameters())) == ["fc1.weight", "fc1.bias", "fc2.weight", "fc2.bias"]
    assert model(torch.randn(4, 64)).shape == (4, 10)


def test_mlp_flattens_and_takes_hidden():
    model = client_model("mlp", (2, 4, 4), 3, hidden=(5, 6))
    assert [tuple(p.shape) for p in model.parameters()] == [(5, 32), (5,), (6, 5), (6,), (3, 6), (3,)]
    assert model(torch.randn(2, 2, 4, 4)).shape == (2, 3)
    assert count_parameters(client_model("mlp", (8,), 4, hidden=())) == 36


@pytest.mark.parametrize(
    ("input_shape", "arch"),
    [((3, 32, 32), "lenet"), ((1, 28, 28), "lenet"), ((64,), "mlp"), ((1, 8, 8), "mlp"), ((28, 28), "mlp")],
)
def test_auto_arch(input_shape, arch):
    model = client_model("auto", input_shape, 10)
    assert isinstance(model, LeNet if arch == "lenet" else MLP)


def test_unknown_arch_lists_choices():
    with pytest.raises(InputError, match=r"model_arch must be one of auto, lenet, mlp, hyperfl-cnn, mlp-bn, lenet-bn, lstm, pfllib-cnn, resnet18-cifar; got 'resnet'"):
        client_model("resnet", (3, 32, 32), 10)


def test_lenet_on_vectors_is_refused():
    with pytest.raises(InputError) as err:
        client_model("lenet", (64,), 10)
    assert str(err.value) == (
        "model_arch 'lenet' needs images (C, H, W) of at least 28x28; got input shape (64,)."
    )


@pytest.mark.parametrize(
    ("kwargs", "pattern"),
    [
        ({"num_classes": 1}, r"num_classes must be an integer >= 2; got 1"),
        ({"hidden": (32, 0)}, r"mlp_hidden must be a sequence of positive integers; got \(32, 0\)"),
        ({"input_shape": (0, 4)}, r"input_shape .*; got \(0, 4\)"),
    ],
)
def test_bad_values(kwargs, pattern):
    args = {"input_shape": (64,), "num_classes": 10} | kwargs
    hidden = args.pop("hidden", (32,))
    with pytest.raises(InputError, match=pattern):
        client_model("mlp", args["input_shape"], args["num_classes"], hidden=hidden)


def test_lenet_image_size_too_small():
    with pytest.raises(InputError, match=r"image_size .*>= 28; got 16"):
        LeNet(3, 10, 16)
