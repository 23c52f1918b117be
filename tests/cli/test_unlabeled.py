"""Clients without labels through partition -> train -> predict, on data the other tests do not use."""

import json

import numpy as np
import pytest

from pfl_cli.cli.app import main as _main
from pflx_testing import cli_args


def main(argv):
    """pflx; a train command gets the shared small settings only where its algorithm takes them."""
    argv = [str(a) for a in argv]
    return _main(cli_args(argv) if argv[:1] == ["train"] else argv)


FAST = ["--rounds", "6", "--eval-every", "3", "--local-steps", "3", "--batch-size", "8", "--clients-per-round", "4",
        "--set", "mlp_hidden=[8]", "--set", "hyper_hidden=16", "--set", "descriptor_batch=8", "--format", "quiet"]


def _blobs(tmp_path, n=480, d=6, classes=3):
    """Gaussian blobs with a class-dependent mean: a dataset no other test contains."""
    rng = np.random.default_rng(7)
    y = rng.integers(0, classes, n)
    x = (rng.normal(size=(n, d)) + 2.0 * np.eye(classes, d)[y]).astype(np.float32)
    path = tmp_path / "blobs.npz"
    np.savez(path, x=x, y=y)
    return f"npz:{path}", x, y


@pytest.fixture(scope="module")
def unlabeled_run(tmp_path_factory):
    """A partition where half the train clients and every holdout client have no labels, and a PeFLL
    model with a label-free embedding trained on it."""

    t = tmp_path_factory.mktemp("unlabeled")
    spec, x, y = _blobs(t)
    part, model = t / "part", t / "pefll"
    assert main(["partition", "--dataset", spec, "--dirichlet", "0.5", "--num-clients", "12", "--holdout-clients",
                 "4", "--label-prevalence", "0.5", "--test-fraction", "0.25", "--out", str(part),
                 "--format", "quiet"]) == 0
    assert main(["train", "--partition", str(part), "--out", str(model), "--embedding", "mlp-x", *FAST]) == 0
    return t, part, model, y


def test_label_prevalence_is_recorded_and_hides_whole_clients(unlabeled_run):
    t, part, _, _ = unlabeled_run
    stats = json.loads((part / "stats.json").read_text())
    assert stats["label_prevalence"] == 0.5 and stats["num_labeled_clients"] == 4
    assert stats["scheme_info"]["labels"] == {"label_prevalence": 0.5, "labeled_train_clients": 4,
                                              "unlabeled_train_clients": 4, "unlabeled_holdout_clients": 4}
    arrays = np.load(part / "clients.npz")
    assert arrays["labeled"][arrays["role"] == 1].tolist() == [0] * 4
    assert int(arrays["labeled"][arrays["role"] == 0].sum()) == 4


def test_predict_serves_unlabeled_clients_without_scoring_them(unlabeled_run, cli):
    t, part, model, y = unlabeled_run
    out = t / "pred"
    run = cli("predict", "--model", model, "--partition", part, "--save-models", "--out", out, "--format", "json")
    assert run.code == 0, run.err
    m = json.loads((out / "metrics.json").read_text())
    assert m["num_unlabeled_clients"] == 4 and m["num_evaluated_clients"] == 0 and not m["hidden_label_oracle"]
    assert m["mean_accuracy"] is None and m["optimizer_steps"] == 0
    pred = np.load(out / "predictions.npz")
    clients = np.load(part / "clients.npz")
    holdout = np.flatnonzero(clients["role"] == 1)
    # every train and test sample of every holdout client, once, with a distribution over the classes
    expected = np.sort(np.concatenate([clients["train_indices"][clients["train_offsets"][j]:clients["train_offsets"][j + 1]]
                                       for j in holdout] +
                                      [clients["test_indices"][clients["test_offsets"][j]:clients["test_offsets"][j + 1]]
                                       for j in holdout]))
    assert np.sort(pred["sample"]).tolist() == expected.tolist()
    assert set(pred["client_id"].tolist()) == set(clients["client_id"][holdout].tolist())
    assert pred["probabilities"].shape == (len(expected), 3)
    np.testing.assert_allclose(pred["probabilities"].sum(1), 1.0, rtol=1e-5)
    assert (pred["predicted"] == pred["probabilities"].argmax(1)).all()
    models = __import__("torch").load(out / "models.pt", weights_only=True)
    assert models["client_id"].tolist() == clients["client_id"][holdout].tolist()


def test_hidden_labels_score_only_as_a_stated_oracle(unlabeled_run, cli):
    t, part, model, y = unlabeled_run
    out = t / "oracle"
    run = cli("predict", "--model", model, "--partition", part, "--evaluate-hidden-labels", "--out", out)
    assert run.code == 0, run.err
    assert "ORACLE" in run.out
    m = json.loads((out / "metrics.json").read_text())
    assert m["hidden_label_oracle"] and m["num_evaluated_clients"] == 4
    # the oracle's accuracy is the predictions' agreement with the hidden labels on the test samples
    pred = np.load(out / "predictions.npz")
    test = pred["split"] == 1
    pooled = float(np.mean(pred["predicted"][test] == y[pred["sample"][test]]))
    assert m["pooled_accuracy_nolm"] == pytest.approx(pooled)


