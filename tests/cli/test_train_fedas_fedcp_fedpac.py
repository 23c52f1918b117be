"""`pflx train` / `pflx predict` / `pflx algorithms` end to end with FedAS, FedCP and FedPAC (issue 35)."""

import pytest

from pfl_cli import registry
from pflx_testing import small_config

NAMES = ("fedas", "fedcp", "fedpac")
FAST = ["--rounds", "12", "--eval-every", "6", "--local-steps", "3", "--lr", "0.05", "--clients-per-round", "16",
        "--set", "mlp_hidden=[16]", "--set", "new_client_epochs=5"]
# FedPAC trains epochs (one body epoch of batches of 16), not local steps
FAST_PAC = ["--rounds", "6", "--eval-every", "3", "--lr", "0.05", "--clients-per-round", "16", "--batch-size", "16",
            "--set", "mlp_hidden=[16]", "--set", "new_client_epochs=5", "--set", "body_epochs=1"]


def served(preds, floor):
    """Train clients are served their trained models without a step; new ones train (chance: 0.1)."""
    for clients, m in preds.items():
        assert m["personalized"] and (m["optimizer_steps"] == 0) == (clients == "train")
        assert m["mean_accuracy"] > floor, (clients, m["mean_accuracy"])


def test_fedas_trains_then_predicts_train_and_new_clients(train_predicts):
    metrics, payload, preds = train_predicts("fedas", FAST)
    assert metrics["train"]["mean_accuracy"] > 0.5
    comm = metrics["communication"]
    per_round = registry.get("fedas").algorithm.floats_per_client_round(payload["arch"])
    assert comm["floats_down_per_client_round"] + comm["floats_up_per_client_round"] == pytest.approx(per_round)
    # the body (64x16 + 16) each way and the Fisher trace up
    assert per_round == 2 * (64 * 16 + 16) + 1
    assert "private" in payload["weights"]
    served(preds, 0.4)


def test_fedcp_trains_then_predicts_train_and_new_clients(train_predicts):
    metrics, payload, preds = train_predicts("fedcp", FAST)
    assert metrics["train"]["mean_accuracy"] > 0.5
    comm = metrics["communication"]
    per_round = registry.get("fedcp").algorithm.floats_per_client_round(payload["arch"])
    assert comm["floats_down_per_client_round"] + comm["floats_up_per_client_round"] == pytest.approx(per_round)
    # f (64x16 + 16), the head (16x10 + 10) and the CPN (Linear(16, 32) + LayerNorm(32)), each way
    assert per_round == 2 * (64 * 16 + 16 + 16 * 10 + 10 + 16 * 32 + 32 + 2 * 32)
    assert "private" in payload["weights"]
    served(preds, 0.4)


def test_fedpac_trains_then_predicts_train_and_new_clients(train_predicts):
    metrics, payload, preds = train_predicts("fedpac", FAST_PAC)
    assert metrics["train"]["mean_accuracy"] > 0.6
    comm = metrics["communication"]
    floats = comm["floats_down_per_client_round"] + comm["floats_up_per_client_round"]
    assert floats == registry.get("fedpac").algorithm.floats_per_client_round(payload["arch"])
    assert set(comm["messages"]["up"]) == {"body", "head", "prototypes", "class_counts", "statistics_h",
                                           "statistics_v"}
    assert "private" in payload["weights"] and payload["weights"]["prototypes"]["seen"].all()
    # train clients are served their combined heads; new ones train a head on the frozen body
    served(preds, 0.5)


RESUME = {  # (config keys, the round of the first checkpoint)
    "fedas": (dict(rounds=8, eval_every=4, local_steps=2, lr=0.05, mlp_hidden=(16,), new_client_epochs=1), 4),
    "fedcp": (dict(rounds=8, eval_every=4, local_steps=2, lr=0.05, mlp_hidden=(16,), new_client_epochs=1), 4),
    "fedpac": (dict(rounds=6, eval_every=3, lr=0.05, batch_size=16, mlp_hidden=(16,), body_epochs=1,
                    new_client_epochs=1), 3),
}


@pytest.mark.parametrize("name", NAMES)
def test_resumed_run_writes_the_same_model(resume_matches, name):
    values, at = RESUME[name]
    resume_matches(small_config(name, **values), at=at)


OWN_BAD = [
    ("fedas", ("--set", "fedas_align_lr=0"), "fedas_align_lr must be a finite number > 0 for fedas"),
    ("fedas", ("--set", "fedas_align_epochs=-1"), "fedas_align_epochs must be an integer >= 0 for fedas"),
    ("fedas", ("--set", "fedas_align_batch=0"), "fedas_align_batch must be an integer >= 1 for fedas"),
    ("fedas", ("--set", "fedcp_lambda=1"), "unknown --set key 'fedcp_lambda' for algorithm 'fedas'"),
    ("fedas", ("--set", "fedas_align_rate=1"), "did you mean 'fedas_align_lr'"),
    ("fedcp", ("--set", "fedcp_lambda=-1"), "fedcp_lambda must be a finite number >= 0 for fedcp"),
    ("fedcp", ("--set", "fedcp_tau=0"), "fedcp_tau must be a finite number > 0 for fedcp"),
    ("fedcp", ("--set", "gpfl_lambda=1"), "unknown --set key 'gpfl_lambda' for algorithm 'fedcp'"),
    ("fedcp", ("--set", "fedcp_lamda=1"), "did you mean 'fedcp_lambda'"),
    ("fedpac", ("--set", "fedpac_lambda=-1"), "fedpac_lambda must be a finite number >= 0 for fedpac; got -1"),
    ("fedpac", ("--set", "head_lr=0"), "head_lr must be a finite number > 0"),
    ("fedpac", ("--set", "head_epochs=-1"), "head_epochs must be an integer >= 0"),
    ("fedpac", ("--set", "body_epochs=-1"), "body_epochs must be an integer >= 0"),
    ("fedpac", ("--set", "head_epochs=0", "--set", "body_epochs=0"), "fedpac needs local training"),
    ("fedpac", ("--set", "gpfl_lambda=1"), "unknown --set key 'gpfl_lambda' for algorithm 'fedpac' (a key of gpfl)"),
    ("fedpac", ("--set", "fedpac_lamda=1"), "did you mean 'fedpac_lambda'?"),
]
# what all three refuse alike: a negative new-client budget, a net without a body, --dp (no DP variant)
SHARED_BAD = [row for name in NAMES for row in [
    (name, ("--set", "new_client_epochs=-1"), "new_client_epochs must be an integer >= 0"),
    (name, ("--set", "mlp_hidden=[]"), "splits the client net into a body and a head"),
    (name, ("--dp", "eps=1"), f"--dp is not supported by algorithm '{name}'"),
]]


@pytest.mark.parametrize("name,extra,message", OWN_BAD + SHARED_BAD)
def test_bad_input_is_one_line_and_exit_2(train_refused, name, extra, message):
    train_refused(["--algorithm", name, "--rounds", "2", *extra], message)


OWN_KEYS = {"fedas": ("fedas_align_lr", "fedas_align_epochs", "fedas_align_batch"),
            "fedcp": ("fedcp_lambda", "fedcp_tau"),
            "fedpac": ("fedpac_lambda", "head_epochs", "body_epochs", "head_lr")}


@pytest.mark.parametrize("name", NAMES)
def test_algorithms_lists_it_with_its_keys_and_sources(listed_with_sources, name):
    row = listed_with_sources(name, OWN_KEYS[name])
    assert name != "fedpac" or "ICLR 2023" in row["paper"]
