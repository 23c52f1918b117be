"""`pflx privacy-account` end to end: the four directions, JSON fields, exact errors."""

from __future__ import annotations

import json

import dp_accounting as dpa
import pytest
from dp_accounting import rdp

from pfl_cli.artifacts import ArtifactWriter, read_artifact
from pfl_cli.privacy import PrivacyLedger, sampled_gaussian_event


def _rdp(event, delta):
    return rdp.RdpAccountant().compose(event).get_epsilon(delta)


def _ledger_dir(path, doc, stage="mdm-fit"):
    with ArtifactWriter(path, stage=stage, config={}, seed=0, argv=["pflx", stage]) as writer:
        if doc is not None:
            writer.save_json("privacy.json", doc)
    return path


def _json(run):
    assert run.code == 0, run.err
    return json.loads(run.out)


def test_epsilon_from_noise_matches_dp_accounting(cli):
    doc = _json(cli("privacy-account", "-z", "0.9", "-q", "0.02", "--steps", "700", "--delta", "1e-6", "--format", "json"))
    event = sampled_gaussian_event(0.9, 0.02, 700)
    assert doc["direction"] == "epsilon" and doc["accountant"] == "rdp"
    assert doc["epsilon"] == pytest.approx(_rdp(event, 1e-6), rel=1e-12)
    assert doc["events"] == [json.loads(json.dumps(doc["events"][0]))] and doc["events"][0]["count"] == 700
    assert doc["delta"] == 1e-6 and doc["unit"] == "example" and doc["neighboring"] == "add-remove"


def test_population_cohort_and_rounds_alias(cli):
    doc = _json(cli("privacy-account", "-z", "1.0", "--population", "5000", "--cohort-size", "50", "--rounds", "300",
                    "--delta", "1e-6", "--unit", "client", "--format", "json"))
    assert doc["sampling_rate"] == 0.01 and doc["steps"] == 300
    assert doc["epsilon"] == pytest.approx(_rdp(sampled_gaussian_event(1.0, 0.01, 300), 1e-6), rel=1e-12)
    assert "for each client (all data of one client)" in doc["statement"]
    assert "rate 0.01 = 50/5000" in doc["statement"]


def test_noise_from_epsilon_never_above_target(cli):
    doc = _json(cli("privacy-account", "--epsilon", "2", "-q", "0.01", "--steps", "1000", "--delta", "1e-5", "--format", "json"))
    assert doc["direction"] == "noise" and doc["target_epsilon"] == 2.0
    z = doc["noise_multiplier"]
    assert 1.998 <= _rdp(sampled_gaussian_event(z, 0.01, 1000), 1e-5) <= 2.0


def test_steps_from_epsilon_and_noise(cli):
    doc = _json(cli("privacy-account", "--epsilon", "1", "-z", "1.5", "-q", "0.01", "--delta", "1e-5", "--format", "json"))
    t = doc["steps"]
    assert doc["direction"] == "steps" and doc["epsilon"] <= 1.0
    assert _rdp(sampled_gaussian_event(1.5, 0.01, t), 1e-5) <= 1.0 < _rdp(sampled_gaussian_event(1.5, 0.01, t + 1), 1e-5)


def test_all_accountants_side_by_side(cli):
    doc = _json(cli("privacy-account", "-z", "2", "--steps", "3", "--delta", "1e-5", "--accountant", "all", "--format", "json"))
    assert set(doc["by_accountant"]) == {"rdp", "pld"}
    assert doc["tighter"] == "pld" and doc["accountant"] == "pld"
    assert doc["by_accountant"]["pld"]["epsilon"] < doc["by_accountant"]["rdp"]["epsilon"]
    human = cli("privacy-account", "-z", "2", "--steps", "3", "--delta", "1e-5", "--accountant", "all")
    assert human.code == 0 and "Tighter: pld." in human.out


def test_human_statement(cli):
    run = cli("privacy-account", "-z", "1.1", "-q", "0.01", "--steps", "1000", "--delta", "1e-5")
    assert run.code == 0 and run.err == ""
    assert run.out.startswith("The result is (epsilon = 1.712, delta = 1e-05)-DP for each example (one data point)")
    assert "Poisson sample with rate 0.01" in run.out and "adding or removing one example" in run.out


