"""`pflx train` / `pflx predict` end to end with APPLE; resume; refusals (one line, exit 2); tune."""

import pytest

from pfl_cli.cli.app import main as _main
from pflx_testing import cli_args, small_config


def main(argv):
    argv = [str(a) for a in argv]
    return _main(cli_args(argv) if argv[:1] == ["train"] else argv)


FAST = ["--rounds", "10", "--eval-every", "5", "--local-steps", "5", "--lr", "0.1",
        "--set", "mlp_hidden=[16]", "--set", "new_client_epochs=3", "--set", "apple_dr_lr=0.01"]


def test_train_then_predict_train_and_new_clients(train_predicts):
    metrics, payload, preds = train_predicts("apple", FAST, run=main)
    assert metrics["train"]["mean_accuracy"] > 0.6
    values = payload["weights"]["private"]["values"]
    d = sum(v[0].numel() for k, v in values.items() if k.startswith("core."))
    assert metrics["floats_per_client_round"] == 16 * d  # 15 other core models down, its own up
    comm = metrics["communication"]
    assert comm["floats_down_per_client_round"] + comm["floats_up_per_client_round"] == 16 * d
    assert values["p"].shape == (20, 16)  # a DR vector over the 16 train clients for every client row
    assert preds["train"]["personalized"] is True and preds["train"]["optimizer_steps"] == 0
    assert preds["holdout"]["protocol"] == "p0 mixture of the core models trained 3 epochs"
    assert preds["holdout"]["optimizer_steps"] > 0
    for clients, m in preds.items():
        assert m["mean_accuracy"] > 0.5, (clients, m["mean_accuracy"])  # chance: 0.1


def test_resumed_run_writes_the_same_model(resume_matches):
    resume_matches(small_config(algorithm="apple", rounds=4, eval_every=2, local_steps=2, lr=0.05, mlp_hidden=(16,),
                                clients_per_round=6), at=2)


@pytest.mark.parametrize("extra,message", [
    (("--set", "apple_dr_lr=0"), "apple_dr_lr must be a finite number > 0 for apple; got 0"),
    (("--set", "apple_reg_rounds=2"), "apple_reg_rounds must be a fraction in (0, 1] for apple; got 2"),
    (("--set", "apple_schedule=linear"), "apple_schedule"),
    (("--set", "fomo_models=3"), "unknown --set key 'fomo_models' for algorithm 'apple' (a key of fedfomo)"),
    (("--dp", "eps=4,clip=1,population=1000"), "--dp is not supported by algorithm 'apple': it declares no DP variant"),
])
def test_bad_input_is_one_line_and_exit_2(train_refused, extra, message):
    train_refused([*FAST[:6], "--algorithm", "apple", *extra], message, run=_main)


def test_tune_searches_the_papers_space(digits_root, tmp_path):
    """10 rounds: at 2, L = int(0.1 x 2) = 0 and mu, which the space searches, would be refused as inert."""
    import yaml

    out = tmp_path / "study"
    assert _main(["tune", "--partition", str(digits_root / "part"), "--algorithm", "apple", "--trials", "2",
                  "--rounds", "10", "--set", "local_steps=2", "--out", str(out), "--format", "quiet"]) == 0
    best = yaml.safe_load((out / "best.yaml").read_text())
    assert best["algorithm"] == "apple" and best["apple_mu"] in {0, 0.01, 0.1, 1}
    assert 1e-4 <= best["apple_dr_lr"] <= 1e-1 and 1e-3 <= best["lr"] <= 1
