"""`pflx train` / `pflx predict` end to end with FedAMP; resume; refusals (one line, exit 2); tune's space."""

import pytest

from pfl_cli.cli.app import main as _main
from pflx_testing import cli_args, small_config


def main(argv):
    argv = [str(a) for a in argv]
    return _main(cli_args(argv) if argv[:1] == ["train"] else argv)


FAST = ["--rounds", "12", "--eval-every", "6", "--local-steps", "3", "--clients-per-round", "16",
        "--lr", "0.05", "--set", "mlp_hidden=[16]", "--set", "new_client_epochs=2"]


def test_train_then_predict_train_and_new_clients(train_predicts, listed_with_sources):
    metrics, payload, preds = train_predicts("fedamp", FAST, run=main)
    assert metrics["train"]["mean_accuracy"] > 0.6
    assert metrics["floats_per_client_round"] == 2 * sum(v.numel() for v in payload["weights"]["client"].values())
    assert set(payload["weights"]) == {"client", "private"}  # the mean model and every personalized model
    assert int(payload["weights"]["private"]["has"].sum()) == 16
    train, new = preds["train"], preds["holdout"]
    assert train["personalized"] is True and train["optimizer_steps"] == 0
    assert new["personalized"] is True and new["optimizer_steps"] > 0
    assert "mean personalized model trained 2 epochs" in new["protocol"]
    assert train["mean_accuracy"] > 0.6 and new["mean_accuracy"] > 0.4  # chance: 0.1
    listed_with_sources("fedamp", ["alpha_k", "sigma", "lam"])


def test_resumed_run_writes_the_same_model(resume_matches):
    resume_matches(small_config("fedamp", rounds=4, eval_every=2, local_steps=2, lr=0.05, mlp_hidden=(16,),
                                clients_per_round=6, new_client_epochs=1), at=2)


@pytest.mark.parametrize("extra,message", [
    (("--set", "alpha_k=0"), "alpha_k must be a finite number > 0 for fedamp; got 0"),
    (("--set", "sigma=-1"), "sigma must be a finite number > 0 for fedamp; got -1"),
    (("--set", "server_momentum=0.9"), "server_momentum has no effect on algorithm 'fedamp'"),
    (("--set", "tau=1"), "unknown --set key 'tau' for algorithm 'fedamp'"),
    (("--dp", "eps=4,clip=1,population=1000"),
     "--dp is not supported by algorithm 'fedamp': it declares no DP variant"),
])
def test_bad_input_is_one_line_and_exit_2(train_refused, extra, message):
    train_refused([*FAST[:-4], "--algorithm", "fedamp", *extra], message, run=_main)


def test_tune_searches_the_papers_space(digits_root, tmp_path):
    import yaml

    out = tmp_path / "study"
    assert _main(["tune", "--partition", str(digits_root / "part"), "--algorithm", "fedamp", "--trials", "2",
                  "--rounds", "2", "--set", "new_client_epochs=1", "--out", str(out), "--format", "quiet"]) == 0
    best = yaml.safe_load((out / "best.yaml").read_text())
    assert best["algorithm"] == "fedamp" and 0.01 <= best["lam"] <= 10 and 10 <= best["sigma"] <= 1000