def test_composition_of_two_artifacts(cli, tmp_path):
    a = PrivacyLedger("client", 1e-6, (sampled_gaussian_event(1.2, 0.05, 40),), notes=("mdm-fit rounds",))
    b = PrivacyLedger("client", 1e-6, (dpa.GaussianDpEvent(4.0), dpa.LaplaceDpEvent(5.0)), notes=("cluster init",))
    mdm = _ledger_dir(tmp_path / "mdm", a.to_dict("rdp"))
    km = _ledger_dir(tmp_path / "km", b.to_dict("rdp"), stage="cluster")
    doc = _json(cli("privacy-account", mdm, km, "--accountant", "rdp", "--format", "json"))
    both = PrivacyLedger("client", 1e-6, a.events + b.events)
    assert doc["direction"] == "compose" and doc["unit"] == "client" and doc["delta"] == 1e-6
    assert doc["epsilon"] == pytest.approx(both.epsilon("rdp"), rel=1e-12)
    assert doc["epsilon"] == pytest.approx(_rdp(dpa.ComposedDpEvent(list(both.events)), 1e-6), rel=1e-12)
    assert len(doc["events"]) == 3 and doc["notes"] == ["mdm-fit rounds", "cluster init"]
    # By default a composition takes the tightest valid accountant, and says so.
    auto = cli("privacy-account", mdm, km)
    tight = min(both.epsilon("rdp"), both.epsilon("pld"))
    assert f"epsilon = {tight:.4g}," in auto.out and "the tightest valid one of rdp and pld" in auto.out


def test_out_writes_a_composable_ledger(cli, tmp_path):
    out = tmp_path / "acct"
    first = _json(cli("privacy-account", "-z", "1.1", "-q", "0.01", "--steps", "100", "--delta", "1e-5", "--out", out,
                      "--format", "json"))
    art = read_artifact(out, "privacy-account")
    stored = json.loads(art.file("privacy.json").read_text())
    assert stored["epsilon"] == first["epsilon"] and stored["accountant"] == "rdp"
    again = _json(cli("privacy-account", out, "--format", "json"))
    assert again["epsilon"] == first["epsilon"]


def _bad(cli, *args):
    run = cli("privacy-account", *args)
    assert run.code == 2 and run.out == ""
    assert run.err.count("\n") == 1 and run.err.startswith("pflx: error: ")
    return run.err[len("pflx: error: "):].rstrip("\n")


@pytest.mark.parametrize(
    "args, message",
    [
        (["-z", "1", "-q", "1.5", "--delta", "1e-5"], "--sampling-rate must be in (0, 1]; got 1.5."),
        (["-z", "1", "-q", "0", "--delta", "1e-5"], "--sampling-rate must be in (0, 1]; got 0.0."),
        (["-z", "0", "--delta", "1e-5"], "--noise-multiplier must be > 0; got 0.0."),
        (["-z", "-2", "--delta", "1e-5"], "--noise-multiplier must be > 0; got -2.0."),
        (["-z", "1", "--delta", "1"], "--delta must be in the open interval (0, 1); got 1.0."),
        (["-z", "1", "--delta", "0"], "--delta must be in the open interval (0, 1); got 0.0."),
        (["--epsilon", "0", "--delta", "1e-5"], "--epsilon must be > 0; got 0.0."),
        (["--epsilon", "-1", "--delta", "1e-5"], "--epsilon must be > 0; got -1.0."),
        (["-z", "1"], "--delta is required (e.g. --delta 1e-5; it should be well below 1/population)."),
        (["--epsilon", "1", "-z", "1", "--steps", "5", "--delta", "1e-5"],
         "--epsilon, --noise-multiplier and --steps all given: give two of them and pflx computes the third."),
        (["-z", "1", "--population", "100", "--delta", "1e-5"],
         "--population and --cohort-size go together (sampling rate = cohort / population); give both."),
        (["--epsilon", "1e-6", "--steps", "100000", "--delta", "1e-10", "--max-noise", "100"],
         "no noise multiplier up to 100 meets epsilon 1e-06 at delta 1e-10 (epsilon at noise 100 is 25.54). Raise the "
         "epsilon or delta, lower the steps or the sampling rate, or raise --max-noise."),
        (["--epsilon", "0.01", "-z", "0.5", "--delta", "1e-5"],
         "not even one step meets epsilon 0.01 at delta 1e-05 (one step costs epsilon 10.73). Raise the noise "
         "multiplier or the epsilon, or lower the sampling rate."),
    ],
    ids=["rate-high", "rate-zero", "noise-zero", "noise-neg", "delta-one", "delta-zero", "eps-zero", "eps-neg",
         "no-delta", "all-three", "population-alone", "no-noise-fits", "no-step-fits"],
)
def test_bad_input_is_one_line_exit_2(cli, args, message):
    assert _bad(cli, *args) == message


