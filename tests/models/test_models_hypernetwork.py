"""Hypernetwork of Table B.3: counts for S/M/L and exact unflattening into the client model."""

import pytest
import torch
from torch.func import functional_call, vmap

from pfl_cli.errors import InputError
from pfl_cli.models import (
    HyperNetwork,
    client_model,
    count_parameters,
    hypernetwork,
    param_shapes,
    stacked_params,
)

L = 26  # int(1 + 100 / 4), §2.4


@pytest.fixture(scope="module")
def lenet():
    torch.manual_seed(0)
    return client_model("lenet", (3, 32, 32), 10)


@pytest.fixture(scope="module")
def hyper_m(lenet):
    torch.manual_seed(1)
    return hypernetwork(L, lenet, size="M")


def test_count_m(hyper_m, lenet):
    assert count_parameters(lenet) == 121_182
    assert count_parameters(hyper_m) == 12_272_382  # §2.3: 100 l + 100 + 3 * 10,100 + 101 D


@pytest.mark.parametrize(("size", "expected"), [("S", 12_252_182), ("L", 12_292_582)])
def test_count_s_l(lenet, size, expected):
    assert count_parameters(hypernetwork(L, lenet, size=size)) == expected


def test_body_layout(hyper_m):
    linears = [m for m in hyper_m.body if isinstance(m, torch.nn.Linear)]
    assert [(m.in_features, m.out_features) for m in linears] == [(26, 100)] + [(100, 100)] * 3
    assert not isinstance(hyper_m.body[-1], torch.nn.ReLU)  # no ReLU after the last hidden layer
    assert len(hyper_m.heads) == 10


def test_output_unflattens_into_client(hyper_m, lenet):
    v = torch.randn(3, L)
    with torch.no_grad():
        out = hyper_m(v)
    assert list(out) == list(dict(lenet.named_parameters()))
    assert {k: tuple(t.shape[1:]) for k, t in out.items()} == param_shapes(lenet)
    x = torch.randn(4, 3, 32, 32)
    for i in range(3):
        logits = functional_call(lenet, {k: out[k][i] for k in out}, (x,))
        assert logits.shape == (4, 10)
    # a cohort at once, as the trainers run it
    cohort = vmap(lambda p, xb: functional_call(lenet, p, (xb,)))(out, x.expand(3, *x.shape))
    assert cohort.shape == (3, 4, 10)


def test_batched_equals_single(hyper_m):
    v = torch.randn(4, L)
    with torch.no_grad():
        batched = hyper_m(v)
        singles = [hyper_m(v[i]) for i in range(4)]
    for name, t in batched.items():
        assert singles[0][name].shape == t.shape[1:]
        torch.testing.assert_close(t, torch.stack([s[name] for s in singles]))


def test_gradient_reaches_descriptor():
    h = HyperNetwork(3, {"w": (2, 2)}, hidden=5, n_hidden=1)
    v = torch.randn(3, requires_grad=True)
    h(v)["w"].sum().backward()
    assert v.grad is not None and v.grad.abs().sum() > 0


def test_unknown_size(lenet):
    with pytest.raises(InputError, match=r"hyper_size must be one of S, M, L; got 'XL'"):
        hypernetwork(L, lenet, size="XL")


def test_wrong_descriptor_shape():
    h = HyperNetwork(3, {"w": (2,)}, hidden=4, n_hidden=1)
    with pytest.raises(InputError, match=r"shape \(c, 3\) or \(3,\); got \(2, 4\)"):
        h(torch.zeros(2, 4))


def test_target_with_buffers_refused():
    with pytest.raises(InputError, match=r"target must hold no buffers"):
        hypernetwork(4, torch.nn.BatchNorm1d(3))


def test_stacked_params_are_independent_copies(lenet):
    stacked = stacked_params(lenet, 3)
    expected = {k: (3, *s) for k, s in param_shapes(lenet).items()}
    assert {k: tuple(t.shape) for k, t in stacked.items()} == expected
    for name, p in lenet.named_parameters():
        assert not stacked[name].requires_grad
        torch.testing.assert_close(stacked[name][2], p.detach())
    stacked["fc3.bias"][0] += 1.0
    assert not torch.equal(stacked["fc3.bias"][0], stacked["fc3.bias"][1])
