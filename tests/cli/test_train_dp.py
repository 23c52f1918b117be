"""`pflx train --dp` end to end: the DP artifact against the release contract, the ledger, composition, bad input."""

import json

import numpy as np
import pytest
import torch
from dp_accounting import dp_event, rdp

from pfl_cli.artifacts import MECHANISM, NONPRIVATE, POST_PROCESSING, load_partition, release_contract_violations
from pfl_cli.cli.app import main as _main
from pflx_testing import cli_args


def main(argv):
    """pflx; a train command gets the shared small settings only where its algorithm takes them."""
    argv = [str(a) for a in argv]
    return _main(cli_args(argv) if argv[:1] == ["train"] else argv)

FAST = ["--rounds", "6", "--eval-every", "3", "--local-steps", "3", "--clients-per-round", "4",
        "--set", "hyper_hidden=16", "--set", "mlp_hidden=[16]", "--set", "normalize=false"]
DP = ["--dp", "eps=4,delta=1e-6,clip=0.5,population=1000"]
PER_ALGORITHM = {"fedavg": [], "pefll": ["--no-standardize-descriptor", "--embed-dim", "4"]}


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    root = tmp_path_factory.mktemp("train-dp")
    assert main(["partition", "--dataset", "builtin:digits", "--dirichlet", "0.5", "--num-clients", "27",
                 "--holdout-clients", "4", "--test-fraction", "0.3", "--out", str(root / "part"),
                 "--format", "quiet"]) == 0
    return root


def train(root, out, *extra):
    return main(["train", "--partition", str(root / "part"), "--out", str(out), "--format", "json", *FAST, *extra])


def _private_values(root) -> list[float]:
    """Exact counts of the private partition that no released file may contain."""
    part, _, _ = load_partition(root / "part")
    sizes = part.train_sizes[part.role == 0]
    return [float(sizes.sum()), float(part.test_sizes.sum()), 23.0, 27.0]  # samples, train clients, clients
    # (counts chosen unlike any public config value: new_client_epochs is 20)


@pytest.mark.parametrize("algorithm", list(PER_ALGORITHM))
def test_dp_artifact_holds_only_released_files(root, algorithm, capsys):
    out = root / f"{algorithm}-dp"
    capsys.readouterr()
    assert train(root, out, "--algorithm", algorithm, *DP, *PER_ALGORITHM[algorithm]) == 0
    printed = json.loads(capsys.readouterr().out)
    assert "train" not in printed and "accuracy" not in json.dumps(printed)  # no accuracy on stdout either
    manifest = json.loads((out / "manifest.json").read_text())
    classes = {o["path"]: o["release"] for o in manifest["outputs"]}
    assert classes == {"config.yaml": POST_PROCESSING, "model.pt": MECHANISM, "privacy.json": POST_PROCESSING,
                       "metrics.json": POST_PROCESSING}
    assert release_contract_violations(out, private_values=_private_values(root)) == []
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["selection"] == "last" and metrics["dp"]["rounds"] == 6
    assert not {"train", "holdout", "val", "best_round"} & set(metrics)
    ledger = json.loads((out / "privacy.json").read_text())
    assert ledger["unit"] == "client" and ledger["delta"] == 1e-6 and ledger["epsilon"] <= 4.0
    (event,) = ledger["events"]
    assert event["type"] == "SelfComposedDpEvent" and event["count"] == 6
    assert event["event"]["sampling_probability"] == pytest.approx(4 / 1000)  # clients_per_round / public bound
    assert metrics["dp"]["denominator"] == pytest.approx(4.0)
    model = torch.load(out / "model.pt", weights_only=True)
    assert float(model["normalization"]["mean"].abs().max()) == 0.0  # no private input statistics


def test_write_nonprivate_adds_only_nonprivate_files(root):
    out = root / "fedavg-np"
    assert train(root, out, "--algorithm", "fedavg", *DP, "--write-nonprivate") == 0
    manifest = json.loads((out / "manifest.json").read_text())
    extra = {o["path"]: o["release"] for o in manifest["outputs"]} .items() - {
        ("config.yaml", POST_PROCESSING), ("model.pt", MECHANISM), ("privacy.json", POST_PROCESSING),
        ("metrics.json", POST_PROCESSING)}
    assert dict(extra) == {"nonprivate.json": NONPRIVATE, "nonprivate-metrics.csv": NONPRIVATE,
                           "nonprivate-clients.csv": NONPRIVATE}
    assert release_contract_violations(out, private_values=_private_values(root)) == []
    diag = json.loads((out / "nonprivate.json").read_text())
    assert 0.0 <= diag["holdout"]["mean_accuracy"] <= 1.0
    # The released model is the same with or without the diagnostics.
    assert (out / "model.pt").read_bytes() == (root / "fedavg-dp" / "model.pt").read_bytes()


