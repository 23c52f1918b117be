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


def test_shared_init_gives_pfllib_the_model_pflx_starts_from(tmp_path):
    """``--shared-init``: the file the PFLlib driver loads holds pflx's initial model of the seed (its
    ``init-client`` draw) under the peer MLP's names, and the peer MLP then computes pflx's logits."""
    import torch

    from pfl_cli.algorithms.base import seeded
    from pfl_cli.models.client import MLP

    conformance._export(tmp_path, conformance.DEFAULT_DATASET, 20, 0)
    written = conformance._write_initial_model(tmp_path, "fedbabu", 3, 1)
    loaded = torch.load(tmp_path / conformance._initial_model_file("fedbabu", 1))
    assert sorted(loaded) == ["fc.bias", "fc.weight", "fc1.bias", "fc1.weight"]
    ours = seeded(1, "init-client", lambda: MLP(64, 10, (conformance.HIDDEN,)))
    peer = conformance._peer_mlp_class()(64, False)
    peer.load_state_dict(loaded)  # strict: every layer of the peer's MLP comes from the file
    x = torch.randn(7, 64)
    torch.testing.assert_close(peer(x), ours(x), rtol=0, atol=0)
    other = conformance._write_initial_model(tmp_path, "fedbabu", 3, 2)
    assert not torch.equal(other["fc.weight"], written["fc.weight"])  # each seed its own draw, as unshared


def test_shared_init_refuses_a_method_whose_model_is_more_than_the_mlp(tmp_path):
    conformance._export(tmp_path, conformance.DEFAULT_DATASET, 20, 0)
    with pytest.raises(ValueError, match=r"--shared-init: gpfl's pflx model is not the benchmark's MLP alone"):
        conformance._write_initial_model(tmp_path, "gpfl", 3, 0)
    assert not (tmp_path / conformance._initial_model_file("gpfl", 0)).exists()


def test_auto_init_shares_where_the_model_is_the_mlp_and_lets_the_rest_draw_their_own(tmp_path):
    """The default ``--init auto``: FedBABU starts PFLlib from pflx's draw (a file per seed), GPFL keeps
    each tool's own draw (no file); ``shared`` refuses GPFL; ``own`` writes nothing."""
    conformance._export(tmp_path, conformance.DEFAULT_DATASET, 20, 0)
    assert conformance._share_initial_models(tmp_path, ["fedbabu", "gpfl"], 3, [0, 1], "auto") == {"fedbabu"}
    # FedRoD's generic predictor is the MLP inside its two-head wrapper: it shares, under the MLP's names
    assert conformance._share_initial_models(tmp_path, ["fedrod"], 3, [0], "auto") == {"fedrod"}
    assert sorted(__import__("torch").load(tmp_path / conformance._initial_model_file("fedrod", 0))) == [
        "fc.bias", "fc.weight", "fc1.bias", "fc1.weight"]
    for seed in (0, 1):
        assert (tmp_path / conformance._initial_model_file("fedbabu", seed)).is_file()
        assert not (tmp_path / conformance._initial_model_file("gpfl", seed)).exists()
    with pytest.raises(ValueError, match="gpfl's pflx model is not the benchmark's MLP alone"):
        conformance._share_initial_models(tmp_path, ["fedbabu", "gpfl"], 3, [0, 1], "shared")
    assert conformance._share_initial_models(tmp_path / "x", ["fedbabu"], 3, [0, 1], "own") == set()
    assert conformance._init_words("auto", {"fedbabu"}, ["fedbabu", "gpfl"]) == (
        "shared (pflx draws it); each tool its own draw for gpfl (more than the MLP)")
