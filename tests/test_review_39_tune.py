"""Review of `pflx tune`'s study identity and Ctrl-C (issue 39): what a new user with a long study ran into.

- A space typed two ways that draws and stores the same trials has one identity (a numeric ``choice`` is
  stored by its rank among its values: ``choice:0.0,0.5``, ``choice:0,0.5`` and ``choice:0.5,0`` are one space),
  and two spaces that draw differently never share one (bounds that differ past ``%g``'s six digits).
- A study made before identities were recorded is refused with what can be done about it (giving "the study's
  settings again" cannot make an earlier pflx's study resumable).
- Ctrl-C once the artifact is in place does not say "nothing was written to --out".
"""

import optuna
import pytest

from pfl_cli import registry
from pfl_cli.tune.space import resolve_space
from pfl_cli.tune.study import identity_differences, study_identity

optuna.logging.set_verbosity(optuna.logging.WARNING)
SMALL = ["--algorithm", "fedavg", "--trials", "1", "--rounds", "2", "--eval-every", "1", "--local-steps", "3",
         "--clients-per-round", "4", "--set", "mlp_hidden=[16]", "--device", "cpu"]


def _identity(space: dict) -> dict:
    cfg = registry.train_config("fedavg", rounds=2)
    params = resolve_space(registry.get("fedavg"), space)
    return study_identity(cfg, params, {"group": "train", "metric": "mean_accuracy"},
                          validation={"fraction": 0.2}, partition="p")


@pytest.mark.parametrize("a, b", [
    ({"momentum": "choice:0.0,0.5"}, {"momentum": "choice:0,0.5"}),
    ({"momentum": "choice:0.0,0.5"}, {"momentum": "choice:0.5,0"}),
    ({"local_steps": "choice:5,10"}, {"local_steps": "choice:10,5"}),
    ({"lr": "log:1e-4:1e-3"}, {"lr": "log:0.0001:0.001"}),
    ({"lr": "log:1e-4:1e-3", "momentum": "float:0:0.9"}, {"momentum": "float:0.0:.9", "lr": "log:1E-4:0.001"}),
])
def test_one_space_typed_two_ways_is_one_identity(a, b):
    """The same draws and the same stored values (a numeric choice's rank among its sorted values, see
    Param.ordered): the same study. Before, 'choice:0,0.5' was refused against 'choice:0.0,0.5'."""
    assert identity_differences(_identity(a), _identity(b)) == []


@pytest.mark.parametrize("a, b", [
    ({"lr": "log:1e-3:0.1"}, {"lr": "log:1e-3:0.1000001"}),  # %g printed both as 0.1
    ({"lr": "float:0.1234567:0.5"}, {"lr": "float:0.1234568:0.5"}),
    ({"model_arch": "choice:mlp,lenet"}, {"model_arch": "choice:lenet,mlp"}),  # labels: Optuna's choices in order
])
def test_spaces_that_draw_differently_are_two_identities(a, b):
    assert [d.split(" (")[0] for d in identity_differences(_identity(a), _identity(b))] == ["space"]


def test_a_space_typed_two_ways_resumes_through_the_cli(cli, tmp_path):
    """End to end on one --storage: the second spelling continues the first's study (no trial runs again)."""
    assert cli("partition", "--dataset", "builtin:digits", "--classes-per-client", "2", "--num-clients", "8",
               "--format", "quiet", "--out", tmp_path / "part").code == 0
    storage = f"sqlite:///{tmp_path / 's.db'}"
    common = ["tune", "--partition", tmp_path / "part", *SMALL, "--storage", storage, "--study-name", "s",
              "--space", "lr=log:1e-2:1e-1"]
    r = cli(*common, "--space", "momentum=choice:0.0,0.5", "--format", "quiet", "--out", tmp_path / "a")
    assert r.code == 0, r.err
    r = cli(*common, "--space", "momentum=choice:0.5,0", "--out", tmp_path / "b")
    assert r.code == 0, r.err
    assert "1 of 1 trials already there" in r.err
    assert (tmp_path / "a" / "trials.csv").read_text() == (tmp_path / "b" / "trials.csv").read_text()


