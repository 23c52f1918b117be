"""`pflx compare --spec` with per-algorithm `tune:` entries: the whole tune -> train -> predict -> compare protocol
as one command (issue 41, item 2), on real temp dirs at smoke size (2 algorithms, 2 trials, 2 rounds, 2 seeds).

What is watched is the data: the tune artifacts against what `pflx tune` itself writes (the same command finds them
up to date), each seed's config against its study's best.yaml, the study.db's trials after a kill and a rerun, the
runs' manifests' mtimes (not retrained), the one progress display's lines; and the refusals: one line, exit 2,
nothing written, an existing study untouched."""

import csv
import json
import os
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from pfl_cli.cli.app import main as _main

ROOT = Path(__file__).resolve().parents[2]
PART = ["--dataset", "builtin:digits", "--classes-per-client", "2", "--class-shares", "equal", "--num-clients", "16",
        "--holdout-clients", "4", "--test-fraction", "0.3", "--format", "quiet"]
SET = "{local_steps: 3, mlp_hidden: [16], eval_every: 1}"
TUNE = "{trials: 2, rounds: 2, eval_every: 1}"


def main(argv):
    return _main([str(a) for a in argv])


@pytest.fixture(scope="module")
def part(tmp_path_factory):
    root = tmp_path_factory.mktemp("spec-protocol")
    assert main(["partition", *PART, "--out", root / "part"]) == 0
    return root / "part"


def write_spec(path: Path, part: Path, runs: Path, algorithms: str, seeds="[0, 1]") -> Path:
    path.write_text(f"partition: {part}\nseeds: {seeds}\nruns: {runs}\nalgorithms:\n{algorithms}")
    return path


SMOKE = (f"  fedavg: {{set: {SET}, tune: {TUNE}}}\n"
         f"  fedprox: {{set: {SET}, tune: {{trials: 2, rounds: 2, eval_every: 1, space: {{mu: 'log:1e-3:1'}}}}}}\n")


def study_trials(db: Path) -> list[tuple]:
    """(number, state, the searched values) of every trial in an Optuna SQLite study, read with sqlite3."""
    with sqlite3.connect(str(db)) as con:
        rows = con.execute("SELECT trial_id, number, state FROM trials ORDER BY number").fetchall()
        params = {tid: tuple(sorted(con.execute("SELECT param_name, param_value FROM trial_params WHERE trial_id=?",
                                                (tid,)).fetchall())) for tid, _n, _s in rows}
    return [(n, s, params[tid]) for tid, n, s in rows]


