"""`pflx train` / `pflx predict` end to end with FedLC; resume; refusals (one line, exit 2); tune's space."""

import pytest

from pfl_cli.cli.app import main as _main
from pflx_testing import cli_args, small_config


def main(argv):
    argv = [str(a) for a in argv]
    return _main(cli_args(argv) if argv[:1] == ["train"] else argv)


FAST = ["--rounds", "30", "--eval-every", "15", "--local-steps", "3", "--clients-per-round", "16",
        "--lr", "0.05", "--set", "mlp_hidden=[16]"]


def test_train_then_predict_train_and_new_clients(train_predicts, listed_with_sources):
    metrics, payload, preds = train_predicts("fedlc", FAST, run=main)
    assert metrics["train"]["mean_accuracy"] > 0.5
    assert metrics["floats_per_client_round"] == 2 * sum(v.numel() for v in payload["weights"]["client"].values())
    assert set(payload["weights"]) == {"client"}  # the global model: the margins are recomputed from data
    for clients, m in preds.items():
        assert m["personalized"] is False and m["optimizer_steps"] == 0 and m["protocol"] == "global model"
        assert m["mean_accuracy"] > 0.4, (clients, m["mean_accuracy"])  # chance: 0.1
    listed_with_sources("fedlc", ["tau"])


def test_resumed_run_writes_the_same_model(resume_matches):
    resume_matches(small_config("fedlc", rounds=4, eval_every=2, local_steps=2, lr=0.05, mlp_hidden=(16,),
                                clients_per_round=6, tau=0.5), at=2)


@pytest.mark.parametrize("extra,message", [
    (("--set", "tau=-0.5"), "tau must be a finite number >= 0 for fedlc; got -0.5"),
    (("--set", "mu=0.1"), "unknown --set key 'mu' for algorithm 'fedlc'"),
    (("--dp", "eps=4,clip=1,population=1000"), "--dp is not supported by algorithm 'fedlc': it declares no DP variant"),
])
def test_bad_input_is_one_line_and_exit_2(train_refused, extra, message):
    train_refused([*FAST[:-2], "--algorithm", "fedlc", *extra], message, run=_main)


def test_tune_searches_the_papers_space(digits_root, tmp_path):
    import yaml

    out = tmp_path / "study"
    assert _main(["tune", "--partition", str(digits_root / "part"), "--algorithm", "fedlc", "--trials", "2",
                  "--rounds", "2", "--out", str(out), "--format", "quiet"]) == 0
    best = yaml.safe_load((out / "best.yaml").read_text())
    assert best["algorithm"] == "fedlc" and 0.01 <= best["tau"] <= 10 and 1e-3 <= best["lr"] <= 1
