"""`pflx compare` end to end on tiny trainings: the table against the artifacts' own files, the fairness
statistics of train/predict metrics.json against their clients.csv, --dp runs, the figure and bad input."""

import csv
import json
import math

import numpy as np
import pytest

from pfl_cli.cli.app import main as _main
from pflx_testing import cli_args

T975_DF1 = 12.7062047  # t_{0.975, 1}: two seeds

FAST = ["--rounds", "2", "--eval-every", "1", "--local-steps", "3", "--set", "mlp_hidden=[16]", "--format", "quiet"]
PART = ["--dataset", "builtin:digits", "--classes-per-client", "2", "--class-shares", "equal", "--num-clients", "20",
        "--holdout-clients", "4", "--test-fraction", "0.3", "--format", "quiet"]


def main(argv):
    argv = [str(a) for a in argv]
    return _main(cli_args(argv) if argv[:1] == ["train"] else argv)


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    root = tmp_path_factory.mktemp("compare")
    assert main(["partition", *PART, "--out", root / "part"]) == 0
    assert main(["partition", *PART, "--seed", "1", "--out", root / "part1"]) == 0
    for seed in (0, 1):
        assert main(["train", "--partition", root / "part", "--algorithm", "fedavg", "--seed", seed,
                     "--out", root / f"fedavg-s{seed}", *FAST]) == 0
        assert main(["predict", "--model", root / f"fedavg-s{seed}", "--partition", root / "part",
                     "--no-predictions", "--out", root / f"fedavg-s{seed}-new", "--format", "quiet"]) == 0
    assert main(["train", "--partition", root / "part", "--algorithm", "local", "--local-epochs", "2",
                 "--out", root / "local-s0", *FAST]) == 0
    assert main(["train", "--partition", root / "part1", "--algorithm", "fedavg", "--out", root / "other", *FAST]) == 0
    return root


def read_csv(path):
    with open(path, newline="") as fh:
        return list(csv.DictReader(fh))


def client_accuracies(path, role=None):
    rows = read_csv(path)
    return np.array([float(r["accuracy"]) if r["accuracy"] else np.nan for r in rows
                     if role is None or int(r["role"]) == role])


def fairness_by_sorting(acc):
    a = sorted(v for v in acc if v == v)
    k = math.ceil(len(a) / 10)
    return {"accuracy_std": float(np.std(a)), "accuracy_worst10": sum(a[:k]) / k, "accuracy_min": a[0]}


def test_train_and_predict_metrics_hold_fairness_over_their_clients(root):
    train = json.loads((root / "fedavg-s0" / "metrics.json").read_text())
    for group, role in (("train", 0), ("holdout", 1)):
        ref = fairness_by_sorting(client_accuracies(root / "fedavg-s0" / "clients.csv", role))
        for key, value in ref.items():
            assert train[group][key] == pytest.approx(value, abs=1e-12)
        assert {f"{k}_lm" for k in ref} <= set(train[group])
    pred = json.loads((root / "fedavg-s0-new" / "metrics.json").read_text())
    ref = fairness_by_sorting(client_accuracies(root / "fedavg-s0-new" / "clients.csv"))
    for key, value in ref.items():
        assert pred[key] == pytest.approx(value, abs=1e-12)
    lm = [float(r["accuracy_lm"]) for r in read_csv(root / "fedavg-s0-new" / "clients.csv")]
    assert pred["accuracy_min_lm"] == pytest.approx(min(lm), abs=1e-12)


