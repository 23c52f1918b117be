import numpy as np
import pytest

from pfl_cli.data import load_dataset
from pfl_cli.errors import DatasetError


def test_gmm_roles_share_means_and_are_reproducible():
    c = load_dataset("gmm:clients?d=8&k=3&num_clients=5&client_size=40&seed=2")
    s = load_dataset("gmm:server?d=8&k=3&num_clients=99&seed=2")  # client options are ignored by the server
    again = load_dataset("gmm:clients?d=8&k=3&num_clients=5&client_size=40&seed=2")
    assert np.array_equal(c.x, again.x) and c.x.shape == (200, 8) and len(set(c.client)) == 5
    assert s.x.shape == (3 * 20 + 100, 8) and s.num_classes == 4 and (s.y == 3).sum() == 100
    for j in range(3):  # both roles are drawn around the same means
        assert np.linalg.norm(c.x[c.y == j].mean(0) - s.x[s.y == j].mean(0)) < 1.0
    other = load_dataset("gmm:clients?d=8&k=3&num_clients=5&client_size=40&seed=3")
    assert not np.array_equal(c.x, other.x)


def test_gmm_missing_components_leave_the_server():
    s = load_dataset("gmm:server?d=4&k=5&missing=2")
    assert set(np.unique(s.y)) == {0, 1, 2, 5}


@pytest.mark.parametrize("spec,match", [("gmm:nobody", "role"), ("gmm:server?dd=3", "unknown option"),
                                        ("gmm:server?k=x", "integer"), ("gmm:server?variance=0", "variance")])
def test_gmm_bad_specs(spec, match):
    with pytest.raises(DatasetError, match=match):
        load_dataset(spec)
