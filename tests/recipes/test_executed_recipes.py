"""Every command a recipe's header shows, and every target of recipes/Makefile and recipes/compare/Makefile,
runs as written (issue 34, item 8 and "Documentation that is executed"); the mechanism is tests/docs/executed.py.

Default tier: each `pflx train` / `predict` / `attack` / `cluster` command of every recipe header goes through
pflx's own command line with its inputs pointed at a path that does not exist: the config (recipe sections,
flags, --set) must resolve, so the one error is the missing input. This is how the recipes whose data cannot
be present here (CIFAR-10, CINIC-10, EMNIST, Omniglot, Shakespeare, census, Stack Overflow; a GPU) are checked.

``docs`` tier: the recipes whose data ship with pflx (builtin:, ring:) run their whole header in order in a
scratch directory at smoke size (``SMOKE_SETS`` below: 2 rounds and the like, appended to each train command
as ``--set``; ``executed.SMOKE`` for make's ROUNDS); a header's script that is an experiment of minutes at the
recipe's size has its command checked to parse (``SCRIPTS``); both Makefiles' targets run at ROUNDS=2.
"""

from __future__ import annotations

import csv
import json
import pathlib
import re
import shlex
import subprocess
import sys

import pytest
import yaml

from pfl_cli import registry

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "docs"))
import executed  # noqa: E402

ROOT = executed.ROOT
RECIPES = sorted((ROOT / "recipes").rglob("*.yaml"))
INPUTS = ("--partition", "--model", "--counts")  # what a command reads; replaced by an absent path
CHECKED = ("train", "predict", "attack", "cluster")

# Appended to a header's `pflx train` (as --set) where the algorithm takes the key: the smoke size.
SMOKE_SETS = {"rounds": 2, "eval_every": 1, "local_epochs": 1, "local_steps": 2, "embed_rounds": 1}
# Appended to a header's `pflx attack`: the attack's optimizer steps and images are its length, not its wiring.
ATTACK_SMOKE = ["--iterations", "20", "--images", "2"]
# Per recipe, more --set for its train commands (with why).
RECIPE_SETS = {
    "pefll/shakespeare-smoke.yaml": ["lstm_hidden=8"],  # a width-8 LSTM: the chain, not the model, is tested
}
# A header script either runs (cheap: it reads the chain's artifacts) or is checked to parse with --help (why).
SCRIPTS = {
    "recipes/pefll/shakespeare_fixture.py": None,
    "recipes/pefll/shakespeare_figure.py": None,
    "recipes/pefll/descriptor_analysis.py": None,
    "recipes/dp/accuracy_vs_epsilon.py": "one DP training per epsilon at the recipe's size (minutes)",
    "recipes/feddp-kmeans/figure_6_1.py": "the figure's five epsilons over 100 clients and seeds (minutes)",
    "recipes/feddp-kmeans/census_csv.py": "needs the ACS census CSV (psam_p.csv), not shipped",
    "recipes/mdm/recovery.py": "10,000 simulated clients per setting (minutes)",
    "recipes/mdm/hp-tuning/hp_tuning.py": "the study itself runs in tests/recipes/test_hp_tuning_recipe.py",
    "recipes/pefll/extrapolation.py": "ten alphas x trainings at the recipe's size (minutes)",
    "recipes/hyperfl/privacy_table3.py": "runs in tests/recipes/test_privacy_table3.py at its smoke size",
}


def _ids(items):
    return [f"{p.relative_to(ROOT / 'recipes')}:{i}" for p, i, _ in items]


COMMANDS = [(p, i, c) for p in RECIPES for i, c in enumerate(executed.header_commands(p)) if c[0] in CHECKED]


def test_the_headers_show_commands():
    shown = {p.name for p, _, _ in COMMANDS}
    assert {"digits-pefll.yaml", "ring-pefll.yaml", "cifar10-100-clients.yaml", "lpm-table2.yaml"} <= shown
    # the baselines of a shared recipe are among them
    sets = [" ".join(c) for p, _, c in COMMANDS if p.name == "digits-pefll.yaml"]
    assert any("algorithm=fedavg" in c for c in sets) and any("algorithm=local" in c for c in sets)


def _with(args: list[str], replace: dict[str, str]) -> list[str]:
    out = list(args)
    for i, a in enumerate(out[:-1]):
        if a in replace:
            out[i + 1] = replace[a]
    return out


