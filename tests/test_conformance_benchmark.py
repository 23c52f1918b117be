"""benchmarks/conformance.py's pflx side: every run has the settings the table claims to match with PFLlib."""

import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

sys.path.insert(0, str(ROOT / "benchmarks"))
try:
    import conformance
finally:
    sys.path.pop(0)


@pytest.mark.parametrize("algorithm", sorted(conformance._algorithms(100)))
def test_every_pflx_run_trains_every_client_every_round_with_the_matched_optimizer(algorithm):
    """PFLlib runs ``-jr 1`` (every client every round); pflx once dropped the benchmark's
    ``clients_per_round=None`` with the method rows' Nones and trained its default 5 of 20 clients."""
    cfg = conformance._pflx_config(algorithm, 7, 3)
    assert cfg.planned_cohort(20) in (None, 20)
    assert (cfg.rounds, cfg.seed, cfg.eval_every, cfg.batch_size, cfg.lr) == (7, 3, 7, conformance.BATCH,
                                                                               conformance.LR)
    assert (cfg.momentum, cfg.client_clip, cfg.lambda_theta, cfg.val_fraction, cfg.normalize) == (0.0, 0.0, 0.0,
                                                                                                  0.0, False)
    assert cfg.mlp_hidden == (conformance.HIDDEN,)
    row = conformance._algorithms(7)[algorithm]["pflx"]
    for k, v in row.items():  # the method's constants, and its Nones left at the method's default
        assert getattr(cfg, k, None) == (v if v is not None else getattr(type(cfg)(), k, None)), k
    if "local_epochs" not in row:
        assert cfg.local_epochs == 1
