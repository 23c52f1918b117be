"""Balanced accuracy, macro-F1 and the global model's accuracy through train -> predict -> compare --metric, on
real artifacts: clients.csv against scikit-learn on predict's own predictions, metrics.json's pooled values
against clients.csv, the compare table against both, and bad input (unknown metric, a method without a
global model, an artifact written before these columns)."""

import csv
import json
import shutil
import warnings

import numpy as np
import pytest
from sklearn.metrics import balanced_accuracy_score, f1_score

from pfl_cli.artifacts import sha256_file
from pfl_cli.cli.app import main as _main
from pflx_testing import cli_args

FAST = ["--rounds", "2", "--eval-every", "1", "--local-steps", "3", "--set", "mlp_hidden=[16]", "--format", "quiet"]
PART = ["--dataset", "builtin:digits", "--dirichlet", "0.3", "--num-clients", "12", "--holdout-clients", "3",
        "--test-fraction", "0.3", "--format", "quiet"]


def main(argv):
    argv = [str(a) for a in argv]
    return _main(cli_args(argv) if argv[:1] == ["train"] else argv)


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    root = tmp_path_factory.mktemp("metrics")
    assert main(["partition", *PART, "--out", root / "part"]) == 0
    for seed in (0, 1):
        assert main(["train", "--partition", root / "part", "--algorithm", "ditto", "--seed", seed,
                     "--out", root / f"ditto-s{seed}", *FAST]) == 0
        assert main(["predict", "--model", root / f"ditto-s{seed}", "--partition", root / "part", "--clients",
                     "holdout", "--no-predictions", "--out", root / f"ditto-s{seed}-new", "--format", "quiet"]) == 0
    assert main(["train", "--partition", root / "part", "--algorithm", "fedavg", "--out", root / "fedavg-s0",
                 *FAST]) == 0
    assert main(["predict", "--model", root / "fedavg-s0", "--partition", root / "part", "--clients", "train",
                 "--out", root / "fedavg-pred", "--format", "quiet"]) == 0
    assert main(["train", "--partition", root / "part", "--algorithm", "local", "--local-epochs", "1",
                 "--out", root / "local-s0", *FAST]) == 0
    return root


def rows(path):
    with open(path, newline="") as fh:
        return list(csv.DictReader(fh))


def num(value):
    return float(value) if value not in ("", None) else np.nan


def sk(y, p):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return balanced_accuracy_score(y, p), f1_score(y, p, average="macro")


def test_clients_csv_metrics_are_sklearns_on_predicts_own_predictions(root):
    """predict's predictions.npz holds every test sample's predicted class: sklearn on them, client by client."""
    from pfl_cli.data import load_dataset

    y = load_dataset("builtin:digits").y
    pred = np.load(root / "fedavg-pred" / "predictions.npz")
    table = {int(r["client_id"]): r for r in rows(root / "fedavg-pred" / "clients.csv")}
    test = pred["split"] == 1
    ys, ps = [], []
    for cid, r in table.items():
        mine = test & (pred["client_id"] == cid)
        yt, pt = y[pred["sample"][mine]], pred["predicted"][mine]
        ys.append(yt)
        ps.append(pt)
        if len(yt) == 0:
            assert r["balanced_accuracy"] == "" and r["macro_f1"] == ""
            continue
        bal, f1 = sk(yt, pt)
        assert num(r["balanced_accuracy"]) == pytest.approx(bal)
        assert num(r["macro_f1"]) == pytest.approx(f1)
        assert num(r["global_accuracy"]) == pytest.approx(float(np.mean(yt == pt)))  # FedAvg: its global model
    metrics = json.loads((root / "fedavg-pred" / "metrics.json").read_text())
    bal, f1 = sk(np.concatenate(ys), np.concatenate(ps))
    assert metrics["pooled_balanced_accuracy"] == pytest.approx(bal)
    assert metrics["pooled_macro_f1"] == pytest.approx(f1)
    assert metrics["global_model"] is True
    assert metrics["global_accuracy"] == pytest.approx(metrics["pooled_accuracy_nolm"])


