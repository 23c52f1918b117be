"""``gmm:ROLE?...``: the thesis's Gaussian mixtures for ``pflx cluster`` (App. D.7.1).

A k-component mixture in R^d with means uniform in the unit cube [0, 1]^d, covariance
``variance * I`` and equal weights. The client data set (``gmm:clients``) holds
``num_clients x client_size`` points drawn i.i.d. from the mixture, with a natural client
id per point (partition it with ``pflx partition --natural-id --test-fraction 0``). The
server data set (``gmm:server``) holds ``server_per_component`` points of every component
(except the last ``missing`` ones, App. D.8.2) plus ``server_uniform`` points uniform on
[0, 1]^d: small and partly out of distribution.

Both roles take the same options and draw from named streams of one ``seed``, so the
means they share are identical and each role's points depend only on its own options::

    gmm:clients?d=100&k=10&num_clients=100&client_size=1000&seed=0
    gmm:server?d=100&k=10&seed=0

Options (defaults are the thesis's data-point-level setup): ``d`` (100), ``k`` (10),
``variance`` (0.5), ``num_clients`` (100), ``client_size`` (1000),
``server_per_component`` (20), ``server_uniform`` (100), ``missing`` (0), ``seed`` (0).
Labels: the component; server uniform points get label ``k`` (``num_classes = k + 1``).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from pfl_cli.data.base import Dataset, numeric_options
from pfl_cli.errors import DatasetError, check_memory
from pfl_cli.rng import make_rng

ROLES = ("clients", "server")
_INT_OPTIONS = {"d": 100, "k": 10, "num_clients": 100, "client_size": 1000, "server_per_component": 20,
                "server_uniform": 100, "missing": 0, "seed": 0}
_FLOAT_OPTIONS = {"variance": 0.5}


@dataclass(frozen=True)
class GaussianMixtureSpec:
    """Parameters of the thesis's synthetic mixture (App. D.7.1)."""

    d: int = 100
    k: int = 10
    variance: float = 0.5
    num_clients: int = 100
    client_size: int = 1000
    server_per_component: int = 20
    server_uniform: int = 100
    missing: int = 0
    seed: int = 0


def mixture_means(p: GaussianMixtureSpec) -> np.ndarray:
    """The k means, uniform in [0, 1]^d; shape (k, d)."""
    return make_rng(p.seed, "gmm-means").uniform(0.0, 1.0, size=(p.k, p.d))


def client_points(p: GaussianMixtureSpec) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Client data: points (m, d), component labels (m,), owning client (m,), m = n x size."""
    rng = make_rng(p.seed, "gmm-clients")
    means = mixture_means(p)
    m = p.num_clients * p.client_size
    labels = rng.integers(0, p.k, size=m)  # z ~ Categorical(1/k)
    x = means[labels] + rng.normal(0.0, np.sqrt(p.variance), size=(m, p.d))
    owner = np.repeat(np.arange(p.num_clients), p.client_size)
    return x, labels.astype(np.int64), owner


def server_points(p: GaussianMixtureSpec) -> tuple[np.ndarray, np.ndarray]:
    """Server data: ``server_per_component`` points of each present component + uniform points."""
    rng = make_rng(p.seed, "gmm-server")
    means = mixture_means(p)
    present = np.arange(p.k - p.missing)
    labels = np.repeat(present, p.server_per_component)
    inside = means[labels] + rng.normal(0.0, np.sqrt(p.variance), size=(len(labels), p.d))
    uniform = rng.uniform(0.0, 1.0, size=(p.server_uniform, p.d))
    x = np.concatenate([inside, uniform])
    y = np.concatenate([labels, np.full(p.server_uniform, p.k)]).astype(np.int64)
    return x, y


def parse_options(spec: str, options: dict[str, str]) -> GaussianMixtureSpec:
    """The :class:`GaussianMixtureSpec` of a ``gmm:`` spec's options, validated."""
    p = numeric_options(spec, options, GaussianMixtureSpec, tuple(_INT_OPTIONS), tuple(_FLOAT_OPTIONS), lambda p: [
        ("d", p.d >= 1, ">= 1"), ("k", p.k >= 1, ">= 1"), ("variance", p.variance > 0, "> 0"),
        ("num_clients", p.num_clients >= 1, ">= 1"), ("client_size", p.client_size >= 1, ">= 1"),
        ("server_per_component", p.server_per_component >= 0, ">= 0"),
        ("server_uniform", p.server_uniform >= 0, ">= 0"), ("missing", 0 <= p.missing <= p.k, "in [0, k]"),
        ("seed", p.seed >= 0, ">= 0"),
    ])
    # The client points (m x d float64), their labels and owners (int64), m = num_clients x client_size.
    m = float(p.num_clients) * p.client_size
    check_memory(f"{spec}: num_clients {p.num_clients} x client_size {p.client_size} points of dimension {p.d}",
                 8.0 * m * (p.d + 2), fix="Lower num_clients, client_size or d.")
    if p.server_per_component * (p.k - p.missing) + p.server_uniform == 0:
        raise DatasetError(f"{spec}: the server data set would be empty; raise server_per_component or server_uniform.")
    return p


def load(arg: str, options: dict[str, str], spec: str) -> Dataset:
    """Loader of the ``gmm:`` scheme (see the module docstring)."""
    role = arg.strip().lower()
    if role not in ROLES:
        raise DatasetError(f"{spec}: gmm takes a role, gmm:clients or gmm:server; got {arg!r}.")
    p = parse_options(spec, options)
    extra = {"generator": {"scheme": "gmm", "role": role, **p.__dict__}}
    if role == "clients":
        x, y, owner = client_points(p)
        width = len(str(p.num_clients - 1))
        names = np.char.add("c", np.char.zfill(owner.astype(str), width))
        return Dataset(spec=spec, x=x, y=y, num_classes=p.k, client=names, extra=extra)
    x, y = server_points(p)
    return Dataset(spec=spec, x=x, y=y, num_classes=p.k + 1, extra=extra)