@pytest.mark.parametrize("path,index,args", COMMANDS, ids=_ids(COMMANDS))
def test_header_command_config_resolves(path, index, args, cli, tmp_path, monkeypatch):
    """The command's config is accepted: with its inputs absent, the one error names the first input."""
    monkeypatch.chdir(ROOT)
    absent = {flag: str(tmp_path / f"absent{flag[2:]}") for flag in INPUTS}
    run = cli(*_with(args, {**absent, "--out": str(tmp_path / "out")}))
    assert run.code == 2, (run.out, run.err)
    assert "absent" in run.err and "unknown" not in run.err and "key" not in run.err, run.err
    assert not (tmp_path / "out").exists()


def test_every_header_script_is_run_or_checked_with_a_reason():
    scripts = {w for p in RECIPES for line in executed.header_lines(p) for c in executed.commands(line)
               for w in c[:3] if w.startswith("recipes/") and w.endswith(".py")}
    assert scripts <= set(SCRIPTS), scripts - set(SCRIPTS)


def test_shared_recipe_sections_name_algorithms_and_their_keys():
    """A section under train: is an algorithm's, and holds only keys that algorithm takes."""
    for path in RECIPES:
        train = (yaml.safe_load(path.read_text()) or {}).get("train")
        if not isinstance(train, dict):
            continue
        for key, value in train.items():
            if isinstance(value, dict):
                assert key in registry.names(), f"{path}: train.{key} is no algorithm"
                unknown = {k.replace("-", "_") for k in value} - set(registry.get(key).keys)
                assert not unknown, f"{path}: train.{key} holds keys {key} does not take: {unknown}"


# --- docs tier: the recipes whose data ship with pflx, their whole header at smoke size ----------------------

def _algorithm(argv: list[str], recipe: pathlib.Path) -> str:
    name = ((yaml.safe_load(recipe.read_text()) or {}).get("train") or {}).get("algorithm", "pefll")
    for i, a in enumerate(argv[:-1]):
        if a == "--algorithm":
            name = argv[i + 1]
        if a == "--set" and argv[i + 1].startswith("algorithm="):
            name = argv[i + 1].split("=", 1)[1]
    return name


def _counts_epochs(argv: list[str], recipe: pathlib.Path, name: str) -> bool:
    """Whether this train command's run counts local_epochs: the line's own setting, else its recipe's train
    section, else the algorithm's default."""
    value = "unset"
    train = (yaml.safe_load(recipe.read_text()) or {}).get("train") if recipe.suffix == ".yaml" else None
    for section in (train, (train or {}).get(name) if isinstance(train, dict) else None):  # shared, then own
        if isinstance(section, dict) and "local_epochs" in section:
            value = section["local_epochs"]
    for i, a in enumerate(argv[:-1]):
        if a == "--local-epochs":
            value = argv[i + 1]
        if a == "--set" and argv[i + 1].startswith("local_epochs="):
            value = argv[i + 1].split("=", 1)[1]
    if value == "unset":
        if "local_epochs" not in registry.get(name).keys:
            return False
        value = registry.train_config(name).local_epochs
    return value not in (None, "null", "None", "none", "~", "")


def smoke_line(line: str, recipe: pathlib.Path) -> str:
    """A header line at smoke size: train commands get SMOKE_SETS (where the algorithm takes the key) and the
    recipe's RECIPE_SETS appended as --set (the last --set wins); attack gets ATTACK_SMOKE; make gets
    executed.SMOKE's ROUNDS and SEEDS."""
    line = executed.smoke(line)
    argv = shlex.split(line, comments=True)
    if argv[:2] == ["pflx", "attack"]:
        return line.split(" #")[0] + " " + " ".join(ATTACK_SMOKE)
    if argv[:2] != ["pflx", "train"]:
        return line
    name = _algorithm(argv, recipe)
    keys = registry.get(name).keys
    # A round counts local_epochs or local_steps, never both (local_steps beside a set local_epochs is refused):
    # shrink the one this run counts.
    drop = "local_steps" if _counts_epochs(argv, recipe, name) else "local_epochs"
    sets = [f"{k}={v}" for k, v in SMOKE_SETS.items() if k in keys and k != drop]
    sets += RECIPE_SETS.get(str(recipe.relative_to(ROOT / "recipes")), [])
    return line.split(" #")[0] + "".join(f" --set {s}" for s in sets)


def _local_data(path: pathlib.Path) -> bool:
    part = (yaml.safe_load(path.read_text()) or {}).get("partition") or {}
    if not isinstance(part, dict):  # a compare spec (recipes/compare/ring-table.yaml) names a partition artifact
        return False
    return str(part.get("dataset", "")).startswith(("builtin:", "ring:", "leaf:runs/shk-smoke"))


