"""Fuzz every command with drawn flags, --set values and config files; fuzz the artifacts they read.

Each drawn command line must keep the contract of the contract module beside this file. The default tier
runs a small, derandomized budget (seconds); ``-m slow`` runs a large one.
"""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from . import contract
from .strategies import NASTY, config_text, corruption, damage, flag_args, set_items, values

SMALL = settings(max_examples=6, deadline=None, derandomize=True, database=None,
                 suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
LARGE = settings(max_examples=150, deadline=None, database=None,
                 suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])

# Values that set how much work a valid run does are drawn small (or invalid), so a drawn run
# that is valid finishes in a second; every other option gets anything.
small = st.one_of(st.integers(0, 3).map(str), st.sampled_from(["-1", "1.5", "nan", "abc", "", "[1]", "true"]))
WORK = {"rounds", "restarts", "max_samples", "sample_bins", "cohort_size", "init_cohort_size", "components",
        "num_clients", "local_steps", "local_epochs", "finetune_steps", "batch_size", "clients_per_round",
        "hyper_hidden", "embed_dim", "mlp_hidden", "descriptor_batch", "k", "lloyds_steps", "server_n_init",
        "reference_n_init", "k_candidates", "steps", "max_steps", "population", "max_noise", "eval_every"}


def _opts(**flags):
    """flag -> strategy ('switch' flags map to None); a list gives valid texts, drawn two times in three."""
    out = {}
    for name, kind in flags.items():
        flag = "--" + name.replace("_", "-")
        anything = small if name in WORK else values
        if kind == "switch":
            out[flag] = None
        elif isinstance(kind, list):
            valid = st.sampled_from(kind)
            out[flag] = st.one_of(valid, valid, anything)
        else:
            out[flag] = anything
    return out


COMMANDS = {
    "partition": (lambda a: ["--num-clients", "6"], _opts(
        num_clients=["3", "6", "20"], dirichlet=["0.1", "1", "0.5,1,1,1,1,1,1,1,1,1"], min_size=["0", "2", "30"],
        classes_per_client=["2", "3"], holdout_clients=["0", "0.25", "2"], test_fraction=["0", "0.3"],
        seed=["0", "7"], shards_per_client=["2"], quantity=["lognormal:1", "linear", "dirichlet:2"],
        assign=["random", "deterministic"], class_shares=["equal"], scheme=["iid", "dirichlet", "quantity"],
        dataset=["builtin:digits", "ring:n=300", "gmm:clients?d=3&k=2&num_clients=6&client_size=20&seed=1"],
        iid="switch",
        self_balancing="switch", natural_id="switch"), "partition"),
    "mdm-fit": (lambda a: ["--partition", a / "part", "--components", "2", "--rounds", "3"], _opts(
        components=["1", "2", "1-2", "auto"], rounds=["0", "2"], cohort_size=["3"], restarts=["1", "2"],
        max_samples=["400"], sample_bins=["3"], validation_fraction=["0.3"], dp=["eps=1", "eps=2,delta=1e-6"],
        seed=["1"], counts=1, bins=1), "mdm-fit"),
    "simulate": (lambda a: ["--model", a / "mdm", "--num-clients", "5"], _opts(
        num_clients=["3", "6"], mode=["mdm", "iid"], shortage=["cap", "replace", "error"], test_fraction=["0.2"],
        holdout_clients=["1", "0.5"], seed=["2"], like=1,
        replacement="switch", no_replacement="switch"), "partition"),
    "train": (lambda a: ["--partition", a / "part", "--rounds", "2", "--eval-every", "1", "--local-steps", "2",
                         "--set", "hyper_hidden=8", "--set", "mlp_hidden=[8]"], _opts(
        algorithm=["pefll", "fedavg", "local"], rounds=["0", "1", "3"], clients_per_round=["2"],
        local_steps=["1"], batch_size=["4"], lr=["0.01"], server_lr=["0.001"], eval_every=["1", "2"],
        val_fraction=["0", "0.2"], finetune_steps=["1"], embed_dim=["2"], hyper_size=["S"],
        model_arch=["mlp"], embedding=["linear", "mlp"], device=["cpu"], seed=["3"],
        label_mask="switch", no_label_mask="switch", resume="switch"), "train"),
    "predict": (lambda a: ["--model", a / "model", "--partition", a / "part"], _opts(
        clients=["holdout", "train", "all"], finetune_steps=["0", "1"], eval_descriptor=["all", "batch"],
        device=["cpu"], seed=["1"], save_models="switch",
        label_mask="switch"), "predict"),
    "cluster": (lambda a: ["--partition", a / "part", "--server-data", "builtin:digits", "--k", "2", "--no-dp",
                           "--reference-n-init", "1"], _opts(
        k=["2", "3"], dp=["eps=1", "eps=2,delta=1e-6"], privacy_unit=["example"], radius=["20"],
        split=1, min_server_weight=["0", "5"], lloyds_steps=["0", "1"], init=["feddp", "random", "server-kmeans++"],
        client_clip=1, lloyds_calibration=["basic_text"], composition=["basic", "pld"], seed=["4"],
        no_dp="switch"), "cluster"),
    "privacy-account": (lambda a: ["-z", "1.1", "--steps", "10", "--delta", "1e-5"], _opts(
        noise_multiplier=["0.8", "2"], sampling_rate=["0.01", "1"], population=["100"], cohort_size=["10"],
        steps=["1", "3"], epsilon=["1", "3"], delta=["1e-5"], accountant=["rdp", "pld"],
        neighboring=["add-remove", "replace"], sampling=["poisson"], unit=["client"]), "privacy-account"),
}


