"""`pflx train` / `pflx predict` end to end with FedFomo; resume; refusals (one line, exit 2); tune."""

import pytest

from pfl_cli.cli.app import main as _main
from pflx_testing import cli_args, small_config


def main(argv):
    argv = [str(a) for a in argv]
    return _main(cli_args(argv) if argv[:1] == ["train"] else argv)


FAST = ["--rounds", "12", "--eval-every", "6", "--local-steps", "5", "--clients-per-round", "8", "--lr", "0.05",
        "--set", "mlp_hidden=[16]", "--set", "new_client_epochs=3"]


def test_train_then_predict_train_and_new_clients(train_predicts):
    metrics, payload, preds = train_predicts("fedfomo", FAST, run=main)
    assert metrics["train"]["mean_accuracy"] > 0.6
    d = sum(v.numel() for k, v in payload["weights"]["private"]["values"].items()) // 20  # 20 clients' rows
    assert metrics["floats_per_client_round"] == 6 * d + 5  # M = 5 models down, the model and 5 weights up
    comm = metrics["communication"]
    assert comm["floats_down_per_client_round"] + comm["floats_up_per_client_round"] == 6 * d + 5
    assert set(payload["weights"]) == {"private", "affinity"}
    assert float(payload["weights"]["affinity"].sum()) > 0  # P moved and travels with the model
    assert preds["train"]["personalized"] is True and preds["train"]["optimizer_steps"] == 0
    assert preds["holdout"]["protocol"] == "train clients' mean model trained 3 epochs"
    assert preds["holdout"]["optimizer_steps"] > 0
    for clients, m in preds.items():
        assert m["mean_accuracy"] > 0.5, (clients, m["mean_accuracy"])  # chance: 0.1


def test_resumed_run_writes_the_same_model(resume_matches):
    resume_matches(small_config(algorithm="fedfomo", rounds=4, eval_every=2, local_steps=2, lr=0.05, mlp_hidden=(16,),
                                clients_per_round=6), at=2)


@pytest.mark.parametrize("extra,message", [
    (("--set", "fomo_models=0"), "fomo_models must be an integer >= 1 for fedfomo; got 0"),
    (("--set", "fomo_epsilon=2"), "fomo_epsilon must be a probability in [0, 1] for fedfomo"),
    (("--set", "val_fraction=0"), "val_fraction must be > 0 for fedfomo"),
    (("--set", "alpha=0.1"), "unknown --set key 'alpha' for algorithm 'fedfomo'"),
    (("--dp", "eps=4,clip=1,population=1000"), "--dp is not supported by algorithm 'fedfomo': it declares no DP variant"),
])
def test_bad_input_is_one_line_and_exit_2(train_refused, extra, message):
    train_refused([*FAST[:8], "--algorithm", "fedfomo", *extra], message, run=_main)


def test_tune_searches_the_papers_space(digits_root, tmp_path):
    import yaml

    out = tmp_path / "study"
    assert _main(["tune", "--partition", str(digits_root / "part"), "--algorithm", "fedfomo", "--trials", "2",
                  "--rounds", "2", "--out", str(out), "--format", "quiet"]) == 0
    best = yaml.safe_load((out / "best.yaml").read_text())
    assert best["algorithm"] == "fedfomo" and best["fomo_models"] in {1, 2, 5, 10}
    assert 0 <= best["fomo_epsilon"] <= 0.5 and 1e-3 <= best["lr"] <= 1
