"""`pflx train --algorithm centralized` end to end: train -> predict (a new client gets the one model), compare
beside FedAvg, resume, the refusals (one line, exit 2, nothing written: a partition whose clients are all
holdout, --dp, a server key), and its tune space."""

import json

import numpy as np
import pytest

from pfl_cli.cli.app import main as _main
from pflx_testing import cli_args, small_config


def main(argv):
    argv = [str(a) for a in argv]
    return _main(cli_args(argv) if argv[:1] == ["train"] else argv)


FAST = ["--rounds", "6", "--eval-every", "6", "--local-steps", "3", "--clients-per-round", "4",
        "--lr", "0.05", "--set", "mlp_hidden=[16]"]


def test_train_predict_and_compare_beside_fedavg(train_predicts, digits_root, tmp_path):
    metrics, payload, preds = train_predicts("centralized", FAST, run=main)
    assert metrics["train"]["mean_accuracy"] > 0.6 and metrics["floats_per_client_round"] == 0
    assert set(payload["weights"]) == {"client"}  # the one model
    for clients, m in preds.items():
        assert m["personalized"] is False and m["optimizer_steps"] == 0
        assert m["mean_accuracy"] > 0.5, (clients, m["mean_accuracy"])  # chance: 0.1
    assert main(["train", "--partition", digits_root / "part", "--algorithm", "fedavg", "--out",
                 digits_root / "fedavg-beside-centralized", "--format", "quiet", *FAST]) == 0
    assert main(["compare", digits_root / "centralized", digits_root / "fedavg-beside-centralized",
                 "--out", tmp_path / "table", "--format", "quiet"]) == 0
    rows = json.loads((tmp_path / "table" / "table.json").read_text())["rows"]
    labels = {(r["label"], r["group"]) for r in rows}
    assert ("centralized", "train") in labels and ("fedavg", "train") in labels
    mine = next(r for r in rows if r["label"] == "centralized" and r["group"] == "train")
    assert mine["accuracy"] == pytest.approx(metrics["train"]["mean_accuracy"], abs=1e-12)


def test_resumed_run_writes_the_same_model(resume_matches):
    resume_matches(small_config(algorithm="centralized", rounds=4, eval_every=2, local_steps=2, lr=0.05,
                                mlp_hidden=(16,), clients_per_round=6), at=2)


@pytest.mark.parametrize("extra,message", [
    (("--set", "server_lr=0.5"), "server_lr has no effect on algorithm 'centralized'"),
    (("--set", "alpha=0.1"), "unknown --set key 'alpha' for algorithm 'centralized'"),
    (("--dp", "eps=4,clip=1,population=1000", "--set", "normalize=false"),
     "centralized --dp needs --set dp_sampling_rate=Q, the public Poisson rate at which each pooled record joins"),
])
def test_bad_input_is_one_line_and_exit_2(train_refused, extra, message):
    train_refused(["--rounds", "2", "--algorithm", "centralized", *extra], message, run=_main)


def test_a_partition_of_holdout_clients_only_is_refused(digits_clients, tmp_path, capsys):
    import dataclasses

    from pfl_cli.artifacts import ArtifactWriter
    from pfl_cli.cli.partition_artifact import write_partition_artifact

    ds, part = digits_clients
    writer = ArtifactWriter(tmp_path / "holdout-only", stage="partition", config={"note": "every client holdout"},
                            seed=0, inputs=[ds.input_ref()])
    with writer:
        write_partition_artifact(writer, dataclasses.replace(part, role=np.ones_like(part.role)), ds)
    capsys.readouterr()
    code = _main(["train", "--partition", str(tmp_path / "holdout-only"), "--algorithm", "centralized", "--rounds",
                  "2", "--out", str(tmp_path / "bad")])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1, err
    assert "holdout-only: training needs train clients (role 0); all 20 clients are holdout clients" in err
    assert not (tmp_path / "bad").exists()


def test_tune_searches_the_client_lr(digits_root, tmp_path):
    import yaml

    out = tmp_path / "study"
    assert _main(["tune", "--partition", str(digits_root / "part"), "--algorithm", "centralized", "--trials", "2",
                  "--rounds", "2", "--out", str(out), "--format", "quiet"]) == 0
    best = yaml.safe_load((out / "best.yaml").read_text())
    assert best["algorithm"] == "centralized" and 1e-3 <= best["lr"] <= 1
