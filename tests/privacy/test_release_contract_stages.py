"""Every file of every DP artifact of every DP stage, checked against the release contract.

Each :class:`StageCase` runs one DP command end to end on two *neighbouring* private
inputs (the second lacks one privacy unit) with the same seed, and names the exact counts
of the private data that no released file (and no printed result) may contain. The test
then walks every file of both artifacts with :func:`pfl_cli.manifest.check_release_contract`
and checks that nothing but mechanism outputs differs between the neighbours' ledgers.

To put another stage under the contract, append a StageCase whose
``run`` builds its artifact with ``ArtifactWriter(..., dp=True)`` and per-file ``release``
classes.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import numpy as np
import pytest

from pfl_cli.artifacts import NONPRIVATE, _numbers_in_text, check_release_contract, load_json
from pfl_cli.cli.app import main

N_CLIENTS = 37      # distinctive numbers, so a leak cannot hide behind a coincidence
CLIENT_SIZES = np.r_[np.full(36, 29), 41]   # one client above the public M = 30 (mdm-fit)
DIM = 6


@dataclass(frozen=True)
class Private:
    """One private input and the exact counts it holds."""

    path: Path
    counts: tuple[float, ...]


@dataclass(frozen=True)
class StageCase:
    id: str
    run: Callable[..., tuple[int, str]]                    # (out, private, extra flags, capsys) -> (code, stdout)
    prepare: Callable[[Path, bool], Private]                # (dir, drop_last_unit) -> private input
    extras: tuple[tuple[str, ...], ...]                      # flag variants, each checked


def _cli(args, capsys) -> tuple[int, str]:
    code = main([*args, "--format", "json"])
    return code, capsys.readouterr().out


# ------------------------------------------------------------------------------ private inputs
def _rng():
    return np.random.default_rng(11)


def _histograms(d: Path, drop: bool) -> Private:
    rng = _rng()
    counts = np.stack([rng.multinomial(int(m), np.full(4, 0.25)) for m in CLIENT_SIZES])
    if drop:
        counts = counts[:-1]
    path = d / "counts.npy"
    np.save(path, counts)
    n = len(counts)
    return Private(path, (n, int(counts.sum()), int(CLIENT_SIZES.max())))


def _points_partition(d: Path, drop: bool) -> Private:
    rng = _rng()
    owner = np.repeat(np.arange(N_CLIENTS), 23 + np.arange(N_CLIENTS) % 5)
    x = rng.normal(size=(len(owner), DIM)) + 3.0 * (owner % 3)[:, None]
    keep = owner < N_CLIENTS - 1 if drop else np.ones(len(owner), bool)
    np.savez(d / "points.npz", x=x[keep], y=(owner[keep] % 2), client=owner[keep])
    out = d / "part"
    assert main(["partition", "--dataset", f"npz:{d / 'points.npz'}", "--natural-id", "--test-fraction", "0",
                 "--out", str(out), "--format", "quiet"]) == 0
    return Private(out, (len(np.unique(owner[keep])), int(keep.sum())))


def _server(d: Path) -> str:
    rng = np.random.default_rng(5)
    q = rng.normal(size=(300, DIM)) + 3.0 * (np.arange(300) % 3)[:, None]
    np.savez(d / "server.npz", x=q)
    return f"npz:{d / 'server.npz'}"


# ------------------------------------------------------------------------------ the stages
def _mdm_fit(out: Path, private: Private, extra: tuple[str, ...], capsys) -> tuple[int, str]:
    return _cli(["mdm-fit", "--counts", str(private.path), "--components", "2", "--rounds", "4",
                 "--max-samples", "30", "--dp", "eps=2,delta=1e-6", "--out", str(out), *extra], capsys)


def _cluster(out: Path, private: Private, extra: tuple[str, ...], capsys) -> tuple[int, str]:
    return _cli(["cluster", "--partition", str(private.path), "--server-data", _server(private.path.parent),
                 "--k", "3", "--dp", "eps=1,delta=1e-6", "--out", str(out), *extra], capsys)


def _both(d: Path, drop: bool) -> Private:
    hist, part = _histograms(d, drop), _points_partition(d, drop)
    return Private(d, hist.counts + part.counts)


def _privacy_account(out: Path, private: Private, extra: tuple[str, ...], capsys) -> tuple[int, str]:
    # Composes the client-level ledgers of a DP mdm-fit and a DP cluster run on the private data.
    d = private.path
    assert _mdm_fit(d / "acc-mdm", Private(d / "counts.npy", ()), (), capsys)[0] == 0
    assert _cluster(d / "acc-km", Private(d / "part", ()), ("--privacy-unit", "client"), capsys)[0] == 0
    return _cli(["privacy-account", str(d / "acc-mdm"), str(d / "acc-km"), "--out", str(out), *extra], capsys)


def _labelled_partition(d: Path, drop: bool) -> Private:
    rng = _rng()
    owner = np.repeat(np.arange(N_CLIENTS), 23 + np.arange(N_CLIENTS) % 5)
    y = (owner + rng.integers(0, 2, len(owner))) % 3
    x = rng.normal(size=(len(owner), DIM)) + 2.0 * y[:, None]
    keep = owner < N_CLIENTS - 1 if drop else np.ones(len(owner), bool)
    np.savez(d / "labelled.npz", x=x[keep], y=y[keep], client=owner[keep])
    out = d / "part"
    assert main(["partition", "--dataset", f"npz:{d / 'labelled.npz'}", "--natural-id", "--test-fraction", "0.3",
                 "--holdout-clients", "3", "--out", str(out), "--format", "quiet"]) == 0
    return Private(out, (len(np.unique(owner[keep])), len(np.unique(owner[keep])) - 3, int(keep.sum())))


def _train(out: Path, private: Private, extra: tuple[str, ...], capsys) -> tuple[int, str]:
    from pfl_cli import registry

    algorithm = extra[extra.index("--algorithm") + 1] if "--algorithm" in extra else "fedavg"
    example = registry.get(algorithm).algorithm.dp_unit == "example"
    dp = "eps=2,delta=1e-5,clip=0.5,population=10000" if example else "eps=2,delta=1e-6,clip=0.5,population=1000"
    rest = [a for a in extra if a not in ("--algorithm", algorithm)]
    if "dp_mechanism=ddg" in extra:  # distributed DP: a fixed cohort chosen by the server, no population bound
        dp, sampling = "eps=2,delta=1e-6,clip=0.5", ["--clients-per-round", "4"]
    else:
        # client-level DP with the rate and the population given draws its cohorts: a cohort size is refused there
        cohort = ["--clients-per-round", "400"] if example and "--clients-per-round" not in rest else []
        sampling = [*cohort, "--set", "dp_sampling_rate=0.3"]
    return _cli(["train", "--partition", str(private.path), "--algorithm", algorithm, "--dp", dp, "--rounds", "3",
                 "--eval-every", "3", "--local-steps", "2", "--batch-size", "8", *sampling,
                 "--set", "normalize=false", "--set", "mlp_hidden=[8]", "--out", str(out), *rest], capsys)


def _tune(out: Path, private: Private, extra: tuple[str, ...], capsys) -> tuple[int, str]:
    # A private study: a secret number of DP trainings, each with a noisy score; the best config released.
    return _cli(["tune", "--partition", str(private.path), "--algorithm", "fedavg", "--trials", "2",
                 "--dp", "eps=2,delta=1e-6,clip=0.5,population=1000", "--rounds", "2", "--eval-every", "2",
                 "--local-steps", "2", "--batch-size", "8", "--set", "normalize=false",
                 "--set", "mlp_hidden=[8]", "--set", "dp_sampling_rate=0.3", "--out", str(out), *extra], capsys)


CASES = [
    StageCase("train", _train, _labelled_partition,
              ((), ("--write-nonprivate",), ("--algorithm", "pefll", "--no-standardize-descriptor", "--embed-dim", "4",
                                              "--set", "hyper_hidden=8"),
               ("--algorithm", "ppsgd", "--write-nonprivate"), ("--algorithm", "ldp-fedavg"),
               ("--algorithm", "centralized", "--clients-per-round", "4", "--write-nonprivate"),
               ("--secagg", "--set", "dp_mechanism=ddg", "--write-nonprivate"),
               # client-held state (each client's B and classifier) that model.pt must not carry
               ("--algorithm", "fedsa-lora", "--set", "lora_rank=2", "--set", "new_client_epochs=1"))),
    StageCase("mdm-fit", _mdm_fit, _histograms,
              ((), ("--write-nonprivate",), ("--write-nonprivate", "--plot"))),
    StageCase("cluster", _cluster, _points_partition,
              ((), ("--write-nonprivate", "--k-candidates", "1-5"), ("--privacy-unit", "client", "--lloyds-steps", "1"))),
    StageCase("privacy-account", _privacy_account, _both, ((), ("--accountant", "pld"))),
    StageCase("tune", _tune, _labelled_partition, ((), ("--write-nonprivate",))),
]


def _variants():
    for case in CASES:
        for extra in case.extras:
            yield pytest.param(case, extra, id=f"{case.id}[{' '.join(extra) or 'default'}]")


@pytest.mark.parametrize("case, extra", list(_variants()))
def test_every_file_of_neighbouring_dp_artifacts_meets_the_contract(case, extra, tmp_path, capsys):
    runs = []
    for name, drop in (("full", False), ("neighbour", True)):
        d = tmp_path / name
        d.mkdir()
        private = case.prepare(d, drop)
        code, printed = case.run(d / "out", private, extra, capsys)
        assert code == 0, printed
        runs.append((d / "out", private, printed))
    secrets = {c for _, private, _ in runs for c in private.counts}
    for out, private, printed in runs:
        check_release_contract(out, private_values=secrets)       # walks every file
        assert not _numbers_in_text(printed) & secrets, printed   # nor printed to stdout
    (a, _, _), (b, _, _) = runs
    manifest = load_json(a / "manifest.json")
    wants_nonprivate = "--write-nonprivate" in extra
    assert any(o["release"] == NONPRIVATE for o in manifest["outputs"]) == wants_nonprivate
    if "--plot" in extra:
        assert (a / "nonprivate.png").read_bytes()[:4] == b"\x89PNG"
    # The ledger is a function of public inputs only: neighbours get byte-identical ledgers.
    assert (a / "privacy.json").read_bytes() == (b / "privacy.json").read_bytes()


def _train_algorithms() -> set[str]:
    """The algorithms the train case runs (fedavg when an extra names none)."""
    train = next(case for case in CASES if case.id == "train")
    return {e[e.index("--algorithm") + 1] if "--algorithm" in e else "fedavg" for e in train.extras}


def _other_dp_algorithms() -> list[str]:
    from pfl_cli import registry

    return [n for n in registry.names() if registry.get(n).algorithm.dp_unit and n not in _train_algorithms()]


@pytest.mark.slow
@pytest.mark.parametrize("algorithm", _other_dp_algorithms())
def test_every_dp_algorithm_s_train_artifact_meets_the_contract(algorithm, tmp_path, capsys):
    """Generated over the registry: every algorithm with a DP variant, beyond the train case's own extras."""
    train = next(case for case in CASES if case.id == "train")
    test_every_file_of_neighbouring_dp_artifacts_meets_the_contract(train, ("--algorithm", algorithm), tmp_path,
                                                                     capsys)


