"""`pflx mdm-fit` end to end: files, schema, determinism, DP ledger, bad input."""

import json

import numpy as np
import pytest

from pfl_cli.cli.app import main


@pytest.fixture(scope="module")
def part(tmp_path_factory):
    out = tmp_path_factory.mktemp("p") / "part"
    assert main(["partition", "--dirichlet", "0.3", "--num-clients", "40", "--out", str(out), "--format", "quiet"]) == 0
    return out


def fit(out, *args):
    return main(["mdm-fit", "--out", str(out), "--format", "json", *args])


def test_fit_writes_the_design_schema_and_is_reproducible(part, tmp_path, capsys):
    assert fit(tmp_path / "a", "--partition", str(part), "--components", "1-3", "--rounds", "30") == 0
    printed = json.loads(capsys.readouterr().out)
    doc = json.loads((tmp_path / "a/mdm.json").read_text())
    k, c = doc["num_components"], doc["num_categories"]
    assert c == 10 and len(doc["tau"]) == k and np.array(doc["alpha"]).shape == (k, c)
    assert len(doc["num_samples"]["probs"]) == k and len(doc["num_samples"]["probs"][0]) == len(doc["num_samples"]["support"])
    assert doc["selection"]["candidates"] == [1, 2, 3] and len(doc["selection"]["validation_log_likelihood"]) == 3
    assert doc["selection"]["chosen"] == k == printed["num_components"]
    assert np.isfinite(doc["log_likelihood"])
    trace = (tmp_path / "a/trace.csv").read_text().splitlines()
    assert trace[0] == "components,restart,round,clients,log_likelihood,mean_log_likelihood"
    assert fit(tmp_path / "b", "--partition", str(part), "--components", "1-3", "--rounds", "30") == 0
    assert (tmp_path / "a/mdm.json").read_bytes() == (tmp_path / "b/mdm.json").read_bytes()
    assert fit(tmp_path / "a", "--partition", str(part), "--components", "1-3", "--rounds", "30") == 0
    assert json.loads(capsys.readouterr().out.splitlines()[-1])["up_to_date"] is True
    assert fit(tmp_path / "a", "--partition", str(part), "--components", "2", "--rounds", "30") == 2
    assert "--force" in capsys.readouterr().err


def test_counts_file_and_config_layering(tmp_path, capsys):
    rng = np.random.default_rng(0)
    counts = rng.multinomial(20, rng.dirichlet([1.0, 2.0, 3.0], size=200))
    np.save(tmp_path / "c.npy", counts)
    (tmp_path / "cfg.yaml").write_text("components: 1\nrounds: 5\n")
    assert fit(tmp_path / "m", "--counts", str(tmp_path / "c.npy"), "--config", str(tmp_path / "cfg.yaml"),
               "--set", "rounds=7") == 0
    manifest = json.loads((tmp_path / "m/manifest.json").read_text())
    assert manifest["stage"] == "mdm-fit" and manifest["config"]["rounds"] == 7 and manifest["config"]["components"] == 1
    assert "selection" not in json.loads((tmp_path / "m/mdm.json").read_text())


def test_binned_income_column(tmp_path, capsys):
    rng = np.random.default_rng(1)
    rows = [f"{rng.integers(30)},{v:.0f}" for v in rng.exponential(40000, size=1500)]
    (tmp_path / "income.csv").write_text("client,income\n" + "\n".join(rows) + "\n")
    assert fit(tmp_path / "m", "--counts", str(tmp_path / "income.csv"), "--bins", "5000:41", "--components", "2",
               "--rounds", "10", "--sample-bins", "5") == 0
    doc = json.loads((tmp_path / "m/mdm.json").read_text())
    assert doc["num_categories"] == 41 and doc["num_samples"]["kind"] == "binned"


def test_dp_noise_is_secure_by_default_and_repeatable_only_when_seeded(part, tmp_path, capsys):
    """Issue 21: two --dp fits with one seed release different parameters unless noise=seeded."""
    args = ["--partition", str(part), "--components", "2", "--rounds", "3", "--max-samples", "400", "--seed", "4"]
    released = {}
    for mode in ("secure", "seeded"):
        for i in range(2):
            out = tmp_path / f"{mode}{i}"
            spec = "eps=2,delta=1e-6" + (",noise=seeded" if mode == "seeded" else "")
            capsys.readouterr()
            assert fit(out, *args, "--dp", spec, "--format", "human") == 0
            assert f"noise={mode}" in capsys.readouterr().out
            assert json.loads((out / "privacy.json").read_text())["noise"] == mode
            released[mode, i] = (out / "mdm.json").read_bytes()
    assert released["secure", 0] != released["secure", 1]
    assert released["seeded", 0] == released["seeded", 1]


