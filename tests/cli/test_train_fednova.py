"""`pflx train` / `pflx predict` end to end with FedNova; resume; refusals (one line, exit 2); its tune space."""

import pytest

from pfl_cli.cli.app import main as _main
from pflx_testing import cli_args, small_config


def main(argv):
    argv = [str(a) for a in argv]
    return _main(cli_args(argv) if argv[:1] == ["train"] else argv)


FAST = ["--rounds", "12", "--eval-every", "6", "--local-epochs", "1", "--clients-per-round", "8",
        "--lr", "0.1", "--set", "batch_size=8", "--set", "mlp_hidden=[16]"]  # batch 8: unequal step counts


def test_train_then_predict_train_and_new_clients(train_predicts):
    metrics, payload, preds = train_predicts("fednova", FAST, run=main)
    assert metrics["train"]["mean_accuracy"] > 0.5
    assert metrics["floats_per_client_round"] == 2 * sum(v.numel() for v in payload["weights"]["client"].values()) + 1
    assert set(payload["weights"]) == {"client"}  # one global model
    for clients, m in preds.items():
        assert m["personalized"] is False and m["optimizer_steps"] == 0
        assert m["mean_accuracy"] > 0.4, (clients, m["mean_accuracy"])  # chance: 0.1


def test_resumed_run_writes_the_same_model(resume_matches):
    resume_matches(small_config(algorithm="fednova", rounds=4, eval_every=2, local_epochs=1, lr=0.05,
                                mlp_hidden=(16,), clients_per_round=6), at=2)


def test_resumed_run_with_random_epochs_writes_the_same_model(resume_matches):
    """local_epochs_range: each round's E_i come from the round's generator, so a resumed run draws them again."""
    resume_matches(small_config(algorithm="fednova", rounds=4, eval_every=2, local_epochs_range=(1, 3), lr=0.05,
                                mlp_hidden=(16,), clients_per_round=6), at=2)


@pytest.mark.parametrize("extra,message", [
    (("--set", "local_epochs=0"), "local_epochs must be"),
    (("--set", "local_epochs_range=[3,2]"), "local_epochs_range must be two integers [lo, hi] with 1 <= lo <= hi "
                                            "for fednova; got [3, 2]. Use e.g. [2, 5]"),
    (("--set", "local_epochs_range=[2,5]", "--set", "local_epochs=1"),
     "local_epochs has no effect beside local_epochs_range"),
    (("--set", "alpha=0.1"), "unknown --set key 'alpha' for algorithm 'fednova' (a key of apfl, feddyn, fedasync)"),
    (("--dp", "eps=4,clip=1,population=1000"), "--dp is not supported by algorithm 'fednova': it declares no DP"),
])
def test_bad_input_is_one_line_and_exit_2(train_refused, extra, message):
    train_refused(["--rounds", "2", "--algorithm", "fednova", *extra], message, run=_main)


def test_tune_searches_the_papers_space(digits_root, tmp_path):
    import yaml

    out = tmp_path / "study"
    assert _main(["tune", "--partition", str(digits_root / "part"), "--algorithm", "fednova", "--trials", "2",
                  "--rounds", "2", "--out", str(out), "--format", "quiet"]) == 0
    best = yaml.safe_load((out / "best.yaml").read_text())
    assert best["algorithm"] == "fednova" and best["momentum"] in {0.0, 0.9} and 1e-3 <= best["lr"] <= 1
