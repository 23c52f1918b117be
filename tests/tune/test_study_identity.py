"""A study's identity (issue 39, defect 2): a resume with any setting that changes what a trial computes is
refused, naming it; never mixed. Generated from ``pfl_cli.tune.study.IDENTITY``: a new component is a new case
(and fails here until the table below says how to change only it)."""

import hashlib
import json
import shutil
from pathlib import Path

import numpy as np
import optuna
import pytest
import yaml

from pfl_cli.tune.study import IDENTITY

SMALL = ["--eval-every", "1", "--local-steps", "3", "--clients-per-round", "4", "--set", "mlp_hidden=[16]",
         "--device", "cpu"]
BASE = {"--algorithm": "fedavg", "--rounds": "2", "--space": "lr=log:1e-2:1e-1", "--validation-fraction": "0.2"}
# component -> (the flags that change it and nothing else the study knows, other components it may drag along)
CHANGE = {
    "algorithm": ({"--algorithm": "fedprox"}, {"config", "space"}),  # another algorithm: its own keys and space
    "config": ({"--local-steps": "4"}, set()),
    "space": ({"--space": "lr=log:1e-4:1e-3"}, set()),
    "rounds": ({"--rounds": "3"}, set()),
    "objective": ({"--label-mask": None}, set()),
    "validation": ({"--validation-fraction": "0.3"}, set()),
    "partition": ({"--partition": "OTHER"}, set()),
    "version": ({}, set()),  # the pflx version: monkeypatched below
}


def _args(part, other, out, storage, change=None):
    flags = {**BASE, "--partition": str(part), **(change or {})}
    if flags.get("--partition") == "OTHER":
        flags["--partition"] = str(other)
    args = ["tune", "--trials", "1", *SMALL, "--format", "quiet", "--out", str(out)]
    if "--local-steps" in flags:
        i = args.index("--local-steps")
        args[i + 1] = flags.pop("--local-steps")
    for k, v in flags.items():
        args += [k] if v is None else [k, v]
    return args + (["--storage", storage, "--study-name", "s"] if storage else [])


@pytest.fixture(scope="module")
def made(tmp_path_factory):
    """Two partitions of the same data (seeds 0 and 1) and a finished one-trial study of the base command."""
    from pfl_cli.cli.app import main

    root = tmp_path_factory.mktemp("identity")
    for name, seed in (("part", "0"), ("other", "1")):
        assert main(["partition", "--dataset", "builtin:digits", "--classes-per-client", "2", "--num-clients", "12",
                     "--seed", seed, "--format", "quiet", "--out", str(root / name)]) == 0
    assert main(_args(root / "part", root / "other", root / "t", None)) == 0
    return root


def _digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_every_identity_component_has_a_case():
    assert set(CHANGE) == set(IDENTITY)


# every component through --storage; through the staging study beside --out one in the default tier, all under slow
CASES = [pytest.param(c, w, marks=[pytest.mark.slow] if w == "staging" and c != "rounds" else [])
         for w in ("storage", "staging") for c in IDENTITY]


@pytest.mark.parametrize("component, where", CASES)
def test_a_resume_with_one_component_changed_is_refused_naming_it(cli, made, tmp_path, monkeypatch, component,
                                                                  where):
    """The finished study is resumed (through --storage, or as the staging study beside --out that a Ctrl-C
    leaves) by the same command with only ``component`` changed: exit 2, one line naming it and --force, nothing
    written, the study's file byte-identical."""
    change, dragged = CHANGE[component]
    out = tmp_path / "o"
    if where == "storage":
        db = tmp_path / "s.db"
        storage = f"sqlite:///{db}"
        shutil.copyfile(made / "t" / "study.db", db)
        old = optuna.load_study(study_name="pflx-tune-fedavg", storage=storage)
        optuna.copy_study(from_study_name=old.study_name, from_storage=storage, to_storage=storage,
                          to_study_name="s")
    else:
        db = tmp_path / ".o.study" / "study.db"
        db.parent.mkdir()
        shutil.copyfile(made / "t" / "study.db", db)
        storage = None
    if component == "version":
        monkeypatch.setattr("pfl_cli.__version__", "0.0.0+other")
    before = _digest(db)
    r = cli(*_args(made / "part", made / "other", out, storage, change))
    assert r.code == 2, r.err
    assert r.err.count("\n") == 1 and r.err.startswith("pflx: error: --storage / --out: the existing study")
    named = {k for k in IDENTITY if f"; {k} (" in r.err or f": {k} (" in r.err}
    assert component in named and named <= {component} | dragged, r.err
    assert "--force" in r.err
    assert not out.exists() and _digest(db) == before


