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
SEEDED = ["--dp", "eps=4,delta=1e-6,clip=0.5,population=1000,noise=seeded"]  # repeatable: simulation only
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
    assert train(root, out, "--algorithm", "fedavg", *SEEDED, "--write-nonprivate") == 0
    manifest = json.loads((out / "manifest.json").read_text())
    extra = {o["path"]: o["release"] for o in manifest["outputs"]} .items() - {
        ("config.yaml", POST_PROCESSING), ("model.pt", MECHANISM), ("privacy.json", POST_PROCESSING),
        ("metrics.json", POST_PROCESSING)}
    assert dict(extra) == {"nonprivate.json": NONPRIVATE, "nonprivate-metrics.csv": NONPRIVATE,
                           "nonprivate-clients.csv": NONPRIVATE}
    assert release_contract_violations(out, private_values=_private_values(root)) == []
    diag = json.loads((out / "nonprivate.json").read_text())
    assert 0.0 <= diag["holdout"]["mean_accuracy"] <= 1.0
    # The released model is the same with or without the diagnostics (seeded noise, so comparable).
    assert train(root, root / "fedavg-seeded", "--algorithm", "fedavg", *SEEDED) == 0
    assert (out / "model.pt").read_bytes() == (root / "fedavg-seeded" / "model.pt").read_bytes()


def test_privacy_account_composes_train_and_mdm_ledgers(root, capsys):
    assert main(["mdm-fit", "--partition", str(root / "part"), "--components", "1", "--rounds", "3",
                 "--max-samples", "200", "--dp", "eps=1,delta=1e-6", "--out", str(root / "mdm"), "--format", "quiet"]) == 0
    capsys.readouterr()
    assert main(["privacy-account", str(root / "fedavg-dp"), str(root / "mdm"), "--accountant", "rdp",
                 "--format", "json"]) == 0
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
    # One ledger alone: privacy-account prints the stage's own epsilon, by the accountant it calibrated with.
    for name in ("fedavg-dp", "mdm"):
        claimed = json.loads((root / name / "privacy.json").read_text())
        assert main(["privacy-account", str(root / name), "--format", "json"]) == 0
        own = json.loads(capsys.readouterr().out)
        assert own["accountant"] == claimed["accountant"] and own["epsilon"] == pytest.approx(claimed["epsilon"],
                                                                                              rel=1e-9)


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
    (["--dp", "eps=4,clip=1,population=100,noise=fast"], "--dp noise must be one of secure, seeded"),
    (["--dp", "eps=4,clip=1,population=100", "--set", "dp_noise=os"], "dp_noise"),
    (["--write-nonprivate"], "--write-nonprivate only applies with --dp"),
], ids=["eps0", "eps-neg", "delta-big", "clip0", "clip-neg", "no-clip", "no-population", "local", "normalize",
        "standardize", "embed-dim", "bad-key", "noise", "noise-set", "np-without-dp"])
def test_bad_dp_input_is_one_line_exit_2_and_no_artifact(root, capsys, extra, message):
    out = root / "bad"
    capsys.readouterr()
    assert train(root, out, "--algorithm", "fedavg", *extra) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and len(err.splitlines()) == 1, err
    assert not out.exists()
    assert not any(p.name.startswith(".bad") for p in root.iterdir())


def _weights(out):
    return torch.load(out / "model.pt", weights_only=True)["weights"]["client"]


def test_seeded_dp_run_is_deterministic_and_noise_depends_on_the_seed(root):
    a, b, c = root / "det-a", root / "det-b", root / "det-c"
    for out, seed in ((a, "0"), (b, "0"), (c, "1")):
        assert train(root, out, "--algorithm", "fedavg", *SEEDED, "--seed", seed) == 0
    assert (a / "model.pt").read_bytes() == (b / "model.pt").read_bytes()
    wa, wc = _weights(a), _weights(c)
    assert not all(torch.equal(wa[k], wc[k]) for k in wa)
    assert np.isfinite(np.concatenate([v.numpy().ravel() for v in wa.values()])).all()
    ledger = json.loads((a / "privacy.json").read_text())
    assert ledger["noise"] == "seeded" and ledger["noise_statement"].startswith("simulation only")