CHAINS = [p for p in RECIPES if _local_data(p) and any(c[0] == "train" for c in executed.header_commands(p))]
FLOWER = {p for p in CHAINS if "flower" in p.parts}


def test_chains_cover_the_shared_quickstart_recipes():
    names = {p.name for p in CHAINS}
    assert {"digits-pefll.yaml", "ring-pefll.yaml", "digits-pfedhn-pc.yaml", "lpm-digits-smoke.yaml",
            "rotated-digits.yaml", "table-4-2.yaml", "shakespeare-smoke.yaml", "digits-smoke.yaml"} <= names


def run_header(path: pathlib.Path, cwd: pathlib.Path) -> dict[str, int]:
    """Every header line of the recipe, in order, in cwd: run at smoke size, or (a SCRIPTS entry with a reason)
    checked to parse. Returns how many times each program/subcommand ran."""
    done: dict[str, int] = {}
    for line in executed.header_lines(path):
        argv = shlex.split(line, comments=True)
        script = next((w for w in argv[:3] if w.endswith(".py")), None)
        if script is not None and SCRIPTS.get(script):
            why = executed.check_parses(argv, cwd)
            assert why is None, (str(path), line, why)
            continue
        cmd = smoke_line(line, path)
        r = executed.run_shell(cmd, cwd)
        assert r.returncode == 0, (str(path), cmd, r.stdout[-1500:], r.stderr[-3000:])
        key = script or " ".join(argv[:2])
        done[key] = done.get(key, 0) + 1
    return done


def _chain_params():
    for p in CHAINS:
        marks = [pytest.mark.docs] + ([pytest.mark.flower] if p in FLOWER else [])
        yield pytest.param(p, marks=marks, id=str(p.relative_to(ROOT / "recipes")))


@pytest.mark.parametrize("path", list(_chain_params()))
def test_the_header_runs_at_smoke_size(path, tmp_path):
    cwd = executed.scratch(tmp_path)
    done = run_header(path, cwd)
    assert done.get("pflx train", 0) >= 1
    for line in executed.header_lines(path):  # every artifact the header names was written
        for out in re.findall(r"--out (runs/\S+)", line):
            if not out.endswith(".png"):
                assert (cwd / out / "manifest.json").is_file() or (cwd / out).is_dir(), (line, out)
    if path.name == "shakespeare-smoke.yaml":  # the figure script's curves: three algorithms, both groups
        with open(cwd / "runs" / "shk-smoke-figure" / "curves.csv", newline="") as f:
            rows = list(csv.DictReader(f))
        assert {r["algorithm"] for r in rows} == {"pefll", "fedavg", "fedrep"}
        assert {r["group"] for r in rows} == {"train", "holdout"} and {int(r["round"]) for r in rows} == {1, 2}


# --- docs tier: every target of the two Makefiles -------------------------------------------------------------

def _targets(makefile: pathlib.Path) -> set[str]:
    """The Makefile's named targets (its .PHONY list, FORCE aside)."""
    phony = re.search(r"^\.PHONY:(.*)$", makefile.read_text(), re.M).group(1).split()
    return set(phony) - {"FORCE"}


def _make(*args, cwd=ROOT):
    return subprocess.run(["make", "-s", *args, f"PFLX={sys.executable} -m pfl_cli", f"PYTHON={sys.executable}"],
                          cwd=cwd, env=executed.env(), capture_output=True, text=True)


def test_the_tested_make_targets_are_all_of_them():
    assert _targets(ROOT / "recipes" / "Makefile") == {"all", "baselines"}
    assert _targets(ROOT / "recipes" / "compare" / "Makefile") == {"all"}


@pytest.mark.slow  # default-tier budget (2026-11-29): minutes-long or a learning run
def test_quickstart_makefile_all_as_its_header_gives_it(tmp_path):
    """`make -f recipes/Makefile ROOT=...` (its default ROUNDS, seconds); a second make does nothing."""
    done = _make("-f", "recipes/Makefile", f"ROOT={tmp_path}")
    assert done.returncode == 0, done.stderr
    stamp = (tmp_path / "part" / "manifest.json").stat().st_mtime_ns
    again = _make("-f", "recipes/Makefile", f"ROOT={tmp_path}")
    assert again.returncode == 0 and (tmp_path / "part" / "manifest.json").stat().st_mtime_ns == stamp
    assert "Nothing to be done" in again.stdout or again.stdout == ""
    assert (tmp_path / "pefll-holdout" / "manifest.json").is_file()