@pytest.mark.parametrize("where", ["storage", "staging"])
def test_the_same_command_resumes(cli, made, tmp_path, where):
    """The control: the unchanged command (the identity computed again) continues the study, no refusal."""
    out = tmp_path / "o"
    if where == "storage":
        storage = f"sqlite:///{tmp_path / 's.db'}"
        shutil.copyfile(made / "t" / "study.db", tmp_path / "s.db")
        optuna.copy_study(from_study_name="pflx-tune-fedavg", from_storage=storage, to_storage=storage,
                          to_study_name="s")
    else:
        (tmp_path / ".o.study").mkdir()
        shutil.copyfile(made / "t" / "study.db", tmp_path / ".o.study" / "study.db")
        storage = None
    args = _args(made / "part", made / "other", out, storage)
    args[args.index("--trials") + 1] = "2"
    r = cli(*args[:args.index("--format")], *args[args.index("--format") + 2:])
    assert r.code == 0, r.err
    assert "continuing the study" in r.err and "1 of 2 trials already there" in r.err
    assert (out / "trials.csv").read_text().count("\ncomplete") == 0 and len((out / "trials.csv").read_text()
                                                                             .strip().splitlines()) == 3


def test_force_starts_a_fresh_study_and_says_so(cli, made, tmp_path):
    """The issue's example: lr over 0.5..1 with 4 rounds, then the same study with 1e-4..1e-3 and 2 rounds.
    Before, best.yaml said lr 0.82, rounds 2 (a config never evaluated); now it is refused, and with --force
    the study restarts: every trial of the artifact is of the new settings."""
    storage = f"sqlite:///{tmp_path / 's.db'}"
    first = ["tune", "--partition", made / "part", "--algorithm", "fedavg", *SMALL, "--storage", storage,
             "--study-name", "x"]
    r = cli(*first, "--trials", "2", "--rounds", "4", "--space", "lr=log:0.5:1", "--out", tmp_path / "o1")
    assert r.code == 0, r.err
    again = [*first, "--trials", "2", "--rounds", "2", "--space", "lr=log:1e-4:1e-3", "--out", tmp_path / "o2"]
    r = cli(*again)
    assert r.code == 2 and "space (--space): lr=log:0.5:1 in the study, lr=log:0.0001:0.001 now" in r.err
    assert "rounds (--rounds): 4 in the study, 2 now" in r.err and not (tmp_path / "o2").exists()
    r = cli(*again, "--force")
    assert r.code == 0, r.err
    assert "--force: deleted the study 'x' (2 trials; it differed in space, rounds) and started a fresh one." in r.err
    best = yaml.safe_load((tmp_path / "o2" / "best.yaml").read_text())
    assert best["rounds"] == 2 and 1e-4 <= best["lr"] <= 1e-3
    import csv

    rows = list(csv.DictReader(open(tmp_path / "o2" / "trials.csv")))
    assert len(rows) == 2 and all(1e-4 <= float(r_["lr"]) <= 1e-3 for r_ in rows)
    assert all(len(r_["curve"].split(";")) == 2 for r_ in rows)  # two rounds each: trained now, none reused


def test_a_cached_result_is_reused_only_within_one_identity(digits_clients):
    """Two objectives of different identities (2 and 3 rounds) on one study, the same single-point space: the
    second trains its own 3-round curve instead of returning the first's 2-round result."""
    from pfl_cli import registry
    from pfl_cli.tune.space import resolve_space
    from pfl_cli.tune.split import validation_partition
    from pfl_cli.tune.loop import optimize
    from pfl_cli.tune.trial import Objective, TuningData

    ds, part = digits_clients
    params = resolve_space(registry.get("fedavg"), {"lr": "choice:0.05"})
    vpart = validation_partition(part, val_fraction=0.2, val_clients=0.0, rng=np.random.default_rng(0))
    data = TuningData(ds.x, ds.y, ds.num_classes, vpart)
    study = optuna.create_study(direction="maximize", sampler=optuna.samplers.RandomSampler(seed=0))
    for rounds, identity, n in ((2, "a", 2), (3, "b", 3), (3, "b", 4)):
        cfg = registry.train_config("fedavg", rounds=rounds, eval_every=1, local_steps=3, clients_per_round=4,
                                    mlp_hidden=(16,), device="cpu")
        optimize(study, Objective(data, cfg, params, group="train", metric="mean_accuracy", identity=identity), n)
    curves = [sorted(t.intermediate_values) for t in study.trials]
    assert curves == [[1, 2], [1, 2], [1, 2, 3], [1, 2, 3]]
    assert [t.user_attrs.get("duplicate_of") for t in study.trials] == [None, 0, None, 2]
    assert json.dumps(study.trials[2].intermediate_values) != json.dumps(study.trials[0].intermediate_values)
