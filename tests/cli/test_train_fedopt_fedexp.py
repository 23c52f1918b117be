"""`pflx train` / `pflx predict` end to end with FedOpt and FedExP on the digits partition."""

import pytest

from pfl_cli.cli.app import main as _main
from pflx_testing import cli_args, small_config


def main(argv):
    """pflx; a train command gets the shared small settings only where its algorithm takes them."""
    argv = [str(a) for a in argv]
    return _main(cli_args(argv) if argv[:1] == ["train"] else argv)


FAST = ["--rounds", "12", "--eval-every", "6", "--local-steps", "3", "--lr", "0.05", "--clients-per-round", "16",
        "--set", "mlp_hidden=[16]"]
EXTRA = {"fedopt": ["--set", "local_epochs=null", "--server-lr", "0.03", "--set", "server_optimizer=yogi"],
         "fedexp": []}


@pytest.mark.parametrize("name", ["fedopt", "fedexp"])
def test_train_then_predict_train_and_new_clients(train_predicts, name):
    metrics, payload, preds = train_predicts(name, [*FAST, *EXTRA[name]], run=main)
    assert metrics["train"]["mean_accuracy"] > 0.5
    assert set(payload["weights"]) == {"client"}  # one global model
    for clients, m in preds.items():
        assert not m["personalized"] and m["optimizer_steps"] == 0
        assert m["mean_accuracy"] > 0.4, (name, clients, m["mean_accuracy"])  # chance: 0.1


@pytest.mark.parametrize("name,extra", [("fedopt", {"server_optimizer": "adam", "server_lr": 0.03}),
                                        ("fedexp", {})])
def test_resumed_run_writes_the_same_model(resume_matches, name, extra):
    resume_matches(small_config(algorithm=name, rounds=8, eval_every=4, local_steps=2, local_epochs=None, lr=0.05,
                                mlp_hidden=(16,), **extra), at=4)


# FedOpt's rounds count epochs by default (local_epochs 1), and FAST's --local-steps beside them is refused as
# ignored: its cases count steps, as EXTRA's run does, so that each refusal is the one named
STEPS = ("--set", "local_epochs=null")


@pytest.mark.parametrize("extra,message", [
    (("--algorithm", "fedopt", *STEPS, "--set", "server_optimizer=yogii"),
     "server_optimizer must be one of adam, yogi, adagrad; got 'yogii' (did you mean 'yogi'?)"),
    (("--algorithm", "fedopt", *STEPS, "--set", "tau=-1"), "tau must be a finite number > 0 for fedopt; got -1"),
    (("--algorithm", "fedexp", "--set", "eps=0"), "eps must be a finite number > 0 for fedexp; got 0"),
    (("--algorithm", "fedexp", "--server-lr", "2"), "unknown flag key 'server_lr' for algorithm 'fedexp'"),
    (("--algorithm", "fedopt", *STEPS, "--dp", "eps=4,delta=1e-6,clip=0.5,population=1000"),
     "--dp is not supported by algorithm 'fedopt'"),
    (("--algorithm", "fedexp", "--dp", "eps=4,delta=1e-6,clip=0.5,population=1000"),
     "--dp is not supported by algorithm 'fedexp'"),
])
def test_bad_input_is_one_line_and_exit_2(train_refused, extra, message):
    train_refused([*FAST, *extra], message, run=lambda argv: _main([str(a) for a in argv]))  # every flag as given


@pytest.mark.parametrize("name,own", [("fedopt", ("server_optimizer", "server_lr", "beta1", "beta2", "tau")),
                                      ("fedexp", ("eps", "average_last_two"))])
def test_listed_with_the_papers_and_no_dp(listed_with_sources, name, own):
    row = listed_with_sources(name, own)
    assert "ICLR" in row["paper"]


@pytest.mark.parametrize("name", ["fedopt", "fedexp"])
def test_tune_searches_the_papers_space_and_best_yaml_trains(cli, digits_root, tmp_path, name):
    import yaml

    from pfl_cli.registry import get

    small = ["--rounds", "2", "--eval-every", "1", "--local-steps", "3", "--clients-per-round", "4",
             "--set", "mlp_hidden=[16]", "--set", "local_epochs=null"][:None if name == "fedopt" else -2]
    out = tmp_path / "study"
    r = cli("tune", "--partition", digits_root / "part", "--algorithm", name, "--trials", "2", *small,
            "--format", "quiet", "--out", out)
    assert r.code == 0, r.err
    best = yaml.safe_load((out / "best.yaml").read_text())
    assert best["algorithm"] == name and set(get(name).algorithm.search_space) <= set(best)
    r = cli("train", "--partition", digits_root / "part", "--config", out / "best.yaml", "--format", "quiet",
            "--out", tmp_path / "run")
    assert r.code == 0, r.err