def _bounded_set_items(stage: str):
    return set_items(stage).map(lambda kv: kv if kv.split("=", 1)[0] not in WORK else f"{kv.split('=', 1)[0]}=1")


@st.composite
def command_lines(draw, stage: str):
    base, options, _ = COMMANDS[stage]
    flags = draw(flag_args(options))
    sets = draw(st.lists(_bounded_set_items(stage), max_size=2) if draw(st.booleans()) else st.just([]))
    config = draw(config_text(stage)) if draw(st.integers(0, 3)) == 0 else None
    fmt = draw(st.sampled_from(["quiet", "json", "human"]))
    return base, flags, sets, config, fmt


def _run_drawn(cli, tmp_path, artifacts, stage, drawn) -> None:
    base, flags, sets, config, fmt = drawn
    work = Path(tempfile.mkdtemp(dir=tmp_path))
    out = work / "out"
    args = [stage, *base(artifacts), *flags, "--out", out, "--format", fmt]
    for item in sets:
        args += ["--set", item]
    if config is not None:
        (work / "c.yaml").write_bytes(config if b"bogus" not in config else config.replace(b"bogus", b"seed"))
        args += ["--config", work / "c.yaml"]
    res = cli(*args)
    contract.check(res, out=out, before=None, stage=COMMANDS[stage][2], args=args)
    if fmt == "json" and res.code != 0:
        import json

        doc = json.loads(res.out.strip().splitlines()[-1])
        assert doc["exit_code"] == res.code and doc["stage"] == stage and doc["error"] in res.err
    shutil.rmtree(work, ignore_errors=True)


@pytest.mark.parametrize("stage", list(COMMANDS))
@SMALL
@given(data=st.data())
def test_fuzz_command_lines(cli, tmp_path, artifacts, stage, data):
    _run_drawn(cli, tmp_path, artifacts, stage, data.draw(command_lines(stage)))


@pytest.mark.slow
@pytest.mark.parametrize("stage", list(COMMANDS))
@LARGE
@given(data=st.data())
def test_fuzz_command_lines_large(cli, tmp_path, artifacts, stage, data):
    _run_drawn(cli, tmp_path, artifacts, stage, data.draw(command_lines(stage)))


# ---------------------------------------------------------------------------- damaged inputs
READERS = {  # artifact -> the command that reads it (the damaged copy stands in for {src})
    "part": ["mdm-fit", "--partition", "{src}", "--components", "2", "--rounds", "2"],
    "mdm": ["simulate", "--model", "{src}", "--num-clients", "4"],
    "model": ["predict", "--model", "{src}", "--partition", "{part}"],
    "ledger": ["privacy-account", "{src}"],
}


def _run_damaged(cli, tmp_path, artifacts, name, pick, how) -> None:
    work = Path(tempfile.mkdtemp(dir=tmp_path))
    src = work / name
    shutil.copytree(artifacts / name, src)
    files = sorted(p for p in src.rglob("*") if p.is_file())
    target = files[int(pick * len(files)) % len(files)]
    original = target.read_bytes()
    damage(target, how)
    out = work / "out"
    args = [a.format(src=src, part=artifacts / "part") for a in READERS[name]] + ["--out", str(out)]
    res = cli(*args, "--format", "quiet")
    contract.check(res, out=out, before=None, stage=None, args=args)
    if target.read_bytes() != original and target.name != "manifest.json":
        assert res.code == 2, (target, how, res.err)  # a changed payload is never used
    shutil.rmtree(work, ignore_errors=True)


damages = st.tuples(st.sampled_from(sorted(READERS)), st.floats(0, 1), corruption())


@SMALL
@given(case=damages)
def test_fuzz_damaged_artifacts(cli, tmp_path, artifacts, case):
    _run_damaged(cli, tmp_path, artifacts, *case)


@pytest.mark.slow
@LARGE
@given(case=damages)
def test_fuzz_damaged_artifacts_large(cli, tmp_path, artifacts, case):
    _run_damaged(cli, tmp_path, artifacts, *case)


def _run_damaged_checkpoint(cli, tmp_path, artifacts, how) -> None:
    from pfl_cli.fl.checkpoint import checkpoint_dir

    work = Path(tempfile.mkdtemp(dir=tmp_path))
    out = work / "run"
    ck = checkpoint_dir(out) / "state.pt"
    ck.parent.mkdir()
    shutil.copyfile(artifacts / "model" / "checkpoint" / "state.pt", ck)
    damage(ck, how)
    args = ["train", *COMMANDS["train"][0](artifacts), "--out", out, "--resume", "--format", "quiet"]
    res = cli(*args)
    contract.check(res, out=out, before=None, stage="train", args=args)
    if res.code == 0:  # only a harmless byte (zip padding) may pass, and then the result is the same
        assert (out / "model.pt").read_bytes() == (artifacts / "model" / "model.pt").read_bytes()
    else:
        assert res.code == 2 and str(ck) in res.err
    shutil.rmtree(work, ignore_errors=True)


@settings(SMALL, max_examples=3)
@given(how=corruption())
def test_fuzz_damaged_checkpoints(cli, tmp_path, artifacts, how):
    _run_damaged_checkpoint(cli, tmp_path, artifacts, how)


@pytest.mark.slow
@settings(LARGE, max_examples=40)
@given(how=corruption())
def test_fuzz_damaged_checkpoints_large(cli, tmp_path, artifacts, how):
    _run_damaged_checkpoint(cli, tmp_path, artifacts, how)


def test_nasty_values_cover_the_classic_traps():
    assert {"perhaps", "nan", "1e309", "[1, 2]", "true"} <= set(NASTY)
