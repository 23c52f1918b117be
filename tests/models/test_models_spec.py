"""Architecture specs: JSON round trip rebuilds identical parameter names and shapes."""

import json

import pytest

from pfl_cli.errors import InputError
from pfl_cli.models import (
    build,
    client_model,
    client_spec,
    count_parameters,
    describe,
    embedding_net,
    embedding_spec,
    hyper_spec,
    hypernetwork,
    num_parameters,
    param_shapes,
)


def _roundtrip(spec):
    return build(json.loads(json.dumps(spec)))


@pytest.mark.parametrize(
    ("arch", "shape", "resolved"),
    [
        ("auto", (3, 32, 32), "lenet"),
        ("auto", (1, 28, 28), "lenet"),
        ("auto", (64,), "mlp"),
        ("mlp", (3, 32, 32), "mlp"),
    ],
)
def test_client_roundtrip(arch, shape, resolved):
    spec = client_spec(arch, shape, 10, (16, 8))
    assert spec == {
        "kind": "client", "arch": resolved, "input_shape": list(shape), "num_classes": 10, "hidden": [16, 8]
    }
    assert param_shapes(_roundtrip(spec)) == param_shapes(client_model(arch, shape, 10, hidden=(16, 8)))


@pytest.mark.parametrize(
    ("kind", "shape", "resolved"),
    [
        ("auto", (3, 32, 32), "cnn"),
        ("cnn-x", (1, 28, 28), "cnn-x"),
        ("linear", (64,), "linear"),
        ("auto", (64,), "mlp"),
        ("mlp-x", (64,), "mlp-x"),
    ],
)
def test_embedding_roundtrip(kind, shape, resolved):
    spec = embedding_spec(kind, shape, 10, 26, hidden=32)
    assert spec["kind"] == "embedding" and spec["arch"] == resolved and spec["dim"] == 26
    rebuilt = _roundtrip(spec)
    original = embedding_net(kind, shape, 10, 26, hidden=32)
    assert param_shapes(rebuilt) == param_shapes(original)
    assert (rebuilt.uses_inputs, rebuilt.uses_labels) == (original.uses_inputs, original.uses_labels)


@pytest.mark.parametrize("size", ["S", "M"])
def test_hyper_roundtrip(size):
    target = client_spec("auto", (64,), 10)
    spec = hyper_spec(9, target, size, hidden=20)
    assert spec == {"kind": "hypernetwork", "in_dim": 9, "target": target, "size": size, "hidden": 20}
    rebuilt = _roundtrip(spec)
    direct = hypernetwork(9, client_model("mlp", (64,), 10), size=size, hidden=20)
    assert param_shapes(rebuilt) == param_shapes(direct)
    assert rebuilt.target_names == ["fc1.weight", "fc1.bias", "fc2.weight", "fc2.bias"]
    assert num_parameters(spec) == count_parameters(rebuilt)


def test_describe_lenet_hypernetwork_without_building_it():
    spec = hyper_spec(26, client_spec("auto", (3, 32, 32), 10))
    assert num_parameters(spec) == 12_272_382
    assert describe(spec) == (
        "hypernetwork M (hidden 100), 26 -> [client lenet, input (3, 32, 32), 10 classes]: "
        "12,272,382 parameters"
    )
    assert describe(embedding_spec("cnn", (3, 32, 32), 10, 26)).endswith(": 126,542 parameters")


@pytest.mark.parametrize(
    ("spec", "pattern"),
    [
        ({"kind": "optimizer"}, r"spec kind must be one of client, embedding, hypernetwork, table; got 'optimizer'"),
        ({"kind": "client", "arch": "lenet", "num_classes": 10}, r"client spec needs the key 'input_shape'"),
        (
            {"kind": "client", "arch": "lenet", "input_shape": [64], "num_classes": 10},
            r"model_arch 'lenet' needs images .*; got input shape \(64,\)",
        ),
        (
            {"kind": "embedding", "arch": "cnn", "input_shape": [3, 32, 32], "num_classes": 10, "dim": 0},
            r"embed_dim must be an integer >= 1; got 0",
        ),
    ],
)
def test_bad_specs(spec, pattern):
    with pytest.raises(InputError, match=pattern):
        build(spec)


def test_bad_spec_arguments():
    with pytest.raises(InputError, match=r"hyper_size must be one of S, M, L; got 'm'"):
        hyper_spec(26, client_spec("auto", (64,), 10), "m")
    with pytest.raises(InputError, match=r"model_arch must be one of auto, lenet, mlp, hyperfl-cnn, mlp-bn, lenet-bn, lstm, pfllib-cnn, resnet18-cifar; got 'cnn'"):
        client_spec("cnn", (64,), 10)
    with pytest.raises(InputError, match=r"embed_dim must be an integer >= 1; got 0"):
        embedding_spec("linear", (64,), 10, 0)