# DP entry points whose release contract is checked elsewhere, each with where and why.
COVERED_ELSEWHERE = {
    "flower app": "tests/interop/test_flower_app.py (flower tier): test_dp_fedavg_on_flower_is_pflx_train_dp_with_"
                  "seeded_noise and test_dp_fedavg_on_flower_secure_noise_and_nonprivate_diagnostics check "
                  "release_contract_violations(out) == [] on the deployment's DP artifact",
    "compare --spec": "each DP entry of a spec is trained by run_train, the `train` case's code path, into a train "
                      "artifact; the comparison of such runs is refused unless --nonprivate with write_nonprivate "
                      "(pfl_cli/cli/compare_run.py), so the spec adds no DP release of its own",
}


def test_the_cases_cover_every_stage_that_takes_dp():
    """Every DP entry point pflx has (commands, group commands, spec entries: dp_entry_points()) has a case
    here or a stated reason it is covered elsewhere; a new one fails here until it gets one."""
    from pfl_cli.cli.app import dp_entry_points

    entries = set(dp_entry_points())
    assert {"train", "tune", "mdm-fit", "cluster", "privacy-account", "flower app", "compare --spec"} <= entries
    uncovered = entries - {case.id for case in CASES} - set(COVERED_ELSEWHERE)
    assert not uncovered, f"DP entry points with no release-contract case: {sorted(uncovered)}"
    # and the other way: a case whose entry point the generator no longer finds (its --dp option or its DP_THROUGH
    # registration gone) fails here, whatever the list above names
    assert {case.id for case in CASES} <= entries, "a case for an entry point dp_entry_points() does not list"
    assert set(COVERED_ELSEWHERE) <= entries, "a stated reason for an entry point that no longer releases under DP"
    flower = (Path(__file__).resolve().parents[1] / "interop" / "test_flower_app.py").read_text()
    for name in ("test_dp_fedavg_on_flower_is_pflx_train_dp_with_seeded_noise",
                 "test_dp_fedavg_on_flower_secure_noise_and_nonprivate_diagnostics"):
        assert f"def {name}(" in flower, f"flower app's release-contract check {name} is gone"


