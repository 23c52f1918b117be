"""`pflx cluster` end to end, through the error boundary, on real directories."""

import json

import numpy as np
import pytest

from pfl_cli.cli.app import main

CLIENTS = "gmm:clients?d=20&k=4&num_clients=12&client_size=150&seed=1"
SERVER = "gmm:server?d=20&k=4&seed=1"


@pytest.fixture(scope="module")
def part(tmp_path_factory):
    out = tmp_path_factory.mktemp("cl") / "part"
    code = main(["partition", "--dataset", CLIENTS, "--natural-id", "--test-fraction", "0", "--num-clients", "12",
                 "--out", str(out), "--format", "quiet"])
    assert code == 0
    return out


def _cluster(part, out, *extra):
    return main(["cluster", "--partition", str(part), "--server-data", SERVER, "--k", "4", "--out", str(out),
                 "--format", "json", *extra])


def test_cluster_writes_centers_metrics_and_a_ledger_within_budget(part, tmp_path, capsys):
    assert _cluster(part, tmp_path / "km", "--dp", "eps=1,delta=1e-6", "--k-candidates", "1-6",
                    "--write-nonprivate") == 0
    result = json.loads(capsys.readouterr().out)
    files = {p.name for p in (tmp_path / "km").iterdir()}
    assert files == {"centers.npy", "metrics.json", "privacy.json", "manifest.json", "k_selection.png",
                     "nonprivate.json"}
    assert np.load(tmp_path / "km" / "centers.npy").shape == (4, 20)
    metrics = json.loads((tmp_path / "km" / "metrics.json").read_text())
    assert metrics["k_selection"]["projection_dim"] == 4 and "num_clients" not in metrics
    assert "kmeans_cost" not in metrics and "normalized_cost" not in result
    private = json.loads((tmp_path / "km" / "nonprivate.json").read_text())
    for key in ("kmeans_cost", "normalized_cost", "centralized_kmeans_cost", "num_points", "clipped_fraction"):
        assert key in private
    assert private["num_points"] == 12 * 150 and private["num_clients"] == 12
    assert private["normalized_cost"] >= private["centralized_normalized_cost"]
    ledger = json.loads((tmp_path / "km" / "privacy.json").read_text())
    assert ledger["unit"] == "example" and ledger["delta"] == 1e-6 and 0.99 < ledger["epsilon"] <= 1.0
    assert len(ledger["events"]) == 4 and result["epsilon"] == ledger["epsilon"]


def test_rerun_is_a_noop_and_output_is_byte_identical(part, tmp_path, capsys):
    args = ("--no-dp", "--init", "server-lloyds", "--seed", "3")
    assert _cluster(part, tmp_path / "a", *args) == 0
    assert _cluster(part, tmp_path / "a", *args) == 0
    assert json.loads(capsys.readouterr().out.splitlines()[-1])["up_to_date"] is True


