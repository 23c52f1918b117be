"""`pflx predict` end to end: partition -> train -> predict, recomputed metrics, saved models, errors.

Single-threaded torch for speed on small shared machines (see tests/cli/test_train.py).
"""

import csv
import hashlib
import json

import numpy as np
import pytest
import torch

from pfl_cli.artifacts import load_partition
from pfl_cli.cli.app import main as _main
from pflx_testing import cli_args
from pfl_cli.data import load_dataset
from pfl_cli.fl.api import predict_clients
from pfl_cli.fl.config import PredictConfig
from pflx_testing import small_config


def main(argv):
    """pflx; a train command gets the shared small settings only where its algorithm takes them."""
    argv = [str(a) for a in argv]
    return _main(cli_args(argv) if argv[:1] == ["train"] else argv)

FAST = ["--no-label-mask", "--rounds", "20", "--eval-every", "10", "--local-steps", "5", "--set", "hyper_hidden=16",
        "--set", "mlp_hidden=[16]"]
PART = ["--dataset", "builtin:digits", "--classes-per-client", "2", "--class-shares", "equal", "--num-clients", "20",
        "--test-fraction", "0.3", "--format", "quiet"]


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    root = tmp_path_factory.mktemp("predict")
    assert main(["partition", *PART, "--holdout-clients", "4", "--out", str(root / "part")]) == 0
    assert main(["partition", *PART, "--seed", "1", "--out", str(root / "no-holdout")]) == 0
    assert main(["partition", "--dataset", "ring:?train_per_class=20&test_per_class=10", "--classes-per-client",
                 "2", "--num-clients", "10", "--holdout-clients", "2", "--out", str(root / "ring"),
                 "--format", "quiet"]) == 0
    for alg, extra in (("pefll", []), ("fedavg", []), ("local", ["--local-epochs", "3"])):
        assert main(["train", "--partition", str(root / "part"), "--algorithm", alg, "--out", str(root / alg),
                     "--format", "quiet", *FAST, *extra]) == 0
    return root


def predict(root, model, out, *extra, partition="part", fmt="json"):
    return main(["predict", "--model", str(root / model), "--partition", str(root / partition), "--out", str(out),
                 "--format", fmt, *extra])


def read_csv(path):
    with open(path, newline="") as fh:
        return list(csv.DictReader(fh))


def file_hashes(directory):
    return {p.relative_to(directory).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(directory.rglob("*")) if p.is_file()}


def direct(root, model_dir, **overrides):
    """predict_clients called on the library, from the same files the command reads."""
    model = torch.load(root / model_dir / "model.pt", weights_only=True, map_location="cpu")
    train_cfg = small_config(**json.loads((root / model_dir / "manifest.json").read_text())["config"])
    part, info, _ = load_partition(root / "part")
    ds = load_dataset(info["spec"])
    return predict_clients(model, train_cfg, ds.x, ds.y, ds.num_classes, part, PredictConfig(**overrides))