def test_directory_without_privacy_json(cli, tmp_path):
    d = _ledger_dir(tmp_path / "plain", None, stage="cluster")
    assert _bad(cli, d) == (
        f"ledger {d}: no privacy.json; this 'cluster' run was not differentially private "
        "(ledgers are written by mdm-fit --dp, cluster --dp and DP train)."
    )


def test_unknown_event_type(cli, tmp_path):
    doc = {"unit": "example", "delta": 1e-6, "epsilon": 1.0, "accountant": "rdp", "neighboring": "add-remove",
           "events": [{"type": "QuantumDpEvent", "qubits": 3}], "notes": []}
    d = _ledger_dir(tmp_path / "odd", doc)
    assert _bad(cli, d).startswith(f"{d}/privacy.json: events[0]: unknown event type 'QuantumDpEvent'")


def test_mismatched_delta(cli, tmp_path):
    a = _ledger_dir(tmp_path / "a", PrivacyLedger("example", 1e-6, (dpa.GaussianDpEvent(3.0),)).to_dict("rdp"))
    b = _ledger_dir(tmp_path / "b", PrivacyLedger("example", 1e-5, (dpa.GaussianDpEvent(3.0),)).to_dict("rdp"))
    assert _bad(cli, a, b) == (
        f"mismatched delta: {a} states its guarantee at delta 1e-06 but {b} at 1e-05. Re-run the stages with one "
        "delta before composing their ledgers."
    )
    assert _bad(cli, a, "--delta", "1e-5") == (
        "mismatched delta: --delta 1e-05 but the ledgers state delta 1e-06. Drop --delta or pass the ledgers' delta."
    )


def test_different_privacy_units_are_refused(cli, tmp_path):
    a = _ledger_dir(tmp_path / "a", PrivacyLedger("example", 1e-6, (dpa.GaussianDpEvent(3.0),)).to_dict("rdp"))
    b = _ledger_dir(tmp_path / "b", PrivacyLedger("client", 1e-6, (dpa.GaussianDpEvent(3.0),)).to_dict("rdp"))
    assert _bad(cli, a, b) == (
        f"cannot compose {a} (example-level) with {b} (client-level): they protect different units (one data point "
        "vs all data of one client), so their epsilons do not add up to either guarantee. Account them separately."
    )


def test_mechanism_flags_with_ledgers_are_refused(cli, tmp_path):
    a = _ledger_dir(tmp_path / "a", PrivacyLedger("example", 1e-6, (dpa.GaussianDpEvent(3.0),)).to_dict("rdp"))
    assert _bad(cli, a, "-z", "1") == (
        "--noise-multiplier does not apply when composing ledgers: pass either artifact directories or mechanism "
        "flags, not both."
    )


def test_config_file_then_flags_then_set(cli, tmp_path):
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text("privacy-account:\n  delta: 1e-5\n  noise_multiplier: 3\n  steps: 2\n  unit: client\n")
    doc = _json(cli("privacy-account", "--config", recipe, "--steps", "3", "--set", "noise_multiplier=4", "--format", "json"))
    assert (doc["delta"], doc["noise_multiplier"], doc["steps"], doc["unit"]) == (1e-5, 4.0, 3, "client")
    assert doc["sampling_rate"] is None and doc["events"][0]["event"] == {"type": "GaussianDpEvent", "noise_multiplier": 4.0}


def test_composition_side_by_side(cli, tmp_path):
    ledger = PrivacyLedger("example", 1e-6, (dpa.GaussianDpEvent(4.0), dpa.LaplaceDpEvent(5.0)))
    a = _ledger_dir(tmp_path / "a", ledger.to_dict("rdp"))
    doc = _json(cli("privacy-account", a, "--accountant", "all", "--format", "json"))
    assert doc["by_accountant"]["pld"]["epsilon"] == pytest.approx(ledger.epsilon("pld"), rel=1e-12)
    assert doc["tighter"] == "pld" and doc["epsilon"] == doc["by_accountant"]["pld"]["epsilon"]
