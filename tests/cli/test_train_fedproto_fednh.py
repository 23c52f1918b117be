"""`pflx train` / `pflx predict` end to end with FedProto and FedNH; resume; refusals (one line, exit 2); tune."""

import pytest

from pfl_cli.cli.app import main as _main
from pflx_testing import cli_args, small_config


def main(argv):
    argv = [str(a) for a in argv]
    return _main(cli_args(argv) if argv[:1] == ["train"] else argv)


FAST = ["--rounds", "10", "--eval-every", "5", "--clients-per-round", "8", "--set", "mlp_hidden=[16]"]
OPTS = {"fedproto": ["--lr", "0.05", "--set", "new_client_epochs=3"],
        "fednh": ["--lr", "0.05", "--set", "local_epochs=2", "--set", "new_client_epochs=2"]}


@pytest.mark.parametrize("name", ["fedproto", "fednh"])
def test_train_then_predict_train_and_new_clients(train_predicts, name):
    metrics, payload, preds = train_predicts(name, [*FAST, *OPTS[name]], run=main)
    assert metrics["train"]["mean_accuracy"] > 0.6, metrics["train"]["mean_accuracy"]  # chance: 0.1 (2 classes: 0.5)
    protos = payload["weights"]["prototypes"]["prototypes"] if name == "fedproto" else \
        payload["weights"]["client"]["prototypes"]
    assert tuple(protos.shape) == (10, 16)
    d = 16 * 10
    assert metrics["floats_per_client_round"] == (2 * d + 10 if name == "fedproto" else 2 * (64 * 16 + 16 + 1 + d) + 10)
    assert "private" in payload["weights"]
    for clients, m in preds.items():
        assert m["personalized"] is True
        assert (m["optimizer_steps"] > 0) == (clients == "holdout"), (clients, m["optimizer_steps"])
        assert m["mean_accuracy"] > 0.5, (name, clients, m["mean_accuracy"])


@pytest.mark.parametrize("name", ["fedproto", "fednh"])
def test_resumed_run_writes_the_same_model(resume_matches, name):
    resume_matches(small_config(algorithm=name, rounds=4, eval_every=2, lr=0.05, mlp_hidden=(16,),
                                clients_per_round=6, local_epochs=1, new_client_epochs=1), at=2)


@pytest.mark.parametrize("extra,message", [
    (("--algorithm", "fedproto", "--set", "fedproto_lambda=-1"),
     "fedproto_lambda must be a finite number >= 0 for fedproto; got -1"),
    (("--algorithm", "fednh", "--set", "fednh_rho=1"), "fednh_rho must be a number in [0, 1) for fednh"),
    (("--algorithm", "fednh", "--set", "fedproto_lambda=0.1"),
     "unknown --set key 'fedproto_lambda' for algorithm 'fednh' (a key of fedproto)"),
    (("--algorithm", "fedproto", "--set", "local_epochs=0"), "local_epochs must be an integer >= 1"),
    (("--algorithm", "fedproto", "--dp", "eps=4,clip=1,population=1000"),
     "--dp is not supported by algorithm 'fedproto': it declares no DP variant"),
    (("--algorithm", "fednh", "--dp", "eps=4,clip=1,population=1000"),
     "--dp is not supported by algorithm 'fednh': it declares no DP variant"),
])
def test_bad_input_is_one_line_and_exit_2(train_refused, extra, message):
    train_refused([*FAST[:-2], *extra], message, run=_main)


@pytest.mark.parametrize("name,key,ok", [("fedproto", "fedproto_lambda", lambda v: 1e-3 <= v <= 10),
                                         ("fednh", "fednh_rho", lambda v: v in {0.5, 0.9, 0.99})])
def test_tune_searches_the_papers_space(digits_root, tmp_path, name, key, ok):
    import yaml

    out = tmp_path / "study"
    assert _main(["tune", "--partition", str(digits_root / "part"), "--algorithm", name, "--trials", "2",
                  "--rounds", "2", "--set", "local_epochs=1", "--out", str(out), "--format", "quiet"]) == 0
    best = yaml.safe_load((out / "best.yaml").read_text())
    assert best["algorithm"] == name and ok(best[key]) and 1e-3 <= best["lr"] <= 1