def test_pefll_predicts_holdout_clients_without_an_optimizer_step(root, tmp_path, capsys):
    before = file_hashes(root / "pefll")
    assert predict(root, "pefll", tmp_path / "pred", "--clients", "holdout") == 0
    result = json.loads(capsys.readouterr().out)
    assert file_hashes(root / "pefll") == before  # the model artifact is untouched
    m = json.loads((tmp_path / "pred" / "metrics.json").read_text())
    assert result["up_to_date"] is False and {k: result[k] for k in m} == m
    assert m["algorithm"] == "pefll" and m["clients"] == "holdout" and m["optimizer_steps"] == 0
    assert m["personalized"] is True and m["label_mask"] is False and m["headline_metric"] == "mean_accuracy_nolm"
    assert m["mean_accuracy"] == m["mean_accuracy_nolm"] and m["pooled_accuracy"] == m["pooled_accuracy_nolm"]
    assert m["mean_accuracy_lm"] >= m["mean_accuracy_nolm"]
    manifest = json.loads((root / "pefll" / "manifest.json").read_text())
    assert m["model"]["stage"] == "train" and m["model"]["path"] == str(root / "pefll")

    # clients.csv: the holdout clients, and the means recomputed from it.
    part, _, _ = load_partition(root / "part")
    rows = read_csv(tmp_path / "pred" / "clients.csv")
    holdout = np.flatnonzero(part.role == 1)
    assert [int(r["client_id"]) for r in rows] == part.client_id[holdout].tolist()
    assert {r["role"] for r in rows} == {"1"} and m["num_clients"] == len(holdout) == 4
    n = np.array([int(r["n_test"]) for r in rows])
    assert n.tolist() == part.test_sizes[holdout].tolist() and m["num_samples"] == n.sum()
    assert [int(r["n_train"]) for r in rows] == part.train_sizes[holdout].tolist()
    for column, key in (("accuracy", "nolm"), ("accuracy_lm", "lm")):
        acc = np.array([float(r[column]) for r in rows])
        assert acc.mean() == pytest.approx(m[f"mean_accuracy_{key}"], abs=1e-12)
        assert np.round(acc * n).sum() / n.sum() == pytest.approx(m[f"pooled_accuracy_{key}"], abs=1e-12)

    # The library call gives the same numbers, and so did training's evaluation of the holdout clients.
    s = direct(root, "pefll").evaluation.summary()
    for key in ("mean_accuracy", "pooled_accuracy", "mean_accuracy_lm", "pooled_accuracy_lm", "loss"):
        assert m[key if key.endswith("_lm") or key == "loss" else f"{key}_nolm"] == pytest.approx(s[key], abs=1e-12)
    trained = json.loads((root / "pefll" / "metrics.json").read_text())["holdout"]
    assert m["mean_accuracy_lm"] == pytest.approx(trained["mean_accuracy_lm"], abs=1e-12)
    assert m["pooled_accuracy_nolm"] == pytest.approx(trained["pooled_accuracy"], abs=1e-12)
    assert manifest == json.loads((root / "pefll" / "manifest.json").read_text())

    # Same command again: nothing to do.
    assert predict(root, "pefll", tmp_path / "pred", "--clients", "holdout") == 0
    assert json.loads(capsys.readouterr().out) == {"out": str(tmp_path / "pred"), "up_to_date": True}


def test_label_mask_flag_switches_the_headline(root, tmp_path, capsys):
    assert predict(root, "pefll", tmp_path / "lm", "--clients", "all", "--label-mask", fmt="human") == 0
    assert "pooled lm*" in capsys.readouterr().out
    m = json.loads((tmp_path / "lm" / "metrics.json").read_text())
    assert m["label_mask"] is True and m["headline_metric"] == "mean_accuracy_lm" and m["num_clients"] == 20
    assert m["mean_accuracy"] == m["mean_accuracy_lm"] and m["pooled_accuracy"] == m["pooled_accuracy_lm"]


def test_saved_personalized_models_reproduce_the_client_accuracies(root, tmp_path, capsys):
    from torch.func import functional_call

    from pfl_cli.models import build

    assert predict(root, "pefll", tmp_path / "s", "--clients", "train", "--save-models") == 0
    saved = torch.load(tmp_path / "s" / "models.pt", weights_only=True)
    rows = read_csv(tmp_path / "s" / "clients.csv")
    assert saved["client_id"].tolist() == [int(r["client_id"]) for r in rows] and len(rows) == 16
    model = torch.load(root / "pefll" / "model.pt", weights_only=True)
    net = build(model["arch"]["client"])
    assert all(w.shape[0] == 16 and w.shape[1:] == p.shape
               for (name, p), w in zip(net.named_parameters(), saved["weights"].values()))
    part, info, _ = load_partition(root / "part")
    ds = load_dataset(info["spec"])
    position = {int(c): j for j, c in enumerate(part.client_id)}
    for i, row in enumerate(rows):
        j = position[int(row["client_id"])]
        idx = part.test_of(j)
        x = (torch.as_tensor(ds.x[idx], dtype=torch.float32) - model["normalization"]["mean"]) / model["normalization"]["std"]
        logits = functional_call(net, {k: v[i] for k, v in saved["weights"].items()}, (x,))
        correct = (logits.argmax(1).numpy() == ds.y[idx]).sum()
        assert correct == round(float(row["accuracy"]) * len(idx))