LDP = ["--dp", "eps=4,delta=1e-5,clip=0.5,population=10000", "--set", "dp_sampling_rate=0.25", "--batch-size", "8"]
SECURE_CASES = {"fedavg": DP, "pefll": [*DP, *PER_ALGORITHM["pefll"]], "ldp-fedavg": LDP}


@pytest.mark.parametrize("algorithm", list(SECURE_CASES))
def test_secure_dp_runs_with_one_seed_differ_only_where_the_mechanism_drew(root, algorithm, capsys):
    """The default noise=secure draws from OS entropy: the same seed gives a different released model."""
    outs = [root / f"{algorithm}-sec-{i}" for i in range(2)]
    for out in outs:
        capsys.readouterr()
        assert main(["train", "--partition", str(root / "part"), "--out", str(out), *FAST, "--algorithm", algorithm,
                     *SECURE_CASES[algorithm], "--format", "human"]) == 0
        assert "noise=secure" in capsys.readouterr().out
        ledger = json.loads((out / "privacy.json").read_text())
        assert ledger["noise"] == "secure" and "os.urandom" in ledger["noise_statement"]
    first, second = (torch.load(o / "model.pt", weights_only=True)["weights"] for o in outs)
    flat = lambda w: torch.cat([v.reshape(-1) for d in w.values() for v in d.values()])  # noqa: E731
    assert not torch.equal(flat(first), flat(second))
    # what the seed decides (config, the public initialization) is still the same
    assert (outs[0] / "config.yaml").read_bytes() == (outs[1] / "config.yaml").read_bytes()


def test_seeded_local_dp_run_is_repeatable(root):
    outs = [root / f"ldp-seeded-{i}" for i in range(2)]
    for out in outs:
        assert train(root, out, "--algorithm", "ldp-fedavg", LDP[0], LDP[1] + ",noise=seeded", *LDP[2:]) == 0
    assert (outs[0] / "model.pt").read_bytes() == (outs[1] / "model.pt").read_bytes()


@pytest.mark.parametrize("algorithm", ["ldp-fedavg", "ppsgd", "centaur"])
def test_local_dp_baselines_end_to_end(root, algorithm, capsys):
    out = root / algorithm
    assert train(root, out, "--algorithm", algorithm, *LDP) == 0
    assert release_contract_violations(out, private_values=_private_values(root)) == []
    ledger = json.loads((out / "privacy.json").read_text())
    (event,) = ledger["events"]
    assert ledger["unit"] == "example" and ledger["delta"] == 1e-5 and ledger["epsilon"] <= 4.0
    assert event["count"] == 6 * 3 and event["event"]["sampling_probability"] == 0.25  # rounds x local steps
    # What the ledger covers (issue 21): PPSGD/CENTAUR's non-private heads feed the DP steps.
    (note,) = [n for n in ledger["notes"] if n.startswith("ISRL-DP")]
    if algorithm == "ldp-fedavg":
        assert "the guarantee holds for each client's records against everything that client sends" in note
    else:
        assert "NOT formally (epsilon, delta)-DP" in note and "everything that client sends" not in note
    # New clients get models through predict, by the algorithm's own protocol.
    capsys.readouterr()
    assert main(["predict", "--model", str(out), "--partition", str(root / "part"), "--out", str(root / f"{algorithm}-pred"),
                 "--format", "json"]) == 0
    pred = json.loads((root / f"{algorithm}-pred" / "metrics.json").read_text())
    assert pred["num_clients"] == 4 and 0.0 <= pred["mean_accuracy"] <= 1.0


