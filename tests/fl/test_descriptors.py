"""Descriptor analysis (specs/pefll.md §3.4): Spearman of descriptor vs label-distribution distances."""

import numpy as np
import pytest
from scipy.stats import spearmanr

from pfl_cli.fl.descriptors import mean_spearman


def test_mean_spearman_equals_scipy_row_by_row():
    rng = np.random.default_rng(0)
    pts_a, pts_b = rng.normal(size=(9, 3)), rng.normal(size=(9, 2))
    a = np.linalg.norm(pts_a[:, None] - pts_a[None], axis=-1)
    b = np.linalg.norm(pts_b[:, None] - pts_b[None], axis=-1)
    b[2, 5] = b[2, 7]  # a tie
    queries = np.array([1, 2, 6])
    ref = np.mean([spearmanr(np.delete(a[i], i), np.delete(b[i], i)).statistic for i in queries])
    assert mean_spearman(queries, a, b) == pytest.approx(ref, abs=1e-12)
    assert mean_spearman(queries, a, a) == pytest.approx(1.0)


def test_track_descriptors_logs_the_correlation_at_every_evaluation(digits_clients):
    """A linear label embedding makes v affine in the label histogram: the correlation is high from round 0."""
    from pfl_cli.data import load_dataset
    from pfl_cli.fl import train_federated
    from pflx_testing import small_config
    from pfl_cli.partition import PartitionConfig, partition_labels
    from pfl_cli.rng import make_rng

    ds = load_dataset("builtin:digits")
    part = partition_labels(ds.y, PartitionConfig(scheme="dirichlet", alpha=0.3, num_clients=30, holdout_clients=8, test_fraction=0.2),
                            num_classes=10, rng=make_rng(0, "partition"))
    cfg = small_config(algorithm="pefll", embedding="linear", rounds=4, eval_every=2, local_steps=2, batch_size=8,
                      mlp_hidden=(8,), hyper_hidden=16, embed_dim=8, track_descriptors=True)
    run = train_federated(ds.x, ds.y, ds.num_classes, part, cfg, device="cpu")
    rows = [r for r in run.outcome.history if r[2] == "descriptor_spearman"]
    assert [(r[0], r[1]) for r in rows] == [(2, "holdout"), (4, "holdout")]
    assert all(r[3] > 0.6 for r in rows), rows
    image_only = train_federated(ds.x, ds.y, ds.num_classes, part,
                                 small_config(**{**cfg.__dict__, "embedding": "mlp-x"}), device="cpu")
    rho = [r[3] for r in image_only.outcome.history if r[2] == "descriptor_spearman"]
    assert len(rho) == 2 and all(-1 <= r <= 1 for r in rho)
    off = train_federated(ds.x, ds.y, ds.num_classes, part, small_config(**{**cfg.__dict__, "track_descriptors": False}),
                          device="cpu")
    assert not [r for r in off.outcome.history if r[2] == "descriptor_spearman"]