def test_dp_rerun_recomputes_the_same_bytes_without_force(part, tmp_path, capsys):
    # A DP manifest withholds the private input's hash, so a rerun cannot prove the input is
    # unchanged: it recomputes, and under noise=seeded the same seed gives the same bytes.
    args = ("--dp", "eps=0.5,noise=seeded", "--lloyds-steps", "1", "--seed", "3")
    assert _cluster(part, tmp_path / "a", *args) == 0
    first = {n: (tmp_path / "a" / n).read_bytes() for n in ("centers.npy", "metrics.json", "privacy.json")}
    assert _cluster(part, tmp_path / "a", *args) == 0
    assert json.loads(capsys.readouterr().out.splitlines()[-1])["up_to_date"] is False
    assert _cluster(part, tmp_path / "b", *args) == 0
    for name, data in first.items():
        assert (tmp_path / "a" / name).read_bytes() == data == (tmp_path / "b" / name).read_bytes()
    assert json.loads(first["privacy.json"])["noise"] == "seeded"
    # privacy-account passes the warning on: that epsilon holds only inside the simulation.
    capsys.readouterr()
    assert main(["privacy-account", str(tmp_path / "a"), "--format", "json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["noise"] == "seeded" and "simulation only: the noise can be rebuilt" in doc["noise_statement"]


def test_secure_dp_runs_with_one_seed_release_different_centers(part, tmp_path, capsys):
    """The default noise=secure draws from OS entropy, so the seed does not decide the released centers."""
    args = ("--dp", "eps=0.5", "--lloyds-steps", "1", "--seed", "3", "--format", "human")
    for name in ("a", "b"):
        capsys.readouterr()
        assert _cluster(part, tmp_path / name, *args) == 0
        assert "noise=secure" in capsys.readouterr().out
    a, b = (np.load(tmp_path / n / "centers.npy") for n in "ab")
    assert not np.array_equal(a, b)
    assert json.loads((tmp_path / "a" / "privacy.json").read_text())["noise"] == "secure"


@pytest.mark.parametrize("extra", [
    ("--no-dp", "--init", "kfed"),
    ("--dp", "eps=2", "--privacy-unit", "client", "--client-clip", "sums=5"),
    ("--dp", "eps=1", "--init", "server-lloyds", "--lloyds-calibration", "pld_joint"),
], ids=["kfed", "client-level", "baseline"])
def test_variants_run(part, tmp_path, capsys, extra):
    assert _cluster(part, tmp_path / "v", *extra) == 0
    metrics = json.loads((tmp_path / "v" / "metrics.json").read_text())
    if "--no-dp" in extra:
        assert metrics["epsilon"] is None and not (tmp_path / "v" / "privacy.json").exists()
    else:
        assert metrics["epsilon"] <= float(extra[1].split("=")[1])


@pytest.mark.parametrize("extra,message", [
    (("--dp", "eps=1", "--k", "1000"), "k must be <= the number of server points"),
    (("--dp", "eps=0"), "--dp eps must be > 0"),
    (("--dp", "eps=-1"), "--dp eps must be > 0"),
    (("--dp", "eps=1,delta=1.5"), "delta must be in the open interval"),
    (("--dp", "eps=1,delta=0"), "delta must be in the open interval"),
    (("--dp", "eps=1,delta=1e-3,population=5000"), "--dp delta must be < 1/population"),
    (("--dp", "eps=1", "--radius", "0"), "radius must be"),
    (("--dp", "eps=1", "--radius", "-2"), "radius must be"),
    (("--dp", "eps=1", "--privacy-unit", "client", "--client-clip", "sums=0"), "client clip sums must be > 0"),
    (("--dp", "delta=1e-6"), "--dp needs eps=E"),
    (("--no-dp", "--write-nonprivate"), "--write-nonprivate only applies with --dp"),
    ((), "pass a privacy budget"),
    (("--dp", "eps=1", "--no-dp"), "exclude each other"),
    (("--dp", "eps=1", "--server-data", "gmm:server?d=7&k=4&seed=1"), "server data dimension must equal"),
])
def test_bad_input_is_one_line_and_exit_2(part, tmp_path, capsys, extra, message):
    assert _cluster(part, tmp_path / "bad", *extra) == 2
    err = capsys.readouterr().err
    assert message in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "bad").exists()


def test_partition_without_features_is_refused(tmp_path, capsys):
    np.savez(tmp_path / "nofeat.npz", x=np.zeros((40, 0)), y=np.arange(40) % 2)
    assert main(["partition", "--dataset", f"npz:{tmp_path / 'nofeat.npz'}", "--num-clients", "4",
                 "--out", str(tmp_path / "p"), "--format", "quiet"]) == 0
    code = main(["cluster", "--partition", str(tmp_path / "p"), "--server-data", SERVER, "--k", "2",
                 "--dp", "eps=1", "--out", str(tmp_path / "km")])
    assert code == 2 and "no features" in capsys.readouterr().err


def test_privacy_account_prints_the_stage_own_epsilon(part, tmp_path, capsys):
    """Issue 21: cluster states its epsilon by PLD; privacy-account of the artifact prints that one by default."""
    out = tmp_path / "km"
    assert _cluster(part, out, "--dp", "eps=1") == 0
    claimed = json.loads((out / "privacy.json").read_text())
    assert claimed["accountant"] == "pld" and claimed["epsilon"] <= 1.0
    capsys.readouterr()
    assert main(["privacy-account", str(out), "--format", "json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["accountant"] == "pld" and doc["epsilon"] == pytest.approx(claimed["epsilon"], rel=1e-9)
    assert "the one " + str(out) + " calibrated with" in doc["statement"]
    # Forcing the looser RDP accountant prints a larger epsilon, and a line that says why.
    assert main(["privacy-account", str(out), "--accountant", "rdp", "--format", "json"]) == 0
    rdp = json.loads(capsys.readouterr().out)
    assert rdp["epsilon"] > claimed["epsilon"]
    assert f"above the {claimed['epsilon']:.4g} that {out} states by the PLD accountant" in rdp["statement"]
