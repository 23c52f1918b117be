"""``ring:[?...]``: the synthetic "ring" task that needs personalization (pflx's own, docs/ring-personalization.md).

C classes (default 10) whose means lie equally spaced on a circle of radius ``radius`` in
the first two dimensions, class c at angle 2*pi*c/C; a sample is its class mean plus
``sigma * N(0, I_2)`` there, followed by ``noise_dims`` pure N(0, 1) nuisance dimensions
(x is float32 of shape (N, 2 + noise_dims), (N, 64) by default).

What it is for: neighbouring classes overlap, so one global model is capped near the
10-way Bayes accuracy of about 47%, while a client that knows its 2 classes can reach
about 89% (the mean 2-way Bayes accuracy over random class pairs). Partition it with 2
classes per client and the official test pool matched to each client's train labels::

    pflx partition --dataset ring: --classes-per-client 2 --class-shares equal \\
        --num-clients 100 --holdout-clients 20 --out runs/ring

Every class has ``train_per_class`` samples in the train pool and ``test_per_class`` in
the test pool; the sample order is the train pool, then the test pool, each shuffled.
The two pools draw from their own named streams of one ``seed``, so changing one pool's
size never changes the other pool's samples::

    ring:
    ring:?seed=1
    ring:?classes=10&train_per_class=126&test_per_class=200&radius=2&sigma=1&noise_dims=62&seed=0

Options (defaults: the task of docs/ring-personalization.md): ``classes`` (10), ``train_per_class`` (126),
``test_per_class`` (200), ``radius`` (2), ``sigma`` (1), ``noise_dims`` (62), ``seed`` (0).
Labels: the class, int64 in [0, classes).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from pfl_cli.data.base import POOL_TEST, POOL_TRAIN, Dataset, numeric_options
from pfl_cli.errors import DatasetError
from pfl_cli.rng import make_rng

_INT_OPTIONS = {"classes": 10, "train_per_class": 126, "test_per_class": 200, "noise_dims": 62, "seed": 0}
_FLOAT_OPTIONS = {"radius": 2.0, "sigma": 1.0}


@dataclass(frozen=True)
class RingSpec:
    """Parameters of the synthetic ring task (docs/ring-personalization.md)."""

    classes: int = 10
    train_per_class: int = 126
    test_per_class: int = 200
    radius: float = 2.0
    sigma: float = 1.0
    noise_dims: int = 62
    seed: int = 0


def ring_means(p: RingSpec) -> np.ndarray:
    """The class means in the two informative dimensions; shape (classes, 2)."""
    angle = 2.0 * np.pi * np.arange(p.classes) / p.classes
    return p.radius * np.stack([np.cos(angle), np.sin(angle)], axis=1)


def pool_points(p: RingSpec, per_class: int, stream: str) -> tuple[np.ndarray, np.ndarray]:
    """``per_class`` samples of every class, shuffled: x (m, 2 + noise_dims) float32, y (m,) int64."""
    rng = make_rng(p.seed, stream)
    labels = rng.permutation(np.repeat(np.arange(p.classes, dtype=np.int64), per_class))
    m = len(labels)
    informative = ring_means(p)[labels] + rng.normal(0.0, p.sigma, size=(m, 2))
    nuisance = rng.normal(0.0, 1.0, size=(m, p.noise_dims))
    x = np.concatenate([informative, nuisance], axis=1).astype(np.float32)
    return x, labels


def parse_options(spec: str, options: dict[str, str]) -> RingSpec:
    """The :class:`RingSpec` of a ``ring:`` spec's options, validated."""
    p = numeric_options(spec, options, RingSpec, tuple(_INT_OPTIONS), tuple(_FLOAT_OPTIONS), lambda p: [
        ("classes", p.classes >= 2, ">= 2"), ("train_per_class", p.train_per_class >= 1, ">= 1"),
        ("test_per_class", p.test_per_class >= 0, ">= 0"),
        ("radius", math.isfinite(p.radius) and p.radius >= 0, "finite and >= 0"),
        ("sigma", math.isfinite(p.sigma) and p.sigma > 0, "finite and > 0"),
        ("noise_dims", p.noise_dims >= 0, ">= 0"), ("seed", p.seed >= 0, ">= 0"),
    ])
    return p


def load(arg: str, options: dict[str, str], spec: str) -> Dataset:
    """Loader of the ``ring:`` scheme (see the module docstring)."""
    if arg.strip():
        raise DatasetError(f"{spec}: ring takes no argument before '?', only options (ring: or ring:?seed=1); got {arg!r}.")
    p = parse_options(spec, options)
    x_train, y_train = pool_points(p, p.train_per_class, "ring-train")
    x_test, y_test = pool_points(p, p.test_per_class, "ring-test")
    pool = np.concatenate([np.full(len(y_train), POOL_TRAIN, np.uint8), np.full(len(y_test), POOL_TEST, np.uint8)])
    extra = {"generator": {"scheme": "ring", **p.__dict__}}
    return Dataset(spec=spec, x=np.concatenate([x_train, x_test]), y=np.concatenate([y_train, y_test]),
                   num_classes=p.classes, pool=pool, extra=extra)
