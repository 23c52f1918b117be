"""`pflx train` / `pflx predict` end to end with IFCA, q-FFL, CFL and AFL; refusals (one line, exit 2)."""

import pytest

from pfl_cli.cli.app import main as _main
from pflx_testing import cli_args


def main(argv):
    argv = [str(a) for a in argv]
    return _main(cli_args(argv) if argv[:1] == ["train"] else argv)


FAST = ["--rounds", "4", "--eval-every", "4", "--local-steps", "3", "--clients-per-round", "8",
        "--lr", "0.05", "--set", "mlp_hidden=[16]"]


def test_ifca_trains_and_predicts_with_the_lowest_loss_cluster(train_predicts, listed_with_sources):
    metrics, payload, preds = train_predicts("ifca", [*FAST, "--set", "num_clusters=3"], run=main)
    clusters = payload["weights"]["clusters"]
    d = sum(v[0].numel() for v in clusters.values())
    assert all(v.shape[0] == 3 for v in clusters.values())  # k cluster models in model.pt
    assert metrics["floats_per_client_round"] == 4 * d + 1  # 3 models down; a model and its cluster up
    assert metrics["communication"]["floats_up_per_client_round"] == d + 1
    assert metrics["train"]["mean_accuracy"] > 0.4  # chance: 0.1
    for group in ("train", "holdout"):
        p = preds[group]
        assert p["personalized"] is True and p["optimizer_steps"] == 0
        assert "lowest loss on its train data" in p["protocol"]
    assert preds["train"]["mean_accuracy"] > 0.4
    listed_with_sources("ifca", ["num_clusters"])


def test_qffl_trains_and_predicts_the_global_model(train_predicts, listed_with_sources):
    metrics, payload, preds = train_predicts("qffl", [*FAST, "--set", "q=1"], run=main)
    d = sum(v.numel() for v in payload["weights"]["client"].values())
    assert metrics["floats_per_client_round"] == 2 * d + 1  # w down; Delta_k and h_k up
    assert metrics["global_model"] is True
    for group in ("train", "holdout"):
        assert preds[group]["personalized"] is False and preds[group]["protocol"] == "global model"
    assert metrics["train"]["mean_accuracy"] > 0.15
    listed_with_sources("qffl", ["q", "momentum"])


def test_cfl_splits_and_serves_train_and_new_clients(train_predicts, listed_with_sources):
    import torch

    metrics, payload, preds = train_predicts("cfl", [*FAST, "--set", "cfl_eps2=0", "--set", "cfl_warmup_rounds=1"],
                                             run=main)
    w = payload["weights"]
    assert int(w["used"]) >= 3 and int(w["leaf"].sum()) >= 2  # at least one split under eps2 = 0
    assert w["models"]["fc1.weight"].shape[0] == 2 * 16 - 1  # the tree's capacity: 16 train clients
    for group in ("train", "holdout"):
        assert preds[group]["personalized"] is True and preds[group]["optimizer_steps"] == 0
    assert "lowest loss on its train data" in preds["holdout"]["protocol"]
    assert bool(torch.isfinite(torch.tensor(metrics["train"]["mean_accuracy"])))
    listed_with_sources("cfl", ["cfl_eps1", "cfl_eps2", "cfl_warmup_rounds"])


def test_afl_trains_lambda_on_the_simplex(train_predicts, listed_with_sources):
    metrics, payload, preds = train_predicts("afl", [*FAST, "--set", "afl_lambda_lr=0.01"], run=main)
    lam = payload["weights"]["lambda"]
    assert abs(float(lam.sum()) - 1.0) < 1e-9 and float(lam.min()) >= 0 and float(lam.std()) > 0
    assert preds["holdout"]["personalized"] is False and preds["holdout"]["protocol"] == "global model"
    assert metrics["floats_per_client_round"] == 2 * sum(v.numel() for v in payload["weights"]["client"].values()) + 1
    listed_with_sources("afl", ["afl_lambda_lr"])


def test_fedem_serves_mixtures_to_train_and_new_clients(train_predicts, listed_with_sources):
    metrics, payload, preds = train_predicts("fedem", [*FAST[:6], "--clients-per-round", "16", *FAST[8:],
                                                        "--set", "num_components=2"], run=main)
    w = payload["weights"]
    d = sum(v.numel() for k, v in w["components"].items() if k.startswith("components.0."))
    assert metrics["floats_per_client_round"] == 2 * 2 * d  # M components down and up
    pi = w["private"]["values"]["pi"][w["private"]["has"]]
    assert pi.shape[1] == 2 and float((pi.sum(1) - 1).abs().max()) < 1e-5
    assert preds["train"]["protocol"] == "the mixture with its own weights"  # every train client trained
    assert "E-steps, components frozen" in preds["holdout"]["protocol"] and preds["holdout"]["optimizer_steps"] == 0
    listed_with_sources("fedem", ["num_components", "new_client_em_steps"])


@pytest.mark.parametrize("extra,message", [
    (("--algorithm", "fedem", "--set", "num_components=0"), "num_components must be an integer >= 1 for fedem; got 0"),
    (("--algorithm", "cfl", "--set", "cfl_eps1=-1"), "cfl_eps1 must be a finite number >= 0 for cfl; got -1"),
    (("--algorithm", "afl", "--set", "afl_lambda_lr=-0.1"), "afl_lambda_lr must be a finite number >= 0 for afl"),
    (("--algorithm", "afl", "--set", "server_momentum=0.5"), "server_momentum has no effect on algorithm 'afl'"),
    (("--algorithm", "ifca", "--set", "num_clusters=0"), "num_clusters must be an integer >= 1 for ifca; got 0"),
    (("--algorithm", "qffl", "--set", "q=-0.5"), "q must be a finite number >= 0 for qffl; got -0.5"),
    (("--algorithm", "qffl", "--set", "q=nan"), "q must be a finite number"),
    (("--algorithm", "ifca", "--server-lr", "0.5"), "server_lr has no effect on algorithm 'ifca'"),
    (("--algorithm", "ifca", "--dp", "eps=4,clip=1,population=1000"),
     "--dp is not supported by algorithm 'ifca': it declares no DP variant"),
    (("--algorithm", "qffl", "--dp", "eps=4,clip=1,population=1000"),
     "--dp is not supported by algorithm 'qffl': it declares no DP variant"),
])
def test_bad_input_is_one_line_and_exit_2(train_refused, extra, message):
    train_refused([*FAST, *extra], message, run=_main)
