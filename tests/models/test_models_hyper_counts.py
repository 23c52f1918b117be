"""Parameter counts of the pFedHN and HyperFL networks (spec D.1 items 1 and 2)."""

import pytest
import torch

from pfl_cli.fl.split import split_names
from pfl_cli.models import build, client_spec, hyper_spec, num_parameters
from pfl_cli.models.util import count_parameters


@pytest.mark.parametrize("kernels,count", [(8, 62_958), (16, 121_182), (32, 256_830)])
def test_pfedhn_lenet_sizes(kernels, count):
    assert num_parameters(client_spec("lenet", (3, 32, 32), 10, kernels=kernels)) == count


def test_pfedhn_targets_and_hypernetwork():
    c10 = client_spec("lenet", (3, 32, 32), 10)
    assert num_parameters(client_spec("lenet", (3, 32, 32), 100)) == 128_832
    hn = hyper_spec(13, c10, "M", 100)  # e = int(1 + 50/4) = 13, 3 x 100
    assert num_parameters(hn) == 12_271_082
    net = build(c10)
    features, head = split_names(net)
    assert head == ["fc3.weight", "fc3.bias"]
    assert sum(p.numel() for k, p in net.named_parameters() if k in features) == 120_332  # pFedHN-PC extractor
    h = build(hn)
    assert count_parameters(h) == 12_271_082
    out = h(torch.zeros(13))
    assert {k: tuple(v.shape) for k, v in out.items()} == {k: tuple(p.shape) for k, p in net.named_parameters()}


def test_hyperfl_networks():
    cifar = client_spec("hyperfl-cnn", (3, 32, 32), 10)
    net = build(cifar)
    features, head = split_names(net)
    count = {k: p.numel() for k, p in net.named_parameters()}
    assert sum(count[k] for k in features) == 106_400 and sum(count[k] for k in head) == 1_290
    hn = hyper_spec(64, cifar, "M", 128, n_hidden=0, relu_out=True, generate=features)
    assert num_parameters(hn) == 13_733_920
    assert num_parameters(hn) // num_parameters(client_spec("hyperfl-cnn", (3, 32, 32), 10)) >= 127  # ~128x
    mnist = build(client_spec("hyperfl-cnn", (1, 28, 28), 10))
    f, _ = split_names(mnist)
    assert sum(p.numel() for k, p in mnist.named_parameters() if k in f) == 115_776