def test_a_study_of_an_earlier_pflx_is_refused_with_what_to_do(cli, tmp_path):
    """A study with trials and no identity (made before identities were recorded) cannot be checked: the one
    line says so and offers what works (another name, or --force), not 'give the study's settings again'."""
    assert cli("partition", "--dataset", "builtin:digits", "--classes-per-client", "2", "--num-clients", "8",
               "--format", "quiet", "--out", tmp_path / "part").code == 0
    storage = f"sqlite:///{tmp_path / 's.db'}"
    old = optuna.create_study(storage=storage, study_name="s", direction="maximize")
    trial = old.ask()
    trial.suggest_float("lr", 1e-2, 1e-1, log=True)
    old.tell(trial, 0.5)
    r = cli("tune", "--partition", tmp_path / "part", *SMALL, "--storage", storage, "--study-name", "s",
            "--space", "lr=log:1e-2:1e-1", "--out", tmp_path / "o")
    assert r.code == 2 and len(r.err.strip().splitlines()) == 1
    assert "made by an earlier pflx" in r.err and "--force" in r.err and "--study-name" in r.err
    assert "Give the study's settings again" not in r.err
    assert not (tmp_path / "o").exists() and len(optuna.load_study(study_name="s", storage=storage).trials) == 1


def test_ctrl_c_after_the_artifact_is_written_does_not_say_nothing_was_written(cli, tmp_path, monkeypatch):
    """Ctrl-C after the swap (while the staging study is removed, or the summary printed): the artifact is whole,
    and the line says so; the same command again finds it up to date. Before: 'nothing was written to --out'."""
    from pfl_cli.cli import tune_run

    assert cli("partition", "--dataset", "builtin:digits", "--classes-per-client", "2", "--num-clients", "8",
               "--format", "quiet", "--out", tmp_path / "part").code == 0
    args = ["tune", "--partition", tmp_path / "part", *SMALL, "--space", "lr=log:1e-2:1e-1", "--out", tmp_path / "o"]

    def interrupted(*_a, **_k):
        raise KeyboardInterrupt

    monkeypatch.setattr(tune_run, "_print_summary", interrupted)
    r = cli(*args)
    assert r.code == 130 and r.err.count("pflx: error:") == 1
    assert (tmp_path / "o" / "best.yaml").is_file()
    assert "nothing was written" not in r.err and "is complete" in r.err, r.err
    monkeypatch.undo()
    r = cli(*args)
    assert r.code == 0 and "up to date" in r.err


def _children(pid: int) -> list[int]:
    from pathlib import Path

    out = []
    for task in Path(f"/proc/{pid}/task").glob("*"):
        try:
            out += [int(c) for c in (task / "children").read_text().split()]
        except OSError:
            pass
    return out


@pytest.mark.parametrize("delay", [0.2, pytest.param(1.0, marks=pytest.mark.slow),
                                   pytest.param(3.0, marks=pytest.mark.slow)])
def test_ctrl_c_while_jobs_workers_start_is_one_line(cli, tmp_path, delay):
    """tune --jobs 2, Ctrl-C to the process group ``delay`` s after the workers exist (while spawn's fresh
    interpreters still import torch and pflx): exit 130, the one line, no worker's traceback. Before, a worker
    interrupted in its imports printed a KeyboardInterrupt traceback of 30 lines above the one line."""
    import os
    import signal
    import subprocess
    import sys
    import time

    if not os.path.isdir("/proc/self/task"):
        pytest.skip("reads the worker processes from /proc (Linux)")
    assert cli("partition", "--dataset", "builtin:digits", "--classes-per-client", "2", "--num-clients", "8",
               "--format", "quiet", "--out", tmp_path / "part").code == 0
    cmd = [sys.executable, "-m", "pfl_cli", "tune", "--partition", str(tmp_path / "part"), *SMALL[:3], "40",
           "--rounds", "30", "--jobs", "2", "--space", "lr=log:1e-2:1e-1", "--format", "quiet",
           "--out", str(tmp_path / "o")]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    deadline = time.time() + 120
    while len(_children(proc.pid)) < 2 and proc.poll() is None and time.time() < deadline:
        time.sleep(0.02)
    time.sleep(delay)
    os.killpg(proc.pid, signal.SIGINT)
    _out, err = proc.communicate(timeout=120)
    err = err.decode()
    assert proc.returncode == 130, err
    assert "Traceback" not in err and err.count("pflx: error: interrupted") == 1, err
    assert not (tmp_path / "o").exists()
