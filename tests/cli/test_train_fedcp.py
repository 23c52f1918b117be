"""`pflx train` / `pflx predict` / `pflx algorithms` end to end with FedCP (issue 35)."""

import pytest

from pfl_cli import registry
from pflx_testing import small_config

FAST = ["--rounds", "12", "--eval-every", "6", "--local-steps", "3", "--lr", "0.05", "--clients-per-round", "16",
        "--set", "mlp_hidden=[16]", "--set", "new_client_epochs=5"]


def test_train_then_predict_train_and_new_clients(train_predicts):
    metrics, payload, preds = train_predicts("fedcp", FAST)
    assert metrics["train"]["mean_accuracy"] > 0.5
    comm = metrics["communication"]
    per_round = registry.get("fedcp").algorithm.floats_per_client_round(payload["arch"])
    assert comm["floats_down_per_client_round"] + comm["floats_up_per_client_round"] == pytest.approx(per_round)
    # f (64x16 + 16), the head (16x10 + 10) and the CPN (Linear(16, 32) + LayerNorm(32)), each way
    assert per_round == 2 * (64 * 16 + 16 + 16 * 10 + 10 + 16 * 32 + 32 + 2 * 32)
    assert "private" in payload["weights"]
    for clients, m in preds.items():
        assert m["personalized"] and (m["optimizer_steps"] == 0) == (clients == "train")
        assert m["mean_accuracy"] > 0.4, (clients, m["mean_accuracy"])  # chance: 0.1


def test_resumed_run_writes_the_same_model(resume_matches):
    resume_matches(small_config(algorithm="fedcp", rounds=8, eval_every=4, local_steps=2, lr=0.05, mlp_hidden=(16,),
                                new_client_epochs=1), at=4)


@pytest.mark.parametrize("extra,message", [
    (("--set", "fedcp_lambda=-1"), "fedcp_lambda must be a finite number >= 0 for fedcp"),
    (("--set", "fedcp_tau=0"), "fedcp_tau must be a finite number > 0 for fedcp"),
    (("--set", "new_client_epochs=-1"), "new_client_epochs must be an integer >= 0"),
    (("--set", "gpfl_lambda=1"), "unknown --set key 'gpfl_lambda' for algorithm 'fedcp'"),
    (("--set", "fedcp_lamda=1"), "did you mean 'fedcp_lambda'"),
    (("--set", "mlp_hidden=[]"), "splits the client net into a body and a head"),
    (("--dp", "eps=1"), "--dp is not supported by algorithm 'fedcp'"),
])
def test_bad_input_is_one_line_and_exit_2(train_refused, extra, message):
    train_refused(["--algorithm", "fedcp", "--rounds", "2", *extra], message)


def test_algorithms_lists_it_with_its_keys_and_sources(listed_with_sources):
    listed_with_sources("fedcp", ("fedcp_lambda", "fedcp_tau"))
