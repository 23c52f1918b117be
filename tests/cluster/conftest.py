import numpy as np
import pytest

from pfl_cli.data.synthetic import GaussianMixtureSpec, client_points, server_points


def mixture(**kw):
    """(points, offsets, server) of a gmm spec, clients grouped by owner."""
    spec = GaussianMixtureSpec(**kw)
    x, _, owner = client_points(spec)
    q, _ = server_points(spec)
    return x, np.searchsorted(owner, np.arange(spec.num_clients + 1)), q


@pytest.fixture(scope="session")
def make_mixture():
    return mixture


@pytest.fixture(scope="session")
def small_mixture():
    return mixture(d=30, k=4, num_clients=20, client_size=150, seed=3)
