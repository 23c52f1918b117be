"""One study from two `pflx tune` processes sharing a real PostgreSQL database (issue 41, item 3).

The commands are the docs' (docs/commands/tune.md, "spread a study over several machines"): the page's partition
command and its `--storage postgresql://...` command, run as written but for the server's URL and one --out per
worker. Two workers started at the same moment on a fresh database together run exactly --trials trials, each
config once, and write the same best.yaml; a worker killed in the middle of a trial leaves it interrupted (not
counted) and the other runs it again; bad storage input is one line, exit 2, nothing written, the study untouched.
"""

from __future__ import annotations

import csv
import os
import re
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT / "tests" / "docs"))
import executed  # noqa: E402

pytestmark = pytest.mark.postgres
PAGE = "docs/commands/tune.md"
DOCS_URL = "postgresql://me@dbhost/studies"


def _docs_commands() -> tuple[list[str], list[str]]:
    """The page's partition command and its --storage command (each without `pflx`), exactly as shown."""
    cmds = [c for b in executed.blocks(PAGE) for c in executed.commands(executed.shell_code(b)) if c[0] == "pflx"]
    partition = next(c for c in cmds if c[1] == "partition")
    tune = next(c for c in cmds if c[1] == "tune" and DOCS_URL in c)
    return partition[1:], tune[1:]


PARTITION, TUNE = _docs_commands()
TRIALS = int(TUNE[TUNE.index("--trials") + 1])


def _env() -> dict:
    return {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}


def _pflx(args: list[str], cwd: Path, log: Path) -> subprocess.Popen:
    with open(log, "w") as f:
        return subprocess.Popen([sys.executable, "-m", "pfl_cli", *args], cwd=cwd, env=_env(), stdout=f,
                                stderr=subprocess.STDOUT)


def _worker(url: str, out: str) -> list[str]:
    args = [url if a == DOCS_URL else a for a in TUNE]
    args[args.index("--out") + 1] = out
    return args


