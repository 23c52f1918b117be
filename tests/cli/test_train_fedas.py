"""`pflx train` / `pflx predict` / `pflx algorithms` end to end with FedAS (issue 35)."""

import pytest

from pfl_cli import registry
from pflx_testing import small_config

FAST = ["--rounds", "12", "--eval-every", "6", "--local-steps", "3", "--lr", "0.05", "--clients-per-round", "16",
        "--set", "mlp_hidden=[16]", "--set", "new_client_epochs=5"]


def test_train_then_predict_train_and_new_clients(train_predicts):
    metrics, payload, preds = train_predicts("fedas", FAST)
    assert metrics["train"]["mean_accuracy"] > 0.5
    comm = metrics["communication"]
    per_round = registry.get("fedas").algorithm.floats_per_client_round(payload["arch"])
    assert comm["floats_down_per_client_round"] + comm["floats_up_per_client_round"] == pytest.approx(per_round)
    # the body (64x16 + 16) each way and the Fisher trace up
    assert per_round == 2 * (64 * 16 + 16) + 1
    assert "private" in payload["weights"]
    for clients, m in preds.items():
        assert m["personalized"] and (m["optimizer_steps"] == 0) == (clients == "train")
        assert m["mean_accuracy"] > 0.4, (clients, m["mean_accuracy"])  # chance: 0.1


def test_resumed_run_writes_the_same_model(resume_matches):
    resume_matches(small_config(algorithm="fedas", rounds=8, eval_every=4, local_steps=2, lr=0.05, mlp_hidden=(16,),
                                new_client_epochs=1), at=4)


@pytest.mark.parametrize("extra,message", [
    (("--set", "fedas_align_lr=0"), "fedas_align_lr must be a finite number > 0 for fedas"),
    (("--set", "fedas_align_epochs=-1"), "fedas_align_epochs must be an integer >= 0 for fedas"),
    (("--set", "fedas_align_batch=0"), "fedas_align_batch must be an integer >= 1 for fedas"),
    (("--set", "new_client_epochs=-1"), "new_client_epochs must be an integer >= 0"),
    (("--set", "fedcp_lambda=1"), "unknown --set key 'fedcp_lambda' for algorithm 'fedas'"),
    (("--set", "fedas_align_rate=1"), "did you mean 'fedas_align_lr'"),
    (("--set", "mlp_hidden=[]"), "splits the client net into a body and a head"),
    (("--dp", "eps=1"), "--dp is not supported by algorithm 'fedas'"),
])
def test_bad_input_is_one_line_and_exit_2(train_refused, extra, message):
    train_refused(["--algorithm", "fedas", "--rounds", "2", *extra], message)


def test_algorithms_lists_it_with_its_keys_and_sources(listed_with_sources):
    listed_with_sources("fedas", ("fedas_align_lr", "fedas_align_epochs", "fedas_align_batch"))
