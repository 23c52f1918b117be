"""`pflx train` / `pflx predict` end to end with MOON and FedSAM; resume; refusals (one line, exit 2); tune."""

import pytest

from pfl_cli.cli.app import main as _main
from pflx_testing import cli_args, small_config


def main(argv):
    argv = [str(a) for a in argv]
    return _main(cli_args(argv) if argv[:1] == ["train"] else argv)


FAST = ["--rounds", "12", "--eval-every", "6", "--local-steps", "3", "--clients-per-round", "16",
        "--set", "mlp_hidden=[16]"]
# MOON's contrastive term holds the local models near the early global ones: at 0.05 its new clients reached 32 %
# after these 12 rounds (FedAvg 51 %), at 0.1 70 %
LR = {"moon": "0.1", "fedsam": "0.05"}


@pytest.mark.parametrize("name", ["moon", "fedsam"])
def test_train_then_predict_train_and_new_clients(train_predicts, name):
    metrics, payload, preds = train_predicts(name, [*FAST, "--lr", LR[name]], run=main)
    assert metrics["train"]["mean_accuracy"] > 0.5
    assert metrics["floats_per_client_round"] == 2 * sum(v.numel() for v in payload["weights"]["client"].values())
    assert set(payload["weights"]) == {"client"}  # model.pt serves the global model; MOON's previous models train
    for clients, m in preds.items():
        assert m["personalized"] is False and m["optimizer_steps"] == 0
        assert m["mean_accuracy"] > 0.4, (name, clients, m["mean_accuracy"])  # chance: 0.1


@pytest.mark.parametrize("name", ["moon", "fedsam"])
def test_resumed_run_writes_the_same_model(resume_matches, name):
    resume_matches(small_config(algorithm=name, rounds=4, eval_every=2, local_steps=2, lr=0.05, mlp_hidden=(16,),
                                clients_per_round=6), at=2)


def test_moon_resume_restores_every_clients_previous_model(digits_clients):
    """The checkpoint holds each client's previous local model (the next round's z_prev): a resumed run whose
    previous models were lost would differ, so the checkpoint must carry them."""
    from pfl_cli.fl import train_federated

    ds, part = digits_clients
    cfg = small_config(algorithm="moon", rounds=4, eval_every=2, local_steps=2, lr=0.05, mlp_hidden=(16,),
                       clients_per_round=6)
    saved = []
    train_federated(ds.x, ds.y, 10, part, cfg, device="cpu", on_checkpoint=saved.append)
    previous = saved[0]["algorithm"]["previous"]
    assert int(previous["has"].sum()) >= 6  # the clients of two cohorts of 6
    rows = previous["values"]["fc1.weight"][previous["has"]]
    assert float((rows[0] - rows[1]).abs().max()) > 0  # each client's own trained model, not a copy


@pytest.mark.parametrize("extra,message", [
    (("--algorithm", "fedsam", "--set", "sam_rho=0"), "sam_rho must be a finite number > 0 for fedsam; got 0"),
    (("--algorithm", "moon", "--set", "moon_tau=-1"), "moon_tau must be a finite number > 0 for moon; got -1"),
    (("--algorithm", "moon", "--set", "sam_rho=0.1"),
     "unknown --set key 'sam_rho' for algorithm 'moon' (a key of fedavg, fedprox, fedsam)"),
    (("--algorithm", "fedavg", "--set", "sam_rho=-0.1"),
     "sam_rho must be a finite number >= 0 for fedavg (the SAM radius of every local step); got -0.1. Use 0"),
    (("--algorithm", "fedprox", "--set", "sam_rho=.inf"), "sam_rho must be a finite number; got inf"),
    (("--algorithm", "fedavg", "--set", "sam_rho=0.1", "--nproc", "2"),
     "--algorithm fedavg runs in one process only: its SAM local steps (sam_rho 0.1) are not split across ranks"),
    (("--algorithm", "moon", "--set", "model_arch=hyperfl-cnn"), "model_arch"),
    (("--algorithm", "fedsam", "--dp", "eps=4,clip=1,population=1000"),
     "--dp is not supported by algorithm 'fedsam': it declares no DP variant"),
    (("--algorithm", "moon", "--dp", "eps=4,clip=1,population=1000"),
     "--dp is not supported by algorithm 'moon': it declares no DP variant"),
])
def test_bad_input_is_one_line_and_exit_2(train_refused, extra, message):
    train_refused([*FAST[:-4], *extra], message, run=_main)


@pytest.mark.parametrize("name,key,choices", [("moon", "moon_mu", {0.1, 1.0, 5.0, 10.0}),
                                              ("fedsam", "sam_rho", {0.01, 0.02, 0.05, 0.1, 0.2, 0.5})])
def test_tune_searches_the_papers_space(digits_root, tmp_path, name, key, choices):
    import yaml

    out = tmp_path / "study"
    assert _main(["tune", "--partition", str(digits_root / "part"), "--algorithm", name, "--trials", "2",
                  "--rounds", "2", "--out", str(out), "--format", "quiet"]) == 0
    best = yaml.safe_load((out / "best.yaml").read_text())
    assert best["algorithm"] == name and best[key] in choices and 1e-3 <= best["lr"] <= 1


@pytest.mark.parametrize("name,own", [("moon", ["moon_mu", "moon_tau"]), ("fedsam", ["sam_rho"])])
def test_listed_with_its_papers_defaults(listed_with_sources, name, own):
    row = listed_with_sources(name, own)
    assert "global model" in row["new_clients"]