def test_compare_table_against_the_runs_files(root, tmp_path, capsys):
    runs = [root / "fedavg-s0", root / "fedavg-s1", root / "fedavg-s0-new", root / "fedavg-s1-new", root / "local-s0"]
    capsys.readouterr()
    assert main(["compare", *runs, "--out", tmp_path / "table", "--format", "json"]) == 0
    printed = json.loads(capsys.readouterr().out)
    out = tmp_path / "table"
    assert {p.name for p in out.iterdir()} == {"manifest.json", "table.md", "table.csv", "table.json", "clients.csv"}
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["stage"] == "compare" and len(manifest["inputs"]) == 5
    doc = json.loads((out / "table.json").read_text())
    assert printed["rows"] == [{k: v for k, v in r.items() if k not in ("config", "predict_config")} for r in doc["rows"]]
    rows = {(r["label"], r["group"]): r for r in doc["rows"]}
    assert list(rows) == [("fedavg", "train"), ("fedavg", "new"), ("local", "train"), ("local", "new")]

    # fedavg, training clients: each seed's mean is its metrics.json's; the interval is t * s / sqrt(2).
    seeds = [json.loads((root / f"fedavg-s{s}" / "metrics.json").read_text())["train"] for s in (0, 1)]
    a, b = (m["mean_accuracy"] for m in seeds)
    r = rows[("fedavg", "train")]
    assert r["seeds"] == [0, 1] and r["source"] == "train" and r["num_clients"] == 16
    assert r["accuracy"] == pytest.approx((a + b) / 2, abs=1e-12)
    assert r["accuracy_ci"] == pytest.approx(T975_DF1 * abs(a - b) / 2, rel=1e-6)
    assert r["accuracy_lm"] == pytest.approx((seeds[0]["mean_accuracy_lm"] + seeds[1]["mean_accuracy_lm"]) / 2)
    for key in ("accuracy_std", "accuracy_worst10", "accuracy_min"):
        assert r[key] == pytest.approx((seeds[0][key] + seeds[1][key]) / 2, abs=1e-12)

    # fedavg, new clients: from the predict runs (not the train runs' own holdout evaluation)
    new = [json.loads((root / f"fedavg-s{s}-new" / "metrics.json").read_text()) for s in (0, 1)]
    r = rows[("fedavg", "new")]
    assert r["source"] == "predict" and r["num_clients"] == 4
    assert r["accuracy"] == pytest.approx((new[0]["mean_accuracy_nolm"] + new[1]["mean_accuracy_nolm"]) / 2)
    # local: one seed, its holdout evaluation; no interval
    r = rows[("local", "new")]
    assert r["source"] == "train" and r["accuracy_ci"] is None and r["accuracy_lm_ci"] is None
    md = (out / "table.md").read_text()
    assert "| local | new (train eval) | 1 |" in md and "± n/a" in md
    table_csv = read_csv(out / "table.csv")
    assert [row["accuracy_ci"] for row in table_csv][2:] == ["", ""]
    assert len(read_csv(out / "clients.csv")) == 2 * 16 + 2 * 4 + 16 + 4

    # the same runs again: nothing to do
    assert main(["compare", *runs, "--out", out, "--format", "json"]) == 0
    assert json.loads(capsys.readouterr().out) == {"out": str(out), "up_to_date": True}