def test_fedavg_saves_one_global_model(root, tmp_path, capsys):
    assert predict(root, "fedavg", tmp_path / "g", "--clients", "holdout", "--save-models") == 0
    m = json.loads((tmp_path / "g" / "metrics.json").read_text())
    assert m["personalized"] is False and m["algorithm"] == "fedavg"
    saved = torch.load(tmp_path / "g" / "models.pt", weights_only=True)
    model = torch.load(root / "fedavg" / "model.pt", weights_only=True)
    assert saved["weights"].keys() == model["weights"]["client"].keys()
    assert all(torch.equal(saved["weights"][k], v) for k, v in model["weights"]["client"].items())
    # Fine-tuning makes it personalized: one model per client.
    assert predict(root, "fedavg", tmp_path / "ft", "--clients", "holdout", "--finetune-steps", "3",
                   "--save-models") == 0
    m = json.loads((tmp_path / "ft" / "metrics.json").read_text())
    assert m["personalized"] is True and m["finetune_steps"] == 3
    assert next(iter(torch.load(tmp_path / "ft" / "models.pt", weights_only=True)["weights"].values())).shape[0] == 4


def test_local_predict_matches_a_direct_call(root, tmp_path, capsys):
    assert predict(root, "local", tmp_path / "l", "--clients", "all") == 0
    m = json.loads((tmp_path / "l" / "metrics.json").read_text())
    s = direct(root, "local", clients="all").evaluation.summary()
    assert m["pooled_accuracy_nolm"] == s["pooled_accuracy"] and m["mean_accuracy_lm"] == s["mean_accuracy_lm"]


def test_no_holdout_clients(root, tmp_path, capsys):
    assert predict(root, "pefll", tmp_path / "x", "--clients", "holdout", partition="no-holdout") == 2
    err = capsys.readouterr().err
    assert "has no such clients" in err and "--clients train|all" in err and not (tmp_path / "x").exists()


def test_model_must_be_a_train_artifact(root, tmp_path, capsys):
    assert predict(root, "part", tmp_path / "x") == 2
    err = capsys.readouterr().err
    assert "expected a 'train' artifact, found stage 'partition'" in err and "pflx train" in err


def test_partition_over_another_dataset_is_refused(root, tmp_path, capsys):
    assert predict(root, "pefll", tmp_path / "x", partition="ring") == 2
    err = capsys.readouterr().err
    assert "different dataset" in err and "labels hash" in err and "pflx simulate" in err
    assert not (tmp_path / "x").exists()


def _model_train_samples(part):
    return np.unique(part.train_indices[part.role[part.train_owner()] == 0])


def test_test_samples_the_model_trained_on_are_refused(root, tmp_path, capsys):
    # "no-holdout" is another partition of the same digits (seed 1): some of its test samples are samples
    # the model trained on, which predict must never score as test samples (issue 34, item 1).
    part, _, _ = load_partition(root / "part")
    trained_on = _model_train_samples(part)
    np.testing.assert_array_equal(np.load(root / "pefll" / "train_samples.npz")["sample"], trained_on)
    other, _, _ = load_partition(root / "no-holdout")
    overlap = int(np.isin(other.test_indices, trained_on).sum())
    assert overlap > 0
    capsys.readouterr()
    assert predict(root, "pefll", tmp_path / "x", "--clients", "train", partition="no-holdout") == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"{overlap} of the {len(other.test_indices)} test samples" in err, err
    assert "trained on" in err and not (tmp_path / "x").exists()