def test_dp_writes_a_privacy_ledger(part, tmp_path, capsys):
    assert fit(tmp_path / "d", "--partition", str(part), "--components", "2", "--rounds", "5", "--max-samples", "400",
               "--dp", "eps=2,delta=1e-6") == 0
    privacy = json.loads((tmp_path / "d/privacy.json").read_text())
    assert privacy["unit"] == "client" and privacy["epsilon"] <= 2.0 and privacy["events"]
    doc = json.loads((tmp_path / "d/mdm.json").read_text())
    assert "log_likelihood" not in doc and "num_clients" not in doc and doc["dp"]["noise_multiplier"] > 0
    assert doc["num_samples"]["support"][-1] == 400 and doc["dp"]["clip"] == 400.0   # the public M
    assert sorted(p.name for p in (tmp_path / "d").iterdir()) == ["manifest.json", "mdm.json", "privacy.json"]
    assert main(["privacy-account", str(tmp_path / "d"), "--format", "json"]) == 0


@pytest.mark.parametrize(
    "make, args, message",
    [
        (lambda d: np.save(d / "x.npy", np.array([[1, -1], [2, 2]])), ["--counts", "{d}/x.npy"], "must be >= 0"),
        (lambda d: np.save(d / "x.npy", np.array([[1.5, 1.0]])), ["--counts", "{d}/x.npy"], "whole counts"),
        (lambda d: np.save(d / "x.npy", np.array([[1, 2], [2, 1]])), ["--counts", "{d}/x.npy", "--components", "3"],
         "needs at least 3 clients"),
        (lambda d: None, ["--counts", "{d}/missing.csv"], "no such file"),
        (lambda d: None, [], "give exactly one input"),
        (lambda d: None, ["--partition", "{d}"], "not a pflx artifact"),
        (lambda d: np.save(d / "x.npy", np.ones((9, 2), dtype=int)), ["--counts", "{d}/x.npy", "--components", "x"],
         "components must be"),
        (lambda d: np.save(d / "x.npy", np.ones((9, 2), dtype=int)), ["--counts", "{d}/x.npy", "--dp", "eps=1"],
         "--dp needs a fixed --components K"),
    ],
    ids=["negative", "fraction", "few-clients", "missing", "no-input", "not-artifact", "bad-k", "dp-auto"],
)
def test_bad_input_is_one_line_exit_2(tmp_path, capsys, make, args, message):
    make(tmp_path)
    code = fit(tmp_path / "out", *[a.format(d=tmp_path) for a in args])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and message in err[-1] and err[-1].startswith("pflx: error:")
    assert not (tmp_path / "out").exists()


def test_wrong_stage_artifact(part, tmp_path, capsys):
    assert fit(tmp_path / "m", "--partition", str(part), "--components", "1", "--rounds", "2") == 0
    assert fit(tmp_path / "x", "--partition", str(tmp_path / "m")) == 2
    assert "expected a 'partition' artifact, found stage 'mdm-fit'" in capsys.readouterr().err


def test_zero_sample_clients_are_skipped_and_counted(tmp_path, capsys):
    np.savetxt(tmp_path / "c.csv", np.array([[3, 1], [0, 0], [2, 2], [1, 3]]), delimiter=",", fmt="%d")
    assert fit(tmp_path / "m", "--counts", str(tmp_path / "c.csv"), "--components", "1", "--rounds", "3") == 0
    assert "skipped 1 of 4 clients with zero samples" in capsys.readouterr().err
    assert json.loads((tmp_path / "m/mdm.json").read_text())["skipped_empty_clients"] == 1


def test_plot(part, tmp_path, capsys):
    assert fit(tmp_path / "m", "--partition", str(part), "--components", "2", "--rounds", "5", "--plot") == 0
    assert (tmp_path / "m/mdm.png").read_bytes()[:4] == b"\x89PNG"