def test_human_table_and_figure(root, tmp_path, capsys):
    capsys.readouterr()
    assert main(["compare", root / "fedavg-s0", root / "fedavg-s1", root / "local-s0", "--plot",
                 "--out", tmp_path / "t"]) == 0
    text = capsys.readouterr().out
    assert "fedavg" in text and "local" in text and "n/a" in text
    png = (tmp_path / "t" / "clients.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 10_000
    # show: the rows as its headline, and --plot redraws the figure from clients.csv and table.json
    rows = json.loads((tmp_path / "t" / "table.json").read_text())["rows"]
    assert main(["show", tmp_path / "t", "--format", "json"]) == 0
    headline = json.loads(capsys.readouterr().out)["headline"]
    assert headline["local train"] == f"{100 * rows[2]['accuracy']:.1f} ± n/a % (1 seed)"
    assert headline["fedavg train"].endswith("(2 seeds)")
    assert main(["show", tmp_path / "t", "--plot", "--plot-dir", tmp_path / "figs", "--format", "quiet"]) == 0
    assert (tmp_path / "figs" / "t-clients.png").read_bytes()[:8] == png[:8]


def test_a_predict_run_alone_finds_its_model(root, tmp_path):
    assert main(["compare", root / "fedavg-s0-new", "--out", tmp_path / "t", "--format", "quiet"]) == 0
    doc = json.loads((tmp_path / "t" / "table.json").read_text())
    assert [(r["label"], r["group"], r["seeds"]) for r in doc["rows"]] == [("fedavg", "new", [0])]


@pytest.mark.parametrize("case,needle", [
    ("missing", "RUN {root}/nosuch: no such directory"),
    ("partition", "RUN {root}/part: expected a 'train' or 'predict' artifact, found stage 'partition'"),
    ("other-partition", "RUN {root}/other: its partition"),
    ("duplicate", "RUN {root}/fedavg-s0: seed 0 of this fedavg configuration is already given"),
    ("level", "--level must be in (0, 1)"),
])
def test_bad_input_is_one_line_and_writes_nothing(root, tmp_path, cli, case, needle):
    runs = {"missing": [root / "fedavg-s0", root / "nosuch"], "partition": [root / "part"],
            "other-partition": [root / "fedavg-s0", root / "other"], "duplicate": [root / "fedavg-s0"] * 2,
            "level": [root / "fedavg-s0"]}[case]
    extra = ["--level", "1.5"] if case == "level" else []
    result = cli("compare", *runs, "--out", tmp_path / "t", *extra)
    assert result.code == 2
    assert needle.format(root=root) in result.err and len(result.err.strip().splitlines()) == 1
    assert not (tmp_path / "t").exists()


def test_a_predict_run_of_train_clients_is_refused(root, tmp_path, cli):
    assert main(["predict", "--model", root / "fedavg-s0", "--partition", root / "part", "--clients", "train",
                 "--no-predictions", "--out", tmp_path / "p", "--format", "quiet"]) == 0
    result = cli("compare", root / "fedavg-s0", tmp_path / "p", "--out", tmp_path / "t")
    assert result.code == 2 and "new clients (--clients holdout)" in result.err
    assert not (tmp_path / "t").exists()


def test_two_predict_settings_of_one_configuration_are_refused(root, tmp_path, cli):
    assert main(["predict", "--model", root / "fedavg-s1", "--partition", root / "part", "--finetune-steps", "2",
                 "--no-predictions", "--out", tmp_path / "ft", "--format", "quiet"]) == 0
    result = cli("compare", root / "fedavg-s0-new", tmp_path / "ft", "--out", tmp_path / "t")
    assert result.code == 2 and "its predict settings differ" in result.err and "(finetune_steps)" in result.err
    assert not (tmp_path / "t").exists()


def test_dp_runs_only_with_nonprivate_and_named_so(root, tmp_path, cli):
    dp = tmp_path / "dp"
    assert main(["train", "--partition", root / "part", "--algorithm", "fedavg", "--out", dp, *FAST,
                 "--dp", "eps=4,delta=1e-6,clip=0.5,population=1000,noise=seeded", "--set", "normalize=false"]) == 0
    result = cli("compare", dp, "--out", tmp_path / "t")
    assert result.code == 2 and "releases no accuracy" in result.err and not (tmp_path / "t").exists()
    result = cli("compare", dp, "--nonprivate", "--out", tmp_path / "t")
    assert result.code == 2 and "--write-nonprivate" in result.err and not (tmp_path / "t").exists()

    assert main(["train", "--partition", root / "part", "--algorithm", "fedavg", "--out", tmp_path / "dpw", *FAST,
                 "--dp", "eps=4,delta=1e-6,clip=0.5,population=1000,noise=seeded", "--set", "normalize=false",
                 "--write-nonprivate"]) == 0
    # the fairness statistics, like every accuracy, only in the nonprivate file under --dp
    assert "accuracy_std" not in (tmp_path / "dpw" / "metrics.json").read_text()
    assert "accuracy_worst10" in json.loads((tmp_path / "dpw" / "nonprivate.json").read_text())["train"]
    result = cli("compare", tmp_path / "dpw", root / "fedavg-s1", "--nonprivate", "--out", tmp_path / "t")
    assert result.code == 0, result.err
    names = {p.name for p in (tmp_path / "t").iterdir()}
    assert names == {"manifest.json", "nonprivate-table.md", "nonprivate-table.csv", "nonprivate-table.json",
                     "nonprivate-clients.csv"}
    doc = json.loads((tmp_path / "t" / "nonprivate-table.json").read_text())
    assert doc["nonprivate"] is True and "NONPRIVATE" in (tmp_path / "t" / "nonprivate-table.md").read_text()
    ref = client_accuracies(tmp_path / "dpw" / "nonprivate-clients.csv", role=0)
    dp_row = [r for r in doc["rows"] if r["group"] == "train" and r["runs"][0]["path"] == str(tmp_path / "dpw")]
    assert dp_row and dp_row[0]["accuracy"] == pytest.approx(float(np.nanmean(ref)), abs=1e-12)


def test_spec_trains_algorithms_by_seeds_then_compares(root, tmp_path, capsys):
    """A run's own config.yaml as the algorithm's config file (as a tune artifact's best.yaml would be): the spec's
    trainings are byte-identical to the runs made by hand, so the table is theirs."""
    spec = tmp_path / "spec.yaml"
    spec.write_text(f"partition: {root / 'part'}\nseeds: [0, 1]\nruns: {tmp_path / 'runs'}\nalgorithms:\n"
                    f"  fedavg: {root / 'fedavg-s0' / 'config.yaml'}\n")
    capsys.readouterr()
    assert main(["compare", "--spec", spec, "--out", tmp_path / "t", "--format", "json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    for seed in (0, 1):
        for name in ("clients.csv", "metrics.csv", "model.pt"):
            made, by_hand = tmp_path / "runs" / "fedavg" / f"seed-{seed}" / name, root / f"fedavg-s{seed}" / name
            assert made.read_bytes() == by_hand.read_bytes(), name
        assert (tmp_path / "runs" / "fedavg" / f"seed-{seed}-new" / "manifest.json").is_file()
    assert main(["compare", root / "fedavg-s0", root / "fedavg-s1", root / "fedavg-s0-new", root / "fedavg-s1-new",
                 "--out", tmp_path / "by-hand", "--format", "json"]) == 0
    by_hand = json.loads(capsys.readouterr().out)
    strip = lambda rows: [{k: v for k, v in r.items() if k != "runs"} for r in rows]  # noqa: E731
    assert strip(doc["rows"]) == strip(by_hand["rows"])
    manifest = json.loads((tmp_path / "t" / "manifest.json").read_text())
    assert manifest["config"]["spec"]["seeds"] == [0, 1]
    # again: every run is up to date, and so is the table
    assert main(["compare", "--spec", spec, "--out", tmp_path / "t", "--format", "json"]) == 0
    assert json.loads(capsys.readouterr().out)["up_to_date"] is True


@pytest.mark.parametrize("body,needle", [
    ("seeds: [0, 0]\nalgorithms: {fedavg: {}}", "seeds must be distinct"),
    ("seeds: [0]\nalgorithms: {fedavg: {}}\nrounds: 3", "unknown key 'rounds'"),
    ("seeds: [0]\nalgorithms: {fedavg: {set: {seed: 3}}}", "seed and algorithm come from the spec"),
    ("seeds: [0]\nalgorithms: {fedavg: nosuch.yaml}", "algorithms.fedavg.config 'nosuch.yaml': no such file"),
    ("seeds: [0]\nalgorithms: {local: CONFIG}", "is a config of 'fedavg'"),
    ("seeds: [0]\nalgorithms: {fedavg: {set: {rounds: -1}}}", "rounds"),
])
def test_a_bad_spec_is_one_line_and_trains_nothing(root, tmp_path, cli, body, needle):
    spec = tmp_path / "spec.yaml"
    body = body.replace("CONFIG", str(root / "fedavg-s0" / "config.yaml"))
    spec.write_text(f"partition: {root / 'part'}\nruns: {tmp_path / 'runs'}\n{body}\n")
    result = cli("compare", "--spec", spec, "--out", tmp_path / "t")
    assert result.code == 2 and needle in result.err and len(result.err.strip().splitlines()) == 1, result.err
    assert not (tmp_path / "t").exists() and not (tmp_path / "runs").exists()


def _subprocess(args, tmp_path, *, pythonpath=None):
    import os
    import subprocess
    import sys

    code = ("import sys\nfrom pfl_cli.cli.app import main\nrc = main(sys.argv[1:])\n"
            "print('TORCH' if 'torch' in sys.modules else 'NO-TORCH')\nsys.exit(rc)\n")
    env = {**os.environ, **({"PYTHONPATH": str(pythonpath)} if pythonpath else {})}
    return subprocess.run([sys.executable, "-c", code, *map(str, args)], cwd=tmp_path, env=env, capture_output=True,
                          text=True)


def test_compare_reads_files_only_never_torch(root, tmp_path):
    proc = _subprocess(["compare", root / "fedavg-s0", root / "fedavg-s0-new", "--out", tmp_path / "t",
                        "--format", "quiet"], tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip().splitlines()[-1] == "NO-TORCH"


def test_compare_plot_refused_before_any_work_without_matplotlib(root, tmp_path):
    (tmp_path / "hide").mkdir()
    (tmp_path / "hide" / "sitecustomize.py").write_text("import sys\nsys.modules['matplotlib'] = None\n")
    proc = _subprocess(["compare", root / "fedavg-s0", "--plot", "--out", tmp_path / "t"], tmp_path,
                       pythonpath=tmp_path / "hide")
    assert proc.returncode == 2 and "install the plot extra" in proc.stderr
    assert not (tmp_path / "t").exists()