@pytest.fixture(scope="module")
def home(tmp_path_factory):
    """A directory like the docs' working directory, with the page's partition (runs/part) in it."""
    home = tmp_path_factory.mktemp("pg")
    r = subprocess.run([sys.executable, "-m", "pfl_cli", *PARTITION], cwd=home, env=_env(), capture_output=True,
                       text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    return home


def _rows(out: Path) -> list[dict]:
    with open(out / "trials.csv") as f:
        return list(csv.DictReader(f))


def _study(url: str):
    import optuna

    from pfl_cli.tune.storage import storage_url

    name = TUNE[TUNE.index("--study-name") + 1]
    return optuna.load_study(study_name=name, storage=storage_url(url))


def _check_shared(home: Path, url: str, outs: list[str]) -> None:
    """Exactly TRIALS counted trials, each config once; every worker's best.yaml the same, and the study's best."""
    import optuna

    from pfl_cli.tune.study import best_trial, counted

    study = _study(url)
    assert counted(study) == TRIALS
    done = [t for t in study.trials if not t.system_attrs.get("pflx_interrupted")]
    assert len(done) == TRIALS and all(t.state.is_finished() for t in done), [(t.number, t.state) for t in done]
    configs = [tuple(sorted(t.params.items())) for t in done]
    assert len(set(configs)) == len(configs), f"a config trained twice: {configs}"
    assert all(t.state != optuna.trial.TrialState.FAIL for t in done)
    yamls = {(home / o / "best.yaml").read_text() for o in outs}
    assert len(yamls) == 1, "the workers wrote different best.yaml"
    best = best_trial(study)
    assert f"(trial {best.number}," in yamls.pop()
    for o in outs:  # each worker's trials.csv is the whole study
        rows = _rows(home / o)
        assert sorted(int(r["number"]) for r in rows if r["state"] != "interrupted") == sorted(t.number for t in done)


@pytest.mark.parametrize("attempt", range(3))
def test_two_workers_started_together_on_a_fresh_database_share_one_study(home, database, attempt):
    # both processes start at once on an empty database: both create Optuna's schema and the study (by hand, one of
    # two tries exited 2 with `CREATE TYPE studydirection ... already exists`; a worker could also read the other's
    # half-stored identity and refuse the study as another search)
    outs = [f"runs/tune-{attempt}-a", f"runs/tune-{attempt}-b"]
    procs = [_pflx(_worker(database, o), home, home / f"{Path(o).name}.log") for o in outs]
    codes = [p.wait(timeout=900) for p in procs]
    logs = [(home / f"{Path(o).name}.log").read_text()[-2000:] for o in outs]
    assert codes == [0, 0], logs
    _check_shared(home, database, outs)


def test_a_killed_workers_trial_is_interrupted_and_run_again(home, database):
    """Two workers; one is SIGKILLed in the middle of a trial: that trial is recorded interrupted (failed, not
    counted), the other worker runs the missing trial (the killed config again) and writes the study's best.yaml,
    and the killed worker's command run again finds the study complete and writes the same best.yaml."""
    import optuna

    outs = ["runs/kill-a", "runs/kill-b"]
    victim, survivor = (_pflx(_worker(database, o), home, home / f"{Path(o).name}.log") for o in outs)
    deadline = time.time() + 600
    killed = None
    while killed is None and time.time() < deadline:  # a trial of the victim's that has begun training
        time.sleep(0.1)
        assert victim.poll() is None, (home / "kill-a.log").read_text()[-2000:]
        try:
            running = _study(database).get_trials(deepcopy=False, states=(optuna.trial.TrialState.RUNNING,))
        except Exception:  # noqa: BLE001 - no schema or study yet
            continue
        mine = [t for t in running if t.system_attrs.get("pflx_pid") == victim.pid and t.params]
        if mine:
            victim.send_signal(signal.SIGKILL)
            victim.wait()
            killed = mine[0].number
    assert killed is not None, "the victim never started a trial"
    assert survivor.wait(timeout=900) == 0, (home / "kill-b.log").read_text()[-2000:]
    rows = {int(r["number"]): r for r in _rows(home / outs[1])}
    assert rows[killed]["state"] == "interrupted", rows[killed]
    study = _study(database)
    trial = study.trials[killed]
    assert trial.state == optuna.trial.TrialState.FAIL and trial.system_attrs.get("pflx_interrupted")
    assert any(t.params == trial.params and not t.system_attrs.get("pflx_interrupted") for t in study.trials), \
        "the interrupted config was not run again"
    again = subprocess.run([sys.executable, "-m", "pfl_cli", *_worker(database, outs[0])], cwd=home, env=_env(),
                           capture_output=True, text=True, timeout=900)
    assert again.returncode == 0, again.stderr[-2000:]
    _check_shared(home, database, outs)


def _one_line_refusal(r, *needles) -> None:
    assert r.returncode == 2, (r.returncode, r.stderr[-2000:])
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("pflx: error:"), r.stderr
    for needle in needles:
        assert needle in lines[0], (needle, lines[0])


def _snapshot(url: str):
    study = _study(url)
    return study.user_attrs, [(t.number, t.state, t.params, t.value) for t in study.trials]


def test_bad_storage_is_one_line_exit_2_nothing_written_and_the_study_untouched(home, database, pg_server):
    # a database the server does not have
    out = home / "runs" / "bad-db"
    r = subprocess.run([sys.executable, "-m", "pfl_cli", *_worker(f"{pg_server}/no_such_db", str(out))], cwd=home,
                       env=_env(), capture_output=True, text=True, timeout=300)
    _one_line_refusal(r, "--storage", "cannot open the study storage", "no_such_db")
    assert not out.exists() and not list(out.parent.glob(".bad-db*"))

    # a study that exists, made by another search: another algorithm, then another partition
    first = _worker(database, "runs/first")
    first[first.index("--trials") + 1] = "2"  # a study to refuse against: two trials make one
    r = subprocess.run([sys.executable, "-m", "pfl_cli", *first], cwd=home, env=_env(), capture_output=True,
                       text=True, timeout=900)
    assert r.returncode == 0, r.stderr[-2000:]
    before = _snapshot(database)
    other_part = list(PARTITION)
    other_part[other_part.index("--out") + 1] = "runs/part-other"
    other_part[other_part.index("--num-clients") + 1] = str(int(other_part[other_part.index("--num-clients") + 1]) + 2)
    assert subprocess.run([sys.executable, "-m", "pfl_cli", *other_part], cwd=home, env=_env(),
                          capture_output=True, timeout=300).returncode == 0
    for change, named in ((["--algorithm", "fedprox"], "algorithm (--algorithm)"),
                          (["--partition", "runs/part-other"], "partition (--partition)")):
        args = _worker(database, "runs/other")
        args[args.index(change[0]) + 1] = change[1]
        r = subprocess.run([sys.executable, "-m", "pfl_cli", *args], cwd=home, env=_env(), capture_output=True,
                           text=True, timeout=300)
        _one_line_refusal(r, "--storage", named)
        assert not (home / "runs" / "other").exists() and not list((home / "runs").glob(".other*"))
        assert _snapshot(database) == before, "the refused command changed the study"


def test_the_driver_is_named_when_missing(home, database):
    """A bare postgresql:// URL with no driver installed: one line naming the extra that installs it."""
    code = ("import sys; sys.modules['psycopg'] = sys.modules['psycopg2'] = None; "
            "from pfl_cli.cli.app import main; sys.exit(main(sys.argv[1:]))")
    out = home / "runs" / "no-driver"
    r = subprocess.run([sys.executable, "-c", code, *_worker(database, str(out))], cwd=home, env=_env(),
                       capture_output=True, text=True, timeout=300)
    _one_line_refusal(r, "--storage", 'pip install "pflx[postgres]"')
    assert not re.search(r"postgres@", r.stderr), "the URL's user is shown"
    assert not out.exists()