def test_a_dp_model_is_checked_against_its_partition_which_it_does_not_record(root, tmp_path, capsys):
    # A --dp train artifact holds no list of its training samples (issue 34, item 1): predict reads the
    # partition its manifest names and refuses test samples the model trained on; once that partition is
    # gone, it cannot tell, and refuses in one line.
    import shutil

    shutil.copytree(root / "part", tmp_path / "part")
    assert main(["partition", "--dataset", "builtin:digits", "--dirichlet", "0.5", "--num-clients", "10",
                 "--seed", "5", "--out", tmp_path / "other", "--format", "quiet"]) == 0
    out = tmp_path / "dp"
    assert main(["train", "--partition", tmp_path / "part", "--algorithm", "fedavg", "--out", out, "--format", "quiet",
                 *FAST, *DP]) == 0
    assert not (out / "train_samples.npz").exists()
    capsys.readouterr()
    predict = ["predict", "--model", out, "--partition", tmp_path / "other", "--clients", "all", "--format", "quiet"]
    assert main([*predict, "--out", tmp_path / "x"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "are samples the model trained on" in err and not (tmp_path / "x").exists()
    shutil.rmtree(tmp_path / "part")
    assert main([*predict, "--out", tmp_path / "x"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "records none" in err and "is gone" in err and not (tmp_path / "x").exists()


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


def test_interrupted_dp_run_keeps_a_private_checkpoint_and_resumes_only_with_its_noise_mode(root, monkeypatch,
                                                                                            capsys):
    """Issue 21: a --dp checkpoint holds released and client-held state only (mode 0600, beside --out); the
    interrupt message says so; --resume under the other noise mode is refused; under its own it finishes."""
    import os
    import stat

    from pfl_cli import formats  # the checkpoint is written with formats.write_atomic
    from pfl_cli.fl.checkpoint import checkpoint_dir

    out = root / "ppsgd-killed"
    args = ["--algorithm", "ppsgd", *LDP]
    real, writes = formats.write_atomic, []

    def write_then_die(path, data):
        if len(writes) == 3:
            raise KeyboardInterrupt  # the process dies in round 4, after the round-3 checkpoint reached the disk
        real(path, data)
        writes.append(path)

    monkeypatch.setattr(formats, "write_atomic", write_then_die)
    capsys.readouterr()
    assert train(root, out, *args) == 130
    # One error line after the progress lines of the rounds that ran (they carry no private value under --dp).
    lines = capsys.readouterr().err.strip().splitlines()
    assert all(ln.startswith("train: round ") and "loss" not in ln and ", elapsed " in ln for ln in lines[:-1]), lines
    err = lines[-1]
    ck = checkpoint_dir(out) / "state.pt"
    assert f"the checkpoint of round 3 is kept at {ck} (mode 0600; it holds " \
        "released model state" in err and "no evaluation on private data" in err
    assert not out.exists() and ck.parent != out and out not in ck.parents
    assert stat.S_IMODE(os.stat(ck).st_mode) == 0o600 and stat.S_IMODE(os.stat(ck.parent).st_mode) == 0o700
    state = torch.load(ck, weights_only=True)
    assert state["round"] == 3 and state["private_run"] and state["dp_noise"] == "secure"
    assert not {"history", "best", "loss_acc", "traffic"} & set(state)
    assert set(state["client_held"]) == {"heads", "has_head"} and "heads" not in state["algorithm"]
    monkeypatch.setattr(formats, "write_atomic", real)
    # The other noise mode: one line naming the parameter, exit 2, nothing written, the checkpoint kept.
    seeded = [args[0], args[1], args[2], args[3] + ",noise=seeded", *args[4:]]
    assert train(root, out, *seeded, "--resume") == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and err.startswith("pflx: error: --dp noise: the checkpoint") and \
        "noise=secure" in err and "noise=seeded" in err
    assert not out.exists() and ck.is_file()
    # Its own mode: continues from round 3 with fresh entropy and finishes; the checkpoint goes away.
    assert train(root, out, *args, "--resume") == 0
    assert json.loads((out / "metrics.json").read_text())["rounds"] == 6 and not ck.parent.exists()
    assert release_contract_violations(out, private_values=_private_values(root)) == []


def test_divergence_under_dp_prints_no_private_number(root, capsys):
    """Under --dp divergence is judged on the released model; the message carries no training loss."""
    capsys.readouterr()
    assert train(root, root / "dp-diverge", "--algorithm", "fedavg", *DP, "--set", "server_lr=1e300") == 1
    err = capsys.readouterr().err.strip()
    assert "the released model stopped being finite" in err and "loss" not in err.split(";")[0]
    assert not (root / "dp-diverge").exists()
