import numpy as np
import pytest

from pfl_cli.rng import make_rng, torch_generator


def test_named_streams_are_reproducible_and_independent():
    a1 = make_rng(3, "partition").random(5)
    a2 = make_rng(3, "partition").random(5)
    b = make_rng(3, "holdout").random(5)
    c = make_rng(4, "partition").random(5)
    np.testing.assert_array_equal(a1, a2)
    assert not np.allclose(a1, b) and not np.allclose(a1, c)


def test_torch_generator_follows_the_seed():
    torch = pytest.importorskip("torch")
    x = torch.rand(3, generator=torch_generator(1, "init"))
    y = torch.rand(3, generator=torch_generator(1, "init"))
    z = torch.rand(3, generator=torch_generator(2, "init"))
    assert torch.equal(x, y) and not torch.equal(x, z)


@pytest.mark.parametrize("seed", [-1, 1.5, True])
def test_bad_seed(seed):
    with pytest.raises(ValueError, match="seed must be a non-negative integer"):
        make_rng(seed, "x")