@pytest.mark.parametrize("args, message", [
    (["mdm-fit", "--components", "2", "--dp", "eps=1"], "--dp needs --max-samples M: a public bound"),
    (["mdm-fit", "--components", "2", "--max-samples", "30", "--dp", "eps=0"], "--dp eps must be > 0"),
    (["mdm-fit", "--components", "2", "--max-samples", "30", "--dp", "eps=-3"], "--dp eps must be > 0"),
    (["mdm-fit", "--components", "2", "--max-samples", "30", "--dp", "eps=1,clip=0"], "--dp clip must be > 0"),
    (["mdm-fit", "--components", "2", "--max-samples", "30", "--dp", "eps=1,clip=-1"], "--dp clip must be > 0"),
    (["mdm-fit", "--components", "2", "--max-samples", "30", "--dp", "eps=1,delta=0.05,population=37"],
     "--dp delta must be < 1/population"),
    (["mdm-fit", "--components", "2", "--max-samples", "30", "--cohort-size", "10", "--dp", "eps=1"],
     "give a public bound, e.g. --dp eps=1,population=N"),
    (["mdm-fit", "--components", "2", "--max-samples", "30", "--dp", "eps=1", "--plot"],
     "--plot with --dp draws the private data"),
    (["mdm-fit", "--components", "2", "--write-nonprivate"], "--write-nonprivate only applies with --dp"),
], ids=["no-max-samples", "eps-0", "eps-negative", "clip-0", "clip-negative", "delta-vs-population",
        "cohort-without-population", "plot-without-write-nonprivate", "nonprivate-without-dp"])
def test_mdm_fit_bad_dp_input_is_one_line_exit_2_and_no_artifact(tmp_path, capsys, args, message):
    private = _histograms(tmp_path, False)
    code = main([*args, "--counts", str(private.path), "--out", str(tmp_path / "out")])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and message in err[0], err
    assert not (tmp_path / "out").exists()


def test_released_numbers_do_not_depend_on_the_data_size_beyond_the_mechanism(tmp_path, capsys):
    """mdm.json under DP: same keys and same public settings for neighbours; the counts are nowhere."""
    docs = []
    for name, drop in (("a", False), ("b", True)):
        (tmp_path / name).mkdir()
        private = _histograms(tmp_path / name, drop)
        assert _mdm_fit(tmp_path / name / "out", private, (), capsys)[0] == 0
        docs.append(json.loads((tmp_path / name / "out/mdm.json").read_text()))
    assert docs[0].keys() == docs[1].keys() and docs[0]["dp"] == docs[1]["dp"] and docs[0]["fit"] == docs[1]["fit"]
    assert docs[0]["num_samples"]["support"] == docs[1]["num_samples"]["support"] == list(range(1, 31))
