"""`pflx train` / `pflx predict` / `pflx algorithms` end to end with FedPAC (issue 35)."""

import pytest

from pfl_cli import registry
from pflx_testing import small_config

FAST = ["--rounds", "6", "--eval-every", "3", "--lr", "0.05", "--clients-per-round", "16", "--batch-size", "16",
        "--set", "mlp_hidden=[16]", "--set", "new_client_epochs=5", "--set", "body_epochs=1"]


def test_train_then_predict_train_and_new_clients(train_predicts):
    metrics, payload, preds = train_predicts("fedpac", FAST)
    assert metrics["train"]["mean_accuracy"] > 0.6
    comm = metrics["communication"]
    floats = comm["floats_down_per_client_round"] + comm["floats_up_per_client_round"]
    assert floats == registry.get("fedpac").algorithm.floats_per_client_round(payload["arch"])
    assert set(comm["messages"]["up"]) == {"body", "head", "prototypes", "class_counts", "statistics_h",
                                           "statistics_v"}
    assert "private" in payload["weights"] and payload["weights"]["prototypes"]["seen"].all()
    for clients, m in preds.items():
        assert m["personalized"]
        # train clients are served their combined heads; new ones train a head on the frozen body
        assert (m["optimizer_steps"] == 0) == (clients == "train")
        assert m["mean_accuracy"] > 0.5, (clients, m["mean_accuracy"])  # chance: 0.1


def test_resumed_run_writes_the_same_model(resume_matches):
    resume_matches(small_config("fedpac", rounds=6, eval_every=3, lr=0.05, batch_size=16, mlp_hidden=(16,),
                                body_epochs=1, new_client_epochs=1), at=3)


@pytest.mark.parametrize("extra,message", [
    (("--set", "fedpac_lambda=-1"), "fedpac_lambda must be a finite number >= 0 for fedpac; got -1"),
    (("--set", "head_lr=0"), "head_lr must be a finite number > 0"),
    (("--set", "head_epochs=-1"), "head_epochs must be an integer >= 0"),
    (("--set", "body_epochs=-1"), "body_epochs must be an integer >= 0"),
    (("--set", "new_client_epochs=-1"), "new_client_epochs must be an integer >= 0"),
    (("--set", "head_epochs=0", "--set", "body_epochs=0"), "fedpac needs local training"),
    (("--set", "gpfl_lambda=1"), "unknown --set key 'gpfl_lambda' for algorithm 'fedpac' (a key of gpfl)"),
    (("--set", "fedpac_lamda=1"), "did you mean 'fedpac_lambda'?"),
    (("--set", "mlp_hidden=[]"), "splits the client net into a body and a head"),
    (("--dp", "eps=1"), "--dp is not supported by algorithm 'fedpac'"),
])
def test_bad_input_is_one_line_and_exit_2(train_refused, extra, message):
    train_refused(["--algorithm", "fedpac", "--rounds", "2", *extra], message)


def test_algorithms_lists_it_with_its_keys_and_sources(listed_with_sources):
    row = listed_with_sources("fedpac", ("fedpac_lambda", "head_epochs", "body_epochs", "head_lr"))
    assert "ICLR 2023" in row["paper"]
