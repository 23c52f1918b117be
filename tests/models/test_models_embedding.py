"""Embedding networks phi(x, y): Table B.2 counts, per-sample shapes, what each one reads."""

import pytest
import torch
import torch.nn.functional as F

from pfl_cli.errors import InputError
from pfl_cli.models import CNNEmbedding, LinearEmbedding, MLPEmbedding, count_parameters, embedding_net

CIFAR = (3, 32, 32)
KINDS = {  # kind -> (input shape, reads x, reads y)
    "cnn": (CIFAR, True, True),
    "cnn-x": (CIFAR, True, False),
    "linear": (CIFAR, False, True),
    "mlp": ((64,), True, True),
    "mlp-x": ((64,), True, False),
}


@pytest.mark.parametrize(("dim", "expected"), [(26, 126_542), (126, 135_042), (251, 145_667)])
def test_cnn_embedding_count(dim, expected):
    assert count_parameters(embedding_net("cnn", CIFAR, 10, dim)) == expected  # §2.2


def test_cnn_x_count():
    assert count_parameters(embedding_net("cnn-x", CIFAR, 10, 26)) == 122_542  # 4,000 fewer


def test_mlp_and_linear_counts():
    # §7.2 digits: 74 -> 64 -> 64 -> l
    assert count_parameters(embedding_net("mlp", (64,), 10, 26)) == 75 * 64 + 65 * 64 + 65 * 26  # 11,234
    assert count_parameters(embedding_net("mlp-x", (64,), 10, 26)) == 65 * 64 + 65 * 64 + 65 * 26
    assert count_parameters(embedding_net("linear", (64,), 10, 26)) == 10 * 26 + 26


def _batch(shape, b=6, c=10, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(b, *shape, generator=g)
    y = torch.randint(0, c, (b,), generator=g)
    return x, F.one_hot(y, c).float(), F.one_hot((y + 1) % c, c).float()


@pytest.mark.parametrize("kind", list(KINDS))
def test_reads_what_it_says(kind):
    shape, reads_x, reads_y = KINDS[kind]
    torch.manual_seed(0)
    net = embedding_net(kind, shape, 10, 7)
    assert (net.uses_inputs, net.uses_labels) == (reads_x, reads_y)
    x, y, y_other = _batch(shape)
    out = net(x, y)
    assert out.shape == (6, 7)
    assert not torch.allclose(out, net(x, y_other)) if reads_y else torch.equal(out, net(x, y_other))
    x_other = torch.randn_like(x)
    assert not torch.allclose(out, net(x_other, y)) if reads_x else torch.equal(out, net(x_other, y))


def test_embeddings_are_per_sample():
    torch.manual_seed(0)
    net = embedding_net("cnn", CIFAR, 10, 5)
    x, y, _ = _batch(CIFAR)
    full = net(x, y)
    torch.testing.assert_close(full[2:3], net(x[2:3], y[2:3]))


def test_cnn_on_mnist_sized_images():
    net = embedding_net("auto", (1, 28, 28), 10, 5)
    assert isinstance(net, CNNEmbedding) and net.conv1.in_channels == 11 and net.fc1.in_features == 800
    x, y, _ = _batch((1, 28, 28))
    assert net(x, y).shape == (6, 5)


@pytest.mark.parametrize(
    ("shape", "cls"), [(CIFAR, CNNEmbedding), ((1, 28, 28), CNNEmbedding), ((64,), MLPEmbedding)]
)
def test_auto(shape, cls):
    assert type(embedding_net("auto", shape, 10, 3)) is cls


def test_linear_is_linear_in_the_label():
    net = embedding_net("linear", (64,), 10, 4)
    assert isinstance(net, LinearEmbedding)
    y = torch.eye(10)
    torch.testing.assert_close(net(torch.zeros(10, 64), y), net.fc.weight.T + net.fc.bias)


def test_unknown_kind():
    pattern = r"embedding must be one of auto, cnn, cnn-x, linear, mlp, mlp-x, lstm, lstm-x; got 'gru'"
    with pytest.raises(InputError, match=pattern):
        embedding_net("gru", CIFAR, 10, 26)


@pytest.mark.parametrize("kind", ["cnn", "cnn-x"])
def test_cnn_on_vectors(kind):
    with pytest.raises(InputError) as err:
        embedding_net(kind, (64,), 10, 26)
    assert str(err.value) == (
        f"embedding '{kind}' needs images (C, H, W) of at least 28x28; got input shape (64,)."
    )


@pytest.mark.parametrize("kind", list(KINDS))
def test_dim_zero(kind):
    with pytest.raises(InputError, match=r"embed_dim must be an integer >= 1; got 0"):
        embedding_net(kind, KINDS[kind][0], 10, 0)