@pytest.mark.parametrize("run, has", [("ditto-s0", True), ("fedavg-s0", True), ("local-s0", False)])
def test_train_metrics_json_pools_what_clients_csv_holds(root, run, has):
    metrics = json.loads((root / run / "metrics.json").read_text())
    assert metrics["global_model"] is has
    table = rows(root / run / "clients.csv")
    assert list(table[0])[:6] == ["client_id", "role", "n_train", "n_test", "accuracy", "accuracy_lm"]
    for group, role in (("train", 0), ("holdout", 1)):
        mine = [r for r in table if int(r["role"]) == role]
        n = np.array([int(r["n_test"]) for r in mine])
        s = metrics[group]
        bal = np.array([num(r["balanced_accuracy"]) for r in mine])
        assert s["mean_balanced_accuracy"] == pytest.approx(np.nanmean(bal))
        assert s["mean_macro_f1"] == pytest.approx(np.nanmean([num(r["macro_f1"]) for r in mine]))
        glob = np.array([num(r["global_accuracy"]) for r in mine])
        if not has:
            assert s["global_accuracy"] is None and np.isnan(glob).all()
            continue
        # the union of the test splits: sample-weighted, not a mean over clients
        assert s["global_accuracy"] == pytest.approx(np.nansum(glob * n) / n[np.isfinite(glob)].sum())
        if run == "fedavg-s0":
            assert s["global_accuracy"] == pytest.approx(s["pooled_accuracy"])


@pytest.mark.parametrize("metric", ["accuracy", "balanced_accuracy", "macro_f1", "global_accuracy"])
def test_compare_metric_picks_the_headline(root, tmp_path, metric):
    out = tmp_path / "table"
    assert main(["compare", root / "ditto-s0", root / "ditto-s1", root / "fedavg-s0", "--metric", metric,
                 "--out", out, "--format", "quiet"]) == 0
    doc = json.loads((out / "table.json").read_text())
    assert doc["headline_metric"] == metric
    row = next(r for r in doc["rows"] if r["algorithm"] == "ditto" and r["group"] == "train")
    per_seed = []
    for seed in (0, 1):
        if metric == "global_accuracy":
            per_seed.append(json.loads((root / f"ditto-s{seed}" / "metrics.json").read_text())["train"][metric])
        else:
            per_seed.append(np.nanmean([num(r[metric]) for r in rows(root / f"ditto-s{seed}" / "clients.csv")
                                        if r["role"] == "0"]))
    assert row[metric] == pytest.approx(np.mean(per_seed))
    assert row[f"{metric}_ci"] == pytest.approx(12.7062047 * np.std(per_seed, ddof=1) / np.sqrt(2))
    header = (out / "table.md").read_text().splitlines()[0]
    title = {"accuracy": "accuracy", "balanced_accuracy": "balanced accuracy", "macro_f1": "macro-F1",
             "global_accuracy": "global-model accuracy"}[metric]
    assert header.split("|")[4].strip().startswith(f"{title} %")
    csv_row = next(r for r in rows(out / "table.csv") if r["algorithm"] == "ditto" and r["group"] == "train")
    assert num(csv_row[metric]) == pytest.approx(row[metric])