def test_overlap_is_checked_from_the_model_record_when_its_partition_moved(root, tmp_path, capsys):
    # The train artifact records its training samples, so the check needs no partition at its old path;
    # the model's own partition, moved, is still recognised by its sha256.
    import shutil

    shutil.copytree(root / "part", tmp_path / "p")
    assert main(["train", "--partition", tmp_path / "p", "--algorithm", "fedavg", "--out", tmp_path / "m",
                 "--rounds", "2", "--eval-every", "1", "--local-steps", "2", "--set", "mlp_hidden=[8]",
                 "--format", "quiet"]) == 0
    shutil.move(tmp_path / "p", tmp_path / "moved")
    assert main(["predict", "--model", tmp_path / "m", "--partition", root / "no-holdout", "--clients", "all",
                 "--out", tmp_path / "x", "--format", "quiet"]) == 2
    assert "test samples" in capsys.readouterr().err and not (tmp_path / "x").exists()
    assert main(["predict", "--model", tmp_path / "m", "--partition", tmp_path / "moved", "--clients", "all",
                 "--out", tmp_path / "y", "--format", "quiet"]) == 0


@pytest.mark.parametrize("extra,message", [
    (("--clients", "everyone"), "clients must be one of holdout, train, all; got 'everyone'."),
    (("--eval-descriptor", "some"), "eval_descriptor must be one of all, batch; got 'some'."),
    (("--set", "batch_sise=3"), "Did you mean 'batch_size'"),
])
def test_bad_options_exit_2(root, tmp_path, capsys, extra, message):
    assert predict(root, "pefll", tmp_path / "x", *extra) == 2
    assert message in capsys.readouterr().err


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has CUDA")
def test_cuda_without_a_gpu_exits_2(root, tmp_path, capsys):
    assert predict(root, "pefll", tmp_path / "x", "--device", "cuda") == 2
    assert "CUDA" in capsys.readouterr().err


@pytest.mark.slow  # a train run and two predictions: ~30 s on 2 shared cores
def test_train_clients_never_sampled_are_served_and_reported_by_the_new_client_protocol(root, tmp_path, capsys):
    """Before: one has_state check for the whole group named the new-client protocol for every train client."""
    assert main(["train", "--partition", root / "part", "--algorithm", "fedrep", "--out", tmp_path / "m",
                 "--format", "quiet", *FAST, "--rounds", "1", "--eval-every", "1", "--clients-per-round", "3"]) == 0
    assert predict(root, tmp_path / "m", tmp_path / "p", "--clients", "train") == 0
    m = json.loads((tmp_path / "p" / "metrics.json").read_text())
    rows = read_csv(tmp_path / "p" / "clients.csv")
    model = torch.load(tmp_path / "m" / "model.pt", weights_only=True, map_location="cpu")
    run = predict_clients(model, small_config(**json.loads((tmp_path / "m" / "manifest.json").read_text())["config"]),
                          *(lambda ds: (ds.x, ds.y, ds.num_classes))(load_dataset("builtin:digits")),
                          load_partition(root / "part")[0], PredictConfig(clients="train"))
    alg = run.algorithm
    own, new = alg.protocol(False)["protocol"], alg.protocol(True)["protocol"]
    assert own != new
    known = alg.has_state(run.clients)
    assert int(known.sum()) == 3 and len(known) == 16 == len(rows)  # the one round's cohort has state
    part = load_partition(root / "part")[0]
    want = {str(int(part.client_id[c])): own if k else new for c, k in zip(run.clients, known)}
    assert {r["client_id"]: r["protocol"] for r in rows} == want
    assert m["new_clients"] == 13
    assert m["protocols"] == [{"protocol": own, "rounds": alg.protocol(False)["rounds"], "clients": 3},
                              {"protocol": new, "rounds": alg.protocol(True)["rounds"], "clients": 13}]
    assert own in m["protocol"] and new in m["protocol"] and "3 clients" in m["protocol"]
