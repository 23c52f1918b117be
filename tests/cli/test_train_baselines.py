"""`pflx train` / `pflx predict` end to end with the personalized baselines."""

import pytest

from pfl_cli.cli.app import main as _main
from pflx_testing import cli_args, small_config


def main(argv):
    """pflx; a train command gets the shared small settings only where its algorithm takes them."""
    argv = [str(a) for a in argv]
    return _main(cli_args(argv) if argv[:1] == ["train"] else argv)


NEW = ("fedprox", "fedper", "fedrep", "lg-fedavg", "ditto", "apfl", "perfedavg", "pfedme", "knnper")
EXTRA = {"perfedavg": ["--set", "beta=0.3", "--finetune-steps", "3"]}
PRIVATE = ("fedper", "fedrep", "lg-fedavg", "ditto", "apfl", "pfedme")
FAST = ["--rounds", "12", "--eval-every", "6", "--local-steps", "3", "--lr", "0.05", "--clients-per-round", "16",
        "--set", "mlp_hidden=[16]", "--set", "new_client_epochs=2", "--set", "head_epochs=1"]


@pytest.mark.parametrize("name", NEW)
def test_train_then_predict_train_and_new_clients(train_predicts, name):
    metrics, payload, preds = train_predicts(name, [*FAST, *EXTRA.get(name, [])], run=main)
    assert metrics["train"]["mean_accuracy"] > 0.5
    private = name in PRIVATE
    assert ("private" in payload["weights"]) == private
    if private:  # a cohort of all 16 train clients: every one has its state
        assert int(payload["weights"]["private"]["has"].sum()) == 16
    for clients, m in preds.items():
        assert m["personalized"] == (name != "fedprox")
        if clients == "train" and private:
            assert m["optimizer_steps"] == 0  # served from the private state, no training
        if clients == "holdout":  # the new-client protocol trains, except fedprox (global) and knnper (kNN)
            assert (m["optimizer_steps"] > 0) == (name not in ("fedprox", "knnper"))
        assert m["mean_accuracy"] > 0.4, (name, clients, m["mean_accuracy"])  # chance: 0.1


@pytest.mark.parametrize("name", NEW)
def test_resumed_run_writes_the_same_model(resume_matches, name):
    resume_matches(small_config(algorithm=name, rounds=8, eval_every=4, local_steps=2, lr=0.05, mlp_hidden=(16,),
                                new_client_epochs=1, head_epochs=1), at=4)


@pytest.mark.parametrize("extra,message", [
    (("--algorithm", "fedrepp"), "algorithm must be one of pefll, fedavg, local, "),
    (("--algorithm", "fedprox", "--set", "mu=-1"), "mu must be a finite number >= 0; got -1"),
    (("--algorithm", "ditto", "--set", "lam=-0.5"), "lam must be a finite number >= 0; got -0.5"),
    (("--algorithm", "fedrep", "--set", "mlp_hidden=[]"), "splits the client net into a body and a head"),
    (("--algorithm", "lg-fedavg", "--set", "mlp_hidden=[]"), "has no body"),
    (("--algorithm", "perfedavg", "--set", "variant=xx"), "variant must be one of fo, hf; got 'xx'"),
    (("--algorithm", "pfedme", "--set", "lam=-15"), "lam must be a finite number >= 0"),
])
def test_bad_input_is_one_line_and_exit_2(train_refused, extra, message):
    train_refused([*FAST, *extra], message, run=main)