def test_compare_refuses_an_unknown_metric_in_one_line(root, tmp_path, capsys):
    out = tmp_path / "table"
    assert main(["compare", root / "ditto-s0", "--metric", "f1_macro", "--out", out]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1
    assert "--metric" in err and "accuracy, balanced_accuracy, macro_f1, global_accuracy" in err
    assert "'f1_macro'" in err and "macro_f1" in err
    assert not out.exists()


def test_global_accuracy_is_refused_for_a_method_without_a_global_model(root, tmp_path, capsys):
    out = tmp_path / "table"
    assert main(["compare", root / "fedavg-s0", root / "local-s0", "--metric", "global_accuracy",
                 "--out", out]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "local" in err and "no global model" in err and "--metric accuracy" in err
    assert not out.exists()
    # the same runs compare on any per-client metric
    assert main(["compare", root / "fedavg-s0", root / "local-s0", "--metric", "macro_f1", "--out", out,
                 "--format", "quiet"]) == 0


def _rehash(artifact, name):
    manifest = json.loads((artifact / "manifest.json").read_text())
    for entry in manifest["outputs"]:
        if entry["path"] == name:
            entry["sha256"], entry["bytes"] = sha256_file(artifact / name), (artifact / name).stat().st_size
    (artifact / "manifest.json").write_text(json.dumps(manifest))


def test_an_artifact_from_before_the_new_columns_still_compares(root, tmp_path, capsys):
    """clients.csv of six columns and a metrics.json without the new keys: accuracy compares as before; the
    new metrics are empty, and global_accuracy says why it cannot be the headline."""
    old = tmp_path / "old"
    shutil.copytree(root / "fedavg-s0", old)
    table = rows(old / "clients.csv")
    with open(old / "clients.csv", "w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(list(table[0])[:6])
        w.writerows([list(r.values())[:6] for r in table])
    metrics = json.loads((old / "metrics.json").read_text())
    metrics.pop("global_model")
    for group in ("train", "holdout"):
        for key in [k for k in metrics[group] if "balanced" in k or "macro" in k or k.startswith("global")]:
            metrics[group].pop(key)
    (old / "metrics.json").write_text(json.dumps(metrics))
    _rehash(old, "clients.csv")
    _rehash(old, "metrics.json")
    out = tmp_path / "table"
    assert main(["compare", old, root / "ditto-s0", "--out", out, "--format", "quiet"]) == 0
    doc = json.loads((out / "table.json").read_text())
    mine = next(r for r in doc["rows"] if r["algorithm"] == "fedavg" and r["group"] == "train")
    assert mine["accuracy"] is not None and mine["macro_f1"] is None and mine["global_accuracy"] is None
    capsys.readouterr()
    assert main(["compare", old, "--metric", "global_accuracy", "--out", tmp_path / "t2"]) == 2
    assert "before pflx scored global models" in capsys.readouterr().err


def test_under_dp_the_new_metrics_are_released_like_accuracy(root, tmp_path, capsys):
    """--dp: metrics.json releases none of them (public facts and global_model, a property of the method);
    --write-nonprivate puts them in nonprivate.json and nonprivate-clients.csv, which compare --nonprivate reads."""
    dp = ["--dp", "eps=4,delta=1e-6,clip=0.5,population=1000,noise=seeded", "--set", "normalize=false"]
    out = tmp_path / "dpw"
    assert main(["train", "--partition", root / "part", "--algorithm", "fedavg", "--out", out, *FAST, *dp,
                 "--write-nonprivate"]) == 0
    text = (out / "metrics.json").read_text()
    for key in ("balanced_accuracy", "macro_f1", "global_accuracy", "global_balanced", "global_macro"):
        assert key not in text
    assert json.loads(text)["global_model"] is True
    manifest = json.loads((out / "manifest.json").read_text())
    assert "clients.csv" not in {o["path"] for o in manifest["outputs"]}
    private = json.loads((out / "nonprivate.json").read_text())["train"]
    assert private["global_accuracy"] == pytest.approx(private["pooled_accuracy"])
    table = [r for r in rows(out / "nonprivate-clients.csv") if r["role"] == "0"]
    assert private["mean_macro_f1"] == pytest.approx(np.nanmean([num(r["macro_f1"]) for r in table]))
    capsys.readouterr()
    assert main(["compare", out, "--metric", "global_accuracy", "--out", tmp_path / "t"]) == 2
    assert "releases no accuracy" in capsys.readouterr().err and not (tmp_path / "t").exists()
    assert main(["compare", out, "--nonprivate", "--metric", "global_accuracy", "--out", tmp_path / "t",
                 "--format", "quiet"]) == 0
    doc = json.loads((tmp_path / "t" / "nonprivate-table.json").read_text())
    row = next(r for r in doc["rows"] if r["group"] == "train")
    assert doc["headline_metric"] == "global_accuracy" and row["global_accuracy"] == pytest.approx(
        private["global_accuracy"])


def test_new_clients_global_accuracy_comes_from_predict_and_equals_trains_holdout_evaluation(root, tmp_path):
    """The global model needs no new-client protocol: predict's global_accuracy on the holdout clients is the
    train run's own holdout evaluation of it, while Ditto's personalized accuracy there is another number."""
    out = tmp_path / "table"
    runs = [root / f"ditto-s{s}{suffix}" for s in (0, 1) for suffix in ("", "-new")]
    assert main(["compare", *runs, "--metric", "global_accuracy", "--out", out, "--format", "quiet"]) == 0
    row = next(r for r in json.loads((out / "table.json").read_text())["rows"] if r["group"] == "new")
    assert row["source"] == "predict"
    predicted = [json.loads((root / f"ditto-s{s}-new" / "metrics.json").read_text()) for s in (0, 1)]
    trained = [json.loads((root / f"ditto-s{s}" / "metrics.json").read_text())["holdout"] for s in (0, 1)]
    for p, t in zip(predicted, trained):
        assert p["global_model"] is True
        assert p["global_accuracy"] == pytest.approx(t["global_accuracy"])
    assert row["global_accuracy"] == pytest.approx(np.mean([p["global_accuracy"] for p in predicted]))