@pytest.mark.parametrize("args,name", [(["--embedding", "mlp"], "pefll"), (["--algorithm", "local", "--local-epochs", "1"], "local"),
                                       (["--algorithm", "fedavg", "--finetune-steps", "2"], "fedavg")])
def test_a_model_that_needs_labels_is_refused_on_unlabeled_clients(unlabeled_run, cli, args, name):
    t, part, _, _ = unlabeled_run
    model = t / f"needs-{name}"
    assert cli(*cli_args(["train", "--partition", part, "--out", model, *FAST, *args])).code == 0
    run = cli("predict", "--model", model, "--partition", part, "--out", t / f"refused-{name}")
    assert run.code == 2 and len(run.err.strip().splitlines()) == 1
    assert f"this {name} model needs a client's labels at prediction time" in run.err
    assert "pefll with --embedding cnn-x or mlp-x" in run.err and "fedavg without --finetune-steps" in run.err
    assert not (t / f"refused-{name}").exists()


@pytest.mark.parametrize("value", ["0", "1.5", "-0.2", "nan"])
def test_label_prevalence_outside_zero_one_is_refused(tmp_path, cli, value):
    run = cli("partition", "--label-prevalence", value, "--out", tmp_path / "p")
    rule = ("label_prevalence must be a finite number" if value == "nan"  # the config schema refuses NaN first
            else "label-prevalence must be a fraction of labeled train clients in (0, 1]")
    assert run.code == 2 and rule in run.err and len(run.err.strip().splitlines()) == 1
    assert not (tmp_path / "p").exists()


def test_unknown_labels_in_npz_and_csv_are_unlabeled_clients(tmp_path, cli):
    """y = -1 (npz) or labeled = 0 (csv): those samples train nothing and are predicted like any other."""
    rng = np.random.default_rng(3)
    n = 300
    y = rng.integers(0, 3, n)
    x = rng.normal(size=(n, 4)).astype(np.float32) + y[:, None]
    y_npz = np.where(np.arange(n) % 3 == 0, -1, y)
    np.savez(tmp_path / "d.npz", x=x, y=y_npz)
    lines = ["a,b,c,d,label,labeled"] + [",".join([*(f"{v:.4f}" for v in x[i]), str(y[i]), str(int(i % 3 != 0))])
                                         for i in range(n)]
    (tmp_path / "d.csv").write_text("\n".join(lines) + "\n")
    for spec in (f"npz:{tmp_path / 'd.npz'}", f"csv:{tmp_path / 'd.csv'}"):
        name = spec.split(".")[-1]
        part = tmp_path / f"p-{name}"
        assert cli("partition", "--dataset", spec, "--num-clients", "6", "--holdout-clients", "2", "--out", part).code == 0
        model = tmp_path / f"m-{name}"
        assert cli(*cli_args(["train", "--partition", part, "--algorithm", "fedavg", "--out", model, *FAST])).code == 0
        skip = ["--no-predictions"] if name == "csv" else []
        assert cli("predict", "--model", model, "--partition", part, "--out", tmp_path / f"q-{name}", *skip).code == 0
        assert (tmp_path / f"q-{name}" / "predictions.npz").exists() == (not skip)
        m = json.loads((tmp_path / f"q-{name}" / "metrics.json").read_text())
        assert m["num_unlabeled_clients"] == 0 and m["num_evaluated_clients"] == 2
        # a third of the test samples have no visible label: only the rest are scored
        scored = m["num_samples"]
        clients = np.load(part / "clients.npz")
        test = np.concatenate([clients["test_indices"][clients["test_offsets"][j]:clients["test_offsets"][j + 1]]
                               for j in np.flatnonzero(clients["role"] == 1)])
        assert scored == int(np.sum(test % 3 != 0))
    dirichlet = cli("partition", "--dataset", f"npz:{tmp_path / 'd.npz'}", "--dirichlet", "0.5", "--out", tmp_path / "x")
    assert dirichlet.code == 2 and "needs every sample's label" in dirichlet.err


