"""`pflx train` / `pflx predict` end to end with SCAFFOLD and FedDyn; resume; refusals (one line, exit 2)."""

import pytest

from pfl_cli.cli.app import main as _main
from pflx_testing import cli_args, small_config


def main(argv):
    argv = [str(a) for a in argv]
    return _main(cli_args(argv) if argv[:1] == ["train"] else argv)


FAST = ["--rounds", "12", "--eval-every", "6", "--local-steps", "3", "--clients-per-round", "16",
        "--set", "mlp_hidden=[16]"]
LR = {"scaffold": "0.3", "feddyn": "0.05"}  # SCAFFOLD's plain SGD steps (no momentum) take a larger lr


@pytest.mark.parametrize("name", ["scaffold", "feddyn"])
def test_train_then_predict_train_and_new_clients(train_predicts, name):
    metrics, payload, preds = train_predicts(name, [*FAST, "--lr", LR[name]], run=main)
    assert metrics["train"]["mean_accuracy"] > 0.5
    assert metrics["floats_per_client_round"] == (4 if name == "scaffold" else 2) * sum(
        v.numel() for v in payload["weights"]["client"].values())
    assert set(payload["weights"]) == {"client"}  # model.pt serves the global model; the drift state is training's
    for clients, m in preds.items():
        assert m["personalized"] is False and m["optimizer_steps"] == 0
        assert m["mean_accuracy"] > 0.4, (name, clients, m["mean_accuracy"])  # chance: 0.1


@pytest.mark.parametrize("name", ["scaffold", "feddyn"])
def test_resumed_run_writes_the_same_model(resume_matches, name):
    resume_matches(small_config(algorithm=name, rounds=4, eval_every=2, local_steps=2, lr=0.05, mlp_hidden=(16,),
                                clients_per_round=6), at=2)


@pytest.mark.parametrize("extra,message", [
    (("--algorithm", "feddyn", "--set", "alpha=0"), "alpha must be a finite number > 0 for feddyn; got 0"),
    (("--algorithm", "feddyn", "--set", "server_momentum=0.9"), "server_momentum has no effect on algorithm 'feddyn'"),
    (("--algorithm", "scaffold", "--set", "alpha=0.1"),
     "unknown --set key 'alpha' for algorithm 'scaffold' (a key of apfl, feddyn, fedasync)"),
    (("--algorithm", "scaffold", "--set", "momentum=0.5"), "momentum has no effect on algorithm 'scaffold'"),
    (("--algorithm", "scaffold", "--clients-per-round", "17"),
     "clients_per_round must be at most the 16 train clients with labels for scaffold"),
    (("--algorithm", "feddyn", "--clients-per-round", "40"),
     "clients_per_round must be at most the 16 train clients with labels for feddyn"),
    (("--algorithm", "scaffold", "--dp", "eps=4,clip=1,population=1000"),
     "--dp is not supported by algorithm 'scaffold': it declares no DP variant"),
])
def test_bad_input_is_one_line_and_exit_2(train_refused, extra, message):
    train_refused([*FAST[:-4], *extra], message, run=_main)  # every key as given (cli_args drops what is refused)


@pytest.mark.parametrize("name,key,choices", [("scaffold", "server_lr", {0.5, 1.0, 2.0}),
                                              ("feddyn", "alpha", {0.1, 0.01, 0.001})])
def test_tune_searches_the_papers_space(digits_root, tmp_path, name, key, choices):
    import yaml

    out = tmp_path / "study"
    assert _main(["tune", "--partition", str(digits_root / "part"), "--algorithm", name, "--trials", "2",
                  "--rounds", "2", "--out", str(out), "--format", "quiet"]) == 0
    best = yaml.safe_load((out / "best.yaml").read_text())
    assert best["algorithm"] == name and best[key] in choices and 1e-3 <= best["lr"] <= 1