@pytest.mark.docs
def test_quickstart_makefile_baselines_at_two_rounds(tmp_path):
    """`make -f recipes/Makefile ROOT=... ROUNDS=2 baselines`: FedAvg and Local from the shared recipe."""
    done = _make("-f", "recipes/Makefile", f"ROOT={tmp_path}", "ROUNDS=2", "baselines")
    assert done.returncode == 0, done.stderr
    for name in ("fedavg", "local"):
        cfg = yaml.safe_load((tmp_path / name / "config.yaml").read_text())
        assert cfg["algorithm"] == name
        assert (tmp_path / f"{name}-holdout" / "metrics.json").is_file()
    assert yaml.safe_load((tmp_path / "fedavg" / "config.yaml").read_text())["lr"] == 0.005


@pytest.mark.docs
def test_compare_makefile_all_at_its_smoke_size(tmp_path):
    """The comparison Makefile's smoke line of its header (ROUNDS=2, two algorithms, three seeds): the table
    `pflx compare` wrote, printed by make, an interval on every row; a rerun does nothing; one seed more
    retrains only that seed."""
    out = tmp_path / "smoke"
    args = ["-C", "recipes/compare", "ROUNDS=2", "ALGORITHMS=fedavg local", f"OUT={out}"]
    printed = _make(*args)
    assert printed.returncode == 0, printed.stderr
    doc = json.loads((out / "table" / "table.json").read_text())
    assert [(r["label"], r["group"], r["seeds"]) for r in doc["rows"]] == [
        (a, g, [0, 1, 2]) for a in ("fedavg", "local") for g in ("train", "new")]
    assert all(r["accuracy_ci"] is not None and r["accuracy_ci"] >= 0 for r in doc["rows"])
    assert (out / "table" / "table.md").read_text() in printed.stdout
    config = json.loads((out / "fedavg" / "seed-1" / "manifest.json").read_text())["config"]
    assert config["rounds"] == 2 and config["seed"] == 1
    stamp = (out / "table" / "manifest.json").stat().st_mtime_ns
    assert _make(*args).returncode == 0
    assert (out / "table" / "manifest.json").stat().st_mtime_ns == stamp
    assert _make(*args, "SEEDS=0 1 2 3").returncode == 0
    doc = json.loads((out / "table" / "table.json").read_text())
    assert all(r["seeds"] == [0, 1, 2, 3] for r in doc["rows"])
    assert (out / "fedavg" / "seed-0" / "manifest.json").stat().st_mtime_ns < (out / "fedavg" / "seed-3" /
                                                                           "manifest.json").stat().st_mtime_ns


@pytest.mark.parametrize("makefile", ["recipes/Makefile", "recipes/compare/Makefile"])
def test_every_command_of_a_makefiles_header_parses(makefile, tmp_path):
    """Each `make ...` line of the Makefile's header comment, with -n (its target and variables resolve; nothing
    runs): the targets themselves run above, at smoke size."""
    lines = executed.header_lines(ROOT / makefile)
    assert len(lines) >= 2, lines
    cwd = executed.scratch(tmp_path)
    if any("runs/part" in line for line in lines):  # the partition of the README's first pipeline, reused
        readme = next(b for b in executed.blocks("README.md") if "pflx partition" in b.code)
        partition = next(ln for ln in readme.code.splitlines() if ln.startswith("pflx partition"))
        assert executed.run_shell(partition, cwd).returncode == 0
    for line in lines:
        r = executed.run_shell(line.replace("make ", "make -n ", 1), cwd, timeout=120)
        assert r.returncode == 0 and "pfl_cli" in r.stdout, (line, r.stderr[-2000:])


NOT_RUN = [(p, line) for p in RECIPES if p not in CHAINS for line in executed.header_lines(p)]


@pytest.mark.parametrize("path,line", NOT_RUN, ids=[f"{p.relative_to(ROOT / 'recipes')}:{i}"
                                                    for i, (p, _) in enumerate(NOT_RUN)])
def test_a_header_line_that_does_not_run_here_parses(path, line, tmp_path):
    """A recipe whose data are not shipped (or whose header trains nothing): each header line is checked to
    parse (executed.check_parses: --help, make -n); a `python -c` one-liner is compiled. Its train / predict /
    attack / cluster commands also resolve their config above."""
    cwd = executed.scratch(tmp_path)
    for argv in executed.commands(line):
        if argv[:2] == ["python", "-c"]:
            compile(argv[2], f"{path.name} header", "exec")
            continue
        why = executed.check_parses(argv, cwd)
        assert why is None, (line, why)