def test_rotations_rotate_each_clients_images_when_loaded(tmp_path, cli):
    from pfl_cli.cli.common import load_partition_dataset
    from pfl_cli.data import load_dataset

    part = tmp_path / "rot"
    assert cli("partition", "--rotations", "0,90,180,270", "--num-clients", "12", "--out", part).code == 0
    loaded, _, _, ds = load_partition_dataset(part)
    raw = load_dataset("builtin:digits").x.reshape(-1, 8, 8)
    assert sorted(set(loaded.rotation.tolist())) == [0, 90, 180, 270]
    stats = json.loads((part / "stats.json").read_text())["scheme_info"]["rotations"]
    assert sum(stats.values()) == 12
    for j in range(loaded.num_clients):  # the obviously-correct reference: one client at a time
        for idx in (loaded.train_of(j), loaded.test_of(j)):
            want = np.rot90(raw[idx], k=int(loaded.rotation[j]) // 90, axes=(1, 2))
            assert np.array_equal(ds.x[idx].reshape(-1, 8, 8), want)
    bad = cli("partition", "--rotations", "0,45", "--out", tmp_path / "bad")
    assert bad.code == 2 and "rotations must be distinct angles from 0, 90, 180, 270" in bad.err
    np.savez(tmp_path / "flat.npz", x=np.ones((20, 5)), y=np.arange(20) % 2)
    odd = cli("partition", "--dataset", f"npz:{tmp_path / 'flat.npz'}", "--rotations", "0,90", "--out", tmp_path / "o")
    assert odd.code == 2 and "rotations need square images" in odd.err


def test_flowdup_serves_new_unlabeled_rotated_clients_through_the_cli(tmp_path, cli):
    part, model, pred = tmp_path / "rot", tmp_path / "flowdup", tmp_path / "pred"
    assert cli("partition", "--rotations", "0,90,180,270", "--label-prevalence", "0.5", "--num-clients", "16",
               "--holdout-clients", "4", "--test-fraction", "0.3", "--out", part).code == 0
    run = cli("train", "--partition", part, "--algorithm", "flowdup", "--out", model, "--rounds", "4", "--eval-every",
              "2", "--batch-size", "8", "--set", "subspace_dim=100", "--set", "feature_dim=8",  # 1 epoch a round
              "--set", "hyper_hidden=16", "--set", "mlp_hidden=[8]", "--format", "json")
    assert run.code == 0, run.err
    m = json.loads((model / "metrics.json").read_text())
    k = 100
    assert m["num_unlabeled_clients"] == 10 and m["parameters"]["subspace_dim"] == k
    assert m["floats_per_client_round"] == 2 * (m["parameters"]["features"] + m["parameters"]["head"] + k)
    out = cli("predict", "--model", model, "--partition", part, "--evaluate-hidden-labels", "--out", pred)
    assert out.code == 0, out.err
    p = json.loads((pred / "metrics.json").read_text())
    assert p["algorithm"] == "flowdup" and p["optimizer_steps"] == 0 and p["personalized"]
    assert p["num_unlabeled_clients"] == 4 and p["hidden_label_oracle"] and p["num_evaluated_clients"] == 4
    assert 0.0 <= p["mean_accuracy"] <= 1.0
    assert np.load(pred / "predictions.npz")["probabilities"].shape[1] == 10
    big = cli("train", "--partition", part, "--algorithm", "flowdup", "--out", tmp_path / "big", "--set",
              "subspace_dim=100000", "--set", "mlp_hidden=[8]")
    assert big.code == 2 and "subspace_dim must be at most the client model's 610 weights; got 100000" in big.err
    assert not (tmp_path / "big").exists()
    track = cli("train", "--partition", part, "--algorithm", "flowdup", "--out", tmp_path / "t", "--set",
                "track_descriptors=true")
    assert track.code == 2 and "unknown --set key 'track_descriptors' for algorithm 'flowdup'" in track.err


def test_fedtta_adapts_to_new_unlabeled_clients_through_the_cli(tmp_path, cli):
    """FedTTA trains on the labeled clients and adapts the global model on each new client's unlabeled samples."""
    part, model, pred = tmp_path / "rot", tmp_path / "fedtta", tmp_path / "pred"
    assert cli("partition", "--rotations", "0,90,180,270", "--label-prevalence", "0.5", "--num-clients", "16",
               "--holdout-clients", "4", "--test-fraction", "0.3", "--out", part).code == 0
    run = cli("train", "--partition", part, "--algorithm", "fedtta", "--out", model, "--rounds", "2", "--eval-every",
              "2", "--clients-per-round", "4", "--set", "mlp_hidden=[8]", "--set", "adapt_steps=2", "--format", "json")
    assert run.code == 0, run.err
    m = json.loads((model / "metrics.json").read_text())
    assert m["num_unlabeled_clients"] == 10
    out = cli("predict", "--model", model, "--partition", part, "--evaluate-hidden-labels", "--out", pred)
    assert out.code == 0, out.err
    p = json.loads((pred / "metrics.json").read_text())
    assert p["algorithm"] == "fedtta" and p["personalized"] and p["num_evaluated_clients"] == 4
    assert p["optimizer_steps"] == 2 * 4  # adapt_steps on each new client, no labels read
    assert p["protocol"] == "global model adapted 2 steps on the learned loss of its unlabeled data"
    bad = cli("train", "--partition", part, "--algorithm", "fedtta", "--out", tmp_path / "bad", "--set", "adapt_lr=0")
    assert bad.code == 2 and "adapt_lr" in bad.err and not (tmp_path / "bad").exists()