def test_privacy_account_composes_train_and_mdm_ledgers(root, capsys):
    assert main(["mdm-fit", "--partition", str(root / "part"), "--components", "1", "--rounds", "3",
                 "--max-samples", "200", "--dp", "eps=1,delta=1e-6", "--out", str(root / "mdm"), "--format", "quiet"]) == 0
    capsys.readouterr()
    assert main(["privacy-account", str(root / "fedavg-dp"), str(root / "mdm"), "--format", "json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    events = []
    for name in ("fedavg-dp", "mdm"):
        from pfl_cli.privacy import event_from_dict

        events += [event_from_dict(e) for e in json.loads((root / name / "privacy.json").read_text())["events"]]
    acc = rdp.RdpAccountant()
    acc.compose(dp_event.ComposedDpEvent(events))
    assert doc["unit"] == "client" and len(doc["events"]) == len(events) >= 2
    assert doc["epsilon"] == pytest.approx(acc.get_epsilon(1e-6), rel=1e-9)
    assert doc["epsilon"] > 4.0  # more than the train ledger alone


@pytest.mark.parametrize("extra, message", [
    (["--dp", "eps=0,clip=1,population=100"], "--dp eps must be > 0"),
    (["--dp", "eps=-1,clip=1,population=100"], "--dp eps must be > 0"),
    (["--dp", "eps=4,delta=0.06,clip=1,population=20"], "--dp delta must be < 1/population = 0.05"),
    (["--dp", "eps=4,clip=0,population=100"], "--dp clip must be > 0"),
    (["--dp", "eps=4,clip=-2,population=100"], "--dp clip must be > 0"),
    (["--dp", "eps=4,population=100"], "--dp needs clip=C, the public L2 bound"),
    (["--dp", "eps=4,clip=1"], "give a public bound, e.g. --dp eps=4,clip=1,population=1000"),
    (["--dp", "eps=4,clip=1,population=100", "--algorithm", "local"], "--dp is not supported by algorithm 'local'"),
    (["--dp", "eps=4,clip=1,population=100", "--set", "normalize=true"], "pass --set normalize=false with --dp"),
    (["--dp", "eps=4,clip=1,population=100", "--algorithm", "pefll"], "pass --no-standardize-descriptor with --dp"),
    (["--dp", "eps=4,clip=1,population=100", "--algorithm", "pefll", "--no-standardize-descriptor"],
     "give it with --dp, e.g. --embed-dim 8"),
    (["--dp", "rho=4"], "--dp takes eps=E"),
    (["--write-nonprivate"], "--write-nonprivate only applies with --dp"),
], ids=["eps0", "eps-neg", "delta-big", "clip0", "clip-neg", "no-clip", "no-population", "local", "normalize",
        "standardize", "embed-dim", "bad-key", "np-without-dp"])
def test_bad_dp_input_is_one_line_exit_2_and_no_artifact(root, capsys, extra, message):
    out = root / "bad"
    capsys.readouterr()
    assert train(root, out, "--algorithm", "fedavg", *extra) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and len(err.splitlines()) == 1, err
    assert not out.exists()
    assert not any(p.name.startswith(".bad") for p in root.iterdir())


def test_dp_run_is_deterministic_and_noise_depends_on_the_seed(root):
    a, b, c = root / "det-a", root / "det-b", root / "det-c"
    for out, seed in ((a, "0"), (b, "0"), (c, "1")):
        assert train(root, out, "--algorithm", "fedavg", *DP, "--seed", seed) == 0
    assert (a / "model.pt").read_bytes() == (b / "model.pt").read_bytes()
    wa = torch.load(a / "model.pt", weights_only=True)["weights"]["client"]
    wc = torch.load(c / "model.pt", weights_only=True)["weights"]["client"]
    assert not all(torch.equal(wa[k], wc[k]) for k in wa)
    assert np.isfinite(np.concatenate([v.numpy().ravel() for v in wa.values()])).all()


LDP = ["--dp", "eps=4,delta=1e-5,clip=0.5,population=10000", "--set", "dp_sampling_rate=0.25", "--batch-size", "8"]


@pytest.mark.parametrize("algorithm", ["ldp-fedavg", "ppsgd", "centaur"])
def test_local_dp_baselines_end_to_end(root, algorithm, capsys):
    out = root / algorithm
    assert train(root, out, "--algorithm", algorithm, *LDP) == 0
    assert release_contract_violations(out, private_values=_private_values(root)) == []
    ledger = json.loads((out / "privacy.json").read_text())
    (event,) = ledger["events"]
    assert ledger["unit"] == "example" and ledger["delta"] == 1e-5 and ledger["epsilon"] <= 4.0
    assert event["count"] == 6 * 3 and event["event"]["sampling_probability"] == 0.25  # rounds x local steps
    # New clients get models through predict, by the algorithm's own protocol.
    capsys.readouterr()
    assert main(["predict", "--model", str(out), "--partition", str(root / "part"), "--out", str(root / f"{algorithm}-pred"),
                 "--format", "json"]) == 0
    pred = json.loads((root / f"{algorithm}-pred" / "metrics.json").read_text())
    assert pred["num_clients"] == 4 and 0.0 <= pred["mean_accuracy"] <= 1.0


@pytest.mark.parametrize("extra, message", [
    (["--algorithm", "ppsgd"], "algorithm 'ppsgd' is a local-DP algorithm and needs --dp"),
    (["--algorithm", "centaur", "--dp", "eps=4,delta=1e-5,clip=1"], "need --set dp_sampling_rate=Q"),
    (["--algorithm", "ldp-fedavg", *LDP[:1], "eps=4,delta=0.1,clip=1,population=50", *LDP[2:]],
     "delta must be < 1/population"),
], ids=["no-dp", "no-rate", "delta"])
def test_bad_local_dp_input(root, capsys, extra, message):
    capsys.readouterr()
    assert train(root, root / "bad-ldp", *extra) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and len(err.splitlines()) == 1, err
    assert not (root / "bad-ldp").exists()