def test_one_spec_tunes_trains_predicts_and_compares(part, tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("PFLX_PROGRESS_EVERY", "0")  # every progress step a line: the display is read below
    runs = tmp_path / "runs"
    spec = write_spec(tmp_path / "spec.yaml", part, runs, SMOKE)
    capsys.readouterr()
    assert main(["compare", "--spec", spec, "--out", tmp_path / "t", "--format", "json"]) == 0
    captured = capsys.readouterr()
    doc = json.loads(captured.out)
    assert {(r["label"], r["group"]) for r in doc["rows"]} >= {("fedavg", "train"), ("fedprox", "train")}
    assert all(r["num_seeds"] == 2 for r in doc["rows"])
    for name, searched in (("fedavg", {"lr"}), ("fedprox", {"lr", "mu"})):
        tune = runs / f"tune-{name}"
        trials = study_trials(tune / "study.db")
        assert len(trials) == 2 and {s for _n, s, _p in trials} <= {"COMPLETE", "PRUNED"}
        with open(tune / "trials.csv", newline="") as fh:
            assert len(list(csv.DictReader(fh))) == 2
        best = yaml.safe_load((tune / "best.yaml").read_text())
        best.pop("provenance")  # what chose it (pfl_cli.privacy.study), not a config key
        assert best["rounds"] == 2 and best["local_steps"] == 3  # the study's budget and the spec's set
        for seed in (0, 1):
            run = yaml.safe_load((runs / name / f"seed-{seed}" / "config.yaml").read_text())
            assert run["seed"] == seed
            # each seed trains with its study's best values (and everything else best.yaml holds)
            assert {k: run[k] for k in searched} == {k: best[k] for k in searched}
            assert {k: v for k, v in run.items() if k != "seed"} == {k: v for k, v in best.items() if k != "seed"}
            assert (runs / name / f"seed-{seed}-new" / "manifest.json").is_file()
    # the tune artifact is exactly what `pflx tune` writes: the same command finds it up to date
    stamp = (runs / "tune-fedprox" / "manifest.json").stat().st_mtime_ns
    assert main(["tune", "--partition", part, "--algorithm", "fedprox", "--trials", 2, "--rounds", 2,
                 "--eval-every", 1, "--space", "mu=log:1e-3:1", "--set", "local_steps=3", "--set", "mlp_hidden=[16]",
                 "--out", runs / "tune-fedprox", "--format", "json"]) == 0
    assert json.loads(capsys.readouterr().out)["up_to_date"] is True
    assert (runs / "tune-fedprox" / "manifest.json").stat().st_mtime_ns == stamp
    # one progress display: the studies' rounds (2 x 2 x 2) then the trainings' (2 x 2 x 2), one total
    lines = [ln for ln in captured.err.splitlines() if ln.startswith("compare --spec: round ")]
    assert lines and all("/16 " in ln for ln in lines), captured.err
    assert lines[-1].startswith("compare --spec: round 16/16 (100%)")
    assert any("tune fedprox" in ln for ln in lines) and any("train fedavg, seed 1" in ln for ln in lines)
    done = [int(ln.split()[3].split("/")[0]) for ln in lines]
    assert done == sorted(done)
    # a rerun: nothing to do (no study trial, no training)
    mtimes = {p: p.stat().st_mtime_ns for p in runs.rglob("manifest.json")}
    assert main(["compare", "--spec", spec, "--out", tmp_path / "t", "--format", "json"]) == 0
    assert json.loads(capsys.readouterr().out)["up_to_date"] is True
    assert {p: p.stat().st_mtime_ns for p in runs.rglob("manifest.json")} == mtimes
    assert len(study_trials(runs / "tune-fedavg" / "study.db")) == 2


def _spawn(args, cwd):
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PFLX_PROGRESS_EVERY": "0"}
    return subprocess.Popen([sys.executable, "-m", "pfl_cli", *map(str, args)], cwd=cwd, env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)


def _kill_when(proc, ready, timeout=240.0):
    end = time.monotonic() + timeout
    while not ready():
        assert proc.poll() is None, proc.stderr.read()
        assert time.monotonic() < end, "the protocol did not reach the kill point"
        time.sleep(0.02)
    proc.send_signal(signal.SIGKILL)
    proc.wait()


def _completed(db: Path) -> int:
    if not db.is_file():
        return 0
    try:
        return sum(s == "COMPLETE" for _n, s, _p in study_trials(db))
    except sqlite3.Error:  # the study's tables are being created
        return 0


@pytest.mark.slow  # three cold processes: ~25 s of CPU, 90 s of wall time on a loaded 2-core machine
def test_a_kill_mid_protocol_then_a_rerun_redoes_nothing_finished(part, tmp_path):
    """SIGKILL once inside the first study (one trial complete), once after the first seed's training: each rerun
    continues; the finished study trials stay (the same number, the same values) and no finished run retrains."""
    runs = tmp_path / "runs"
    spec = write_spec(tmp_path / "spec.yaml", part, runs, SMOKE)
    args = ["compare", "--spec", spec, "--out", tmp_path / "t", "--format", "quiet"]
    staging = runs / ".tune-fedavg.study" / "study.db"
    _kill_when(_spawn(args, tmp_path), lambda: _completed(staging) >= 1)
    assert not (runs / "tune-fedavg").exists()
    kept = [t for t in study_trials(staging) if t[1] == "COMPLETE"]
    first = runs / "fedavg" / "seed-0" / "manifest.json"
    _kill_when(_spawn(args, tmp_path), first.is_file)
    trials = study_trials(runs / "tune-fedavg" / "study.db")
    assert [t for t in trials if t[1] == "COMPLETE"][:len(kept)] == kept  # the finished trials, not redone
    assert sum(t[1] in ("COMPLETE", "PRUNED") for t in trials) == 2
    studies = {n: (runs / f"tune-{n}" / "manifest.json").stat().st_mtime_ns for n in ("fedavg", "fedprox")}
    dbs = {n: study_trials(runs / f"tune-{n}" / "study.db") for n in ("fedavg", "fedprox")}
    stamp = first.stat().st_mtime_ns
    done = _spawn(args, tmp_path)
    assert done.wait(timeout=300) == 0, done.stderr.read()
    assert first.stat().st_mtime_ns == stamp  # the finished run is kept
    assert {n: (runs / f"tune-{n}" / "manifest.json").stat().st_mtime_ns for n in studies} == studies
    assert {n: study_trials(runs / f"tune-{n}" / "study.db") for n in dbs} == dbs  # no trial more
    for name in ("fedavg", "fedprox"):
        for seed in (0, 1):
            assert (runs / name / f"seed-{seed}-new" / "manifest.json").is_file()
    assert (tmp_path / "t" / "table.csv").is_file()


@pytest.mark.parametrize("algorithms,needle", [
    (f"  fedavgg: {{tune: {TUNE}}}\n", "algorithms.fedavgg: no such algorithm"),
    ("  fedavg: {tune: {trials: 0, rounds: 2}}\n", "algorithms.fedavg.tune.trials must be an integer >= 1; got 0"),
    ("  fedavg: {tune: {rounds: 2}}\n", "algorithms.fedavg.tune: missing key 'trials'"),
    ("  fedavg: {tune: {trials: 2, budget: 3}}\n", "algorithms.fedavg.tune: unknown key 'budget'"),
    ("  fedavg: {tune: {trials: 2, space: {mu: 'log:1e-3:1'}}}\n",
     "algorithms.fedavg.tune: unknown --space key 'mu' for algorithm 'fedavg'"),
    ("  fedavg: {tune: {trials: 2, sampler: annealing}}\n", "algorithms.fedavg.tune: --sampler must be one of"),
    ("  fedprox: {config: CONFIG, tune: {trials: 2, space: {mu: 'log:1e-3:1'}}}\n",
     "algorithms.fedprox.tune: the study searches 'mu', which algorithms.fedprox.config"),
    ("  fedavg: {set: {lr: 0.1}, tune: {trials: 2}}\n",
     "algorithms.fedavg.tune: the study searches 'lr', which algorithms.fedavg.set fixes"),
    ("  fedavg: {set: {dp_epsilon: 4.0, dp_population: 100}, tune: {trials: 2}}\n",
     "algorithms.fedavg.tune: the study would train under --dp"),
])
def test_a_bad_tune_entry_is_one_line_and_touches_nothing(part, tmp_path, cli, algorithms, needle):
    """Refused before any work: exit 2, one line naming the parameter, no --out, no runs, and a study already in
    the runs directory (a first algorithm's, in progress) untouched."""
    runs = tmp_path / "runs"
    staging = runs / ".tune-fedavg.study"
    staging.mkdir(parents=True)
    (staging / "study.db").write_bytes(b"a study in progress")
    config = tmp_path / "fedprox.yaml"
    config.write_text("algorithm: fedprox\nmu: 0.1\n")
    spec = write_spec(tmp_path / "spec.yaml", part, runs, algorithms.replace("CONFIG", str(config)))
    result = cli("compare", "--spec", spec, "--out", tmp_path / "t")
    assert result.code == 2 and needle in result.err and len(result.err.strip().splitlines()) == 1, result.err
    assert not (tmp_path / "t").exists()
    assert sorted(p.name for p in runs.iterdir()) == [".tune-fedavg.study"]
    assert (staging / "study.db").read_bytes() == b"a study in progress"


def test_compare_jobs_is_checked(part, tmp_path, cli):
    spec = write_spec(tmp_path / "spec.yaml", part, tmp_path / "runs", f"  fedavg: {{tune: {TUNE}}}\n")
    result = cli("compare", "--spec", spec, "--jobs", "0", "--out", tmp_path / "t")
    assert result.code == 2 and "--jobs must be an integer >= 1; got 0" in result.err, result.err
    assert not (tmp_path / "t").exists() and not (tmp_path / "runs").exists()


def _smoke_recipe(recipe: Path, part: Path, runs: Path, out: Path) -> Path:
    """The recipe at smoke size: every study 2 trials of 2 rounds, seeds [0, 1], its own partition and runs."""
    doc = yaml.safe_load(recipe.read_text())
    doc.update(partition=str(part), runs=str(runs), seeds=[0, 1])
    for entry in doc["algorithms"].values():
        entry["tune"] = {**entry["tune"], "trials": 2, "rounds": 2, "eval_every": 1}
    out.write_text(yaml.safe_dump(doc))
    return out


@pytest.mark.slow
def test_the_ring_table_recipe_runs_as_one_spec_at_smoke_size(tmp_path, capsys):
    """recipes/compare/ring-table.yaml, its header's partition, its ten algorithms tuned then trained (2 trials of
    2 rounds, 2 seeds): one table with every algorithm on training and new clients."""
    recipe = ROOT / "recipes" / "compare" / "ring-table.yaml"
    header = [ln for ln in recipe.read_text().splitlines() if ln.startswith("#   pflx partition")]
    import shlex

    argv = shlex.split(header[0][len("#   pflx "):])
    argv[argv.index("--out") + 1] = str(tmp_path / "part")
    assert main([*argv, "--format", "quiet"]) == 0
    spec = _smoke_recipe(recipe, tmp_path / "part", tmp_path / "runs", tmp_path / "spec.yaml")
    capsys.readouterr()
    assert main(["compare", "--spec", spec, "--out", tmp_path / "t", "--format", "json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    names = set(yaml.safe_load(recipe.read_text())["algorithms"])
    assert len(names) == 10 and "fedavg" in names
    assert {r["label"] for r in doc["rows"]} == names
    assert {(r["label"], r["group"]) for r in doc["rows"]} == {(n, g) for n in names for g in ("train", "new")}
    for name in names:
        assert (tmp_path / "runs" / f"tune-{name}" / "best.yaml").is_file()


def test_the_ring_table_recipe_resolves_every_study_and_training():
    """Default tier: the recipe's ten studies and thirty trainings resolve and their options pass pflx tune's checks
    (what the command checks before any work); the slow test above runs it."""
    from pfl_cli.cli.compare_run import _plan_spec
    from pfl_cli.compare.spec import load_spec

    steps = _plan_spec(load_spec(ROOT / "recipes" / "compare" / "ring-table.yaml"), nonprivate=False, jobs=1)
    assert sum(s.kind == "tune" for s in steps) == 10 and sum(s.kind == "train" for s in steps) == 30
    assert all(s.options.trials == 4 for s in steps if s.kind == "tune")


def test_the_time_left_ignores_every_step_found_done():
    """A protocol's finished steps (a study already complete, a run up to date) come as 'resumed' advances, not
    only the first: none of them may count as time spent, or the time left is the finished work's share too low."""
    import io

    from pfl_cli.cli.output import PlainProgress

    now = [0.0]
    bar = PlainProgress("compare --spec", 400, "round", io.StringIO(), 0, clock=lambda: now[0])
    bar.advance(100, status="resumed")  # a finished study
    bar.advance(100, status="resumed")  # a finished run, up to date
    now[0] = 1.0
    bar.advance(1)  # the first round run here (its time holds the set-up: not timed)
    now[0] = 10.0
    bar.advance(9)  # 9 rounds in 9 s since: 190 rounds left at 1 s each
    assert "left ~0:03:10" in bar.line(now[0]), bar.line(now[0])
