"""Progress on stderr: plain lines at a steady cadence off a terminal, none with --format quiet,
nothing private under --dp, stdout a single object with --format json."""

from __future__ import annotations

import io
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from pfl_cli.cli.output import PlainProgress

ROOT = Path(__file__).resolve().parents[2]
# The first line has no time left (its step holds the set-up: issue 49, finding 18); every later one has.
LINE = re.compile(r"^train: round (\d+)/(\d+) \((\d+)%\), elapsed \d+:\d\d:\d\d(?:, left ~\d+:\d\d:\d\d)?(, .*)?$")


class FakeClock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_plain_progress_cadence_and_time_left_against_hand_computed_values():
    clock, stream = FakeClock(), io.StringIO()
    bar = PlainProgress("train", 10, "round", stream, every=5.0, clock=clock)
    for step in range(10):  # 2 s per round: lines at rounds 1 (first), 4, 7 (>= 5 s after the last) and 10 (end)
        clock.now += 2.0
        bar.advance(1, status=f"loss {1 / (step + 1):.3f}")
    lines = stream.getvalue().splitlines()
    assert [int(line.split()[2].split("/")[0]) for line in lines] == [1, 4, 7, 10]
    # Round 1: no time left yet (its step held the set-up). Round 4: 2 s per round since round 1, 6 left -> 12 s.
    assert lines[0] == "train: round 1/10 (10%), elapsed 0:00:02, loss 1.000"
    assert lines[1] == "train: round 4/10 (40%), elapsed 0:00:08, left ~0:00:12, loss 0.250"
    assert lines[-1] == "train: round 10/10 (100%), elapsed 0:00:20, left ~0:00:00, loss 0.100"
    bar.advance(0)  # nothing after the final line
    assert len(stream.getvalue().splitlines()) == 4


def test_plain_progress_resumed_run_times_only_the_rounds_run_here():
    clock, stream = FakeClock(), io.StringIO()
    bar = PlainProgress("train", 100, "round", stream, every=0.0, clock=clock)
    bar.advance(50, status="resumed")  # a checkpoint at round 50: no time spent here
    clock.now += 1.0
    bar.advance(1)  # the first round run here: no time left yet
    assert stream.getvalue().splitlines()[-1] == "train: round 51/100 (51%), elapsed 0:00:01"
    clock.now += 9.0
    bar.advance(9)  # 1 s per round since the first, 40 rounds left
    assert stream.getvalue().splitlines()[-1] == "train: round 60/100 (60%), elapsed 0:00:10, left ~0:00:40"


def test_plain_progress_without_total_says_no_time_left():
    stream = io.StringIO()
    PlainProgress("predict", None, "client", stream, every=0.0, clock=FakeClock()).advance(3)
    assert stream.getvalue() == "predict: client 3, elapsed 0:00:00\n"


@pytest.fixture(scope="module")
def part(tmp_path_factory):
    from pfl_cli.cli.app import main

    root = tmp_path_factory.mktemp("progress")
    assert main(["partition", "--dirichlet", "0.5", "-n", "12", "--holdout-clients", "3", "--out", str(root / "part"),
                 "--format", "quiet"]) == 0
    return root


def _env() -> dict:
    return dict(os.environ, PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1", PFLX_PROGRESS_EVERY="0")


def test_train_with_stderr_to_a_file_writes_progress_lines_while_it_runs(part):
    log = part / "train.log"
    args = [sys.executable, "-m", "pfl_cli", "train", "--partition", str(part / "part"), "--algorithm", "fedavg",
            "--rounds", "300", "--eval-every", "100", "--local-steps", "2", "--out", str(part / "fedavg")]
    with open(log, "w") as err, open(part / "train.out", "w") as out:
        proc = subprocess.Popen(args, stdout=out, stderr=err, env=_env())
        seen_while_running = []
        deadline = time.monotonic() + 300
        while proc.poll() is None and time.monotonic() < deadline:
            lines = [ln for ln in log.read_text().splitlines() if LINE.match(ln)]
            if lines and proc.poll() is None:
                seen_while_running = lines
                break
            time.sleep(0.05)
        assert proc.wait(timeout=300) == 0, log.read_text()
    assert seen_while_running, "no progress line reached the log before train ended"
    lines = log.read_text().splitlines()
    assert lines and all(LINE.match(ln) for ln in lines), lines
    assert lines[-1].startswith("train: round 300/300 (100%)") and ", loss " in lines[-1]
    rounds = [int(LINE.match(ln).group(1)) for ln in lines]
    assert rounds == sorted(rounds) and rounds[0] == 1


@pytest.mark.slow  # default-tier budget (2026-11-29): minutes-long or a learning run
def test_quiet_is_silent_and_json_keeps_stdout_one_object(part):
    base = [sys.executable, "-m", "pfl_cli", "train", "--partition", str(part / "part"), "--algorithm", "fedavg",
            "--rounds", "4", "--eval-every", "2", "--local-steps", "1"]
    quiet = subprocess.run([*base, "--out", str(part / "q"), "--format", "quiet"], env=_env(), capture_output=True,
                           text=True, timeout=300)
    assert quiet.returncode == 0 and quiet.stdout == "" and quiet.stderr == ""
    js = subprocess.run([*base, "--out", str(part / "j"), "--format", "json"], env=_env(), capture_output=True,
                        text=True, timeout=300)
    assert js.returncode == 0, js.stderr
    assert isinstance(json.loads(js.stdout), dict)  # one object, nothing else on stdout
    assert [int(LINE.match(ln).group(1)) for ln in js.stderr.splitlines() if LINE.match(ln)] == [1, 2, 3, 4]


def test_dp_progress_lines_carry_no_loss_or_accuracy(part):
    proc = subprocess.run([sys.executable, "-m", "pfl_cli", "train", "--partition", str(part / "part"), "--algorithm",
                           "fedavg", "--rounds", "4", "--eval-every", "2", "--local-steps", "1", "--clients-per-round",
                           "4", "--set", "normalize=false", "--dp", "eps=4,delta=1e-6,clip=0.5,population=1000", "--out", str(part / "dp"),
                           "--format", "json"], env=_env(), capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    lines = [ln for ln in proc.stderr.splitlines() if ln.startswith("train: round")]
    assert len(lines) == 4 and all(LINE.match(ln) and LINE.match(ln).group(4) is None for ln in lines), lines


# ---------------------------------------------------------------------------- mdm-fit, cluster, simulate
TIME = r"elapsed \d+:\d\d:\d\d(?:, left ~\d+:\d\d:\d\d)?"
STAGE_LINES = {
    "mdm-fit": re.compile(rf"^mdm-fit: round (\d+)/(\d+) \(\d+%\), {TIME}, K \d, restart \d/\d"
                          r"(, mean log-likelihood -?\d+\.\d{4})?$"),
    "cluster": re.compile(rf"^cluster: step (\d+)/(\d+) \(\d+%\), {TIME}, (FedDP-Init step \d/3: [a-z ]+|"
                          r"FedDP-Lloyds step \d+/\d+|k candidates: server costs|[a-z+-]+ init|"
                          r"k-means cost on the client data( \(nonprivate.json\))?)$"),
    "simulate": re.compile(rf"^simulate: step (\d+)/(\d+) \(\d+%\), {TIME}, (histograms of \d+ clients drawn \([a-z-]+\)|"
                           r"class \d+/\d+ dealt|test split and holdout clients)$"),
}
GMM_CLIENTS = "gmm:clients?d=20&k=4&num_clients=12&client_size=150&seed=1"
GMM_SERVER = "gmm:server?d=20&k=4&seed=1"


@pytest.fixture(scope="module")
def stages(part):
    """The commands of the three stages, on a digits partition, a fitted MDM and a Gaussian-mixture partition."""
    from pfl_cli.cli.app import main

    assert main(["mdm-fit", "--partition", str(part / "part"), "--components", "1", "--rounds", "3", "--out",
                 str(part / "mdm"), "--format", "quiet"]) == 0
    assert main(["partition", "--dataset", GMM_CLIENTS, "--natural-id", "--test-fraction", "0", "--num-clients", "12",
                 "--out", str(part / "gmm"), "--format", "quiet"]) == 0
    return {
        "mdm-fit": ["mdm-fit", "--partition", str(part / "part"), "--components", "1-2", "--rounds", "4",
                    "--restarts", "2"],
        "cluster": ["cluster", "--partition", str(part / "gmm"), "--server-data", GMM_SERVER, "--k", "4", "--no-dp",
                    "--lloyds-steps", "2"],
        "simulate": ["simulate", "--model", str(part / "mdm"), "--num-clients", "30"],
    }


def _progress_lines(command: str, stderr: str) -> list[re.Match]:
    lines = [ln for ln in stderr.splitlines() if ln.startswith(f"{command}: ")]
    assert lines and all(STAGE_LINES[command].match(ln) for ln in lines), stderr
    return [STAGE_LINES[command].match(ln) for ln in lines]


@pytest.mark.parametrize("command", ["mdm-fit", "cluster", "simulate"])
def test_stage_with_stderr_to_a_file_writes_plain_progress_lines(stages, part, command):
    log = part / f"{command}.log"
    with open(log, "w") as err:
        proc = subprocess.run([sys.executable, "-m", "pfl_cli", *stages[command], "--out", str(part / f"file-{command}")],
                              stdout=subprocess.PIPE, stderr=err, env=_env(), text=True, timeout=300)
    assert proc.returncode == 0, log.read_text()
    matches = _progress_lines(command, log.read_text())
    done = [int(m.group(1)) for m in matches]
    total = {int(m.group(2)) for m in matches}
    expected = {"mdm-fit": 2 * 2 * 4, "cluster": 3 + 2 + 1, "simulate": 10 + 2}[command]
    assert total == {expected} and done == list(range(1, expected + 1))  # cadence forced to every step
    if command == "mdm-fit":  # not under --dp: the running log-likelihood is shown
        assert all(m.group(3) for m in matches)


@pytest.mark.parametrize("command", ["mdm-fit", "cluster", "simulate"])
def test_stage_quiet_is_silent_and_json_keeps_stdout_one_object(stages, part, command, capsys, monkeypatch):
    from pfl_cli.cli.app import main

    monkeypatch.setenv("PFLX_PROGRESS_EVERY", "0")
    assert main([*stages[command], "--out", str(part / f"q-{command}"), "--format", "quiet"]) == 0
    assert capsys.readouterr() == ("", "")
    assert main([*stages[command], "--out", str(part / f"j-{command}"), "--format", "json"]) == 0
    out, err = capsys.readouterr()
    assert isinstance(json.loads(out), dict)  # one object, nothing else on stdout
    assert _progress_lines(command, err)


def test_dp_stage_progress_lines_show_no_number_from_private_data(stages, part, capsys, monkeypatch):
    from pfl_cli.cli.app import main

    monkeypatch.setenv("PFLX_PROGRESS_EVERY", "0")
    assert main(["mdm-fit", "--partition", str(part / "part"), "--components", "2", "--rounds", "3", "--max-samples",
                 "200", "--dp", "eps=1,delta=1e-6,population=1000", "--out", str(part / "mdm-dp"),
                 "--format", "json"]) == 0
    err = capsys.readouterr().err
    lines = _progress_lines("mdm-fit", err)
    assert len(lines) == 3 and not any(m.group(3) for m in lines) and "log-likelihood" not in err
    assert main(["cluster", "--partition", str(part / "gmm"), "--server-data", GMM_SERVER, "--k", "4", "--dp",
                 "eps=1,delta=1e-6", "--lloyds-steps", "1", "--out", str(part / "km-dp"), "--format", "json"]) == 0
    err = capsys.readouterr().err
    lines = _progress_lines("cluster", err)
    assert "cost" not in err
    # FedDP-Init's 3 releases and 1 Lloyd round; no evaluation on the client data without --write-nonprivate.
    assert [m.group(3) for m in lines] == ["FedDP-Init step 1/3: projection", "FedDP-Init step 2/3: server weights",
                                          "FedDP-Init step 3/3: centers", "FedDP-Lloyds step 1/1"]


# ---------------------------------------------------------------------------- heartbeat, tune in rounds, wide tables
def test_heartbeat_writes_a_line_when_a_step_outlasts_the_cadence():
    clock, stream = FakeClock(), io.StringIO()
    bar = PlainProgress("tune", 40, "round", stream, every=10.0, clock=clock)
    clock.now += 11.0
    bar.tick()  # a first round slower than the cadence: the log is not silent until it ends
    bar.advance(1, status="trial 1/4")  # a line was just written: the cadence holds
    clock.now += 4.0
    bar.tick()  # within the cadence: nothing
    clock.now += 7.0
    bar.tick()  # 11 s since the last line: one, with the last status; no time left from the first round alone
    clock.now += 11.0
    bar.advance(1, status="trial 1/4")  # round 2, 22 s after round 1 (at 11 s): 22 s a round, 38 left
    assert stream.getvalue().splitlines() == [
        "tune: round 0/40 (0%), elapsed 0:00:11",
        "tune: round 1/40 (2%), elapsed 0:00:22, trial 1/4",
        "tune: round 2/40 (5%), elapsed 0:00:33, left ~0:13:56, trial 1/4",
    ]
    bar.advance(38)
    clock.now += 60.0
    bar.tick()  # the work is done: no line after the final one
    assert stream.getvalue().splitlines()[-1].startswith("tune: round 40/40 (100%)") and len(
        stream.getvalue().splitlines()) == 4


TUNE_LINE = re.compile(r"^tune: round (\d+)/(\d+) \(\d+%\), elapsed \d+:\d\d:\d\d(, left ~\d+:\d\d:\d\d)?"
                       r"(, trial (\d+)/(\d+))?(, best \d+\.\d% \(trial \d+\))?$")


@pytest.mark.slow  # default-tier budget (2026-11-29): minutes-long or a learning run
def test_tune_progress_counts_rounds_of_every_trial_and_says_when_curves_still_rise(part):
    proc = subprocess.run([sys.executable, "-m", "pfl_cli", "tune", "--partition", str(part / "part"), "--algorithm",
                           "fedavg", "--trials", "2", "--rounds", "3", "--set", "eval_every=1", "--set",
                           "local_steps=2", "--space", "lr=log:0.05:0.1", "--out", str(part / "tune")],
                          env=_env(), capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    lines = [TUNE_LINE.match(ln) for ln in proc.stderr.splitlines() if ln.startswith("tune: ")]
    assert lines and all(lines), proc.stderr
    assert [int(m.group(1)) for m in lines] == list(range(1, 7)) and {int(m.group(2)) for m in lines} == {6}
    assert [m.group(5) for m in lines[:3]] == ["1", "1", "1"] and lines[3].group(5) == "2"
    assert lines[3].group(7)  # the best trial so far, once the first has finished
    # digits at lr 0.05-0.1 after 1, 2, 3 rounds of 2 steps: every curve still rises
    import optuna

    study = optuna.load_study(study_name="pflx-tune-fedavg", storage=f"sqlite:///{part / 'tune' / 'study.db'}")
    curves = [[v for _, v in sorted(t.intermediate_values.items())] for t in study.trials]
    if all(c[-1] > c[-2] for c in curves):
        assert "still rises at its last round (3)" in proc.stderr and "try --rounds 6" in proc.stderr
    else:
        assert "still rises" not in proc.stderr


def test_still_rising_needs_every_finished_curve_to_rise_at_its_end():
    import optuna

    from pfl_cli.tune.study import still_rising

    def study_of(curves, pruned=()):
        study = optuna.create_study(direction="maximize")
        for i, curve in enumerate(curves):
            trial = study.ask()
            for step, value in enumerate(curve, 1):
                trial.report(value, step)
            state = optuna.trial.TrialState.PRUNED if i in pruned else optuna.trial.TrialState.COMPLETE
            study.tell(trial, None if i in pruned else curve[-1], state=state)
        return study

    assert still_rising(study_of([[0.1, 0.2, 0.3], [0.2, 0.25, 0.26]])) == 3
    assert still_rising(study_of([[0.1, 0.2, 0.3], [0.2, 0.3, 0.3]])) is None  # one has levelled off
    assert still_rising(study_of([[0.1, 0.2, 0.3], [0.5, 0.1]], pruned=(1,))) == 3  # a pruned curve stopped early
    assert still_rising(study_of([[0.1]])) is None  # one point says nothing of a slope


def test_tables_in_a_pipe_keep_their_columns(part):
    proc = subprocess.run([sys.executable, "-m", "pfl_cli", "algorithms"], env={**_env(), "COLUMNS": ""},
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    rows = [ln for ln in proc.stdout.splitlines() if ln.startswith("│")]
    from pfl_cli import registry

    assert "…" not in proc.stdout  # no cell cut to fit 80 columns
    assert [r.split("│")[1].strip() for r in rows] == list(registry.names())  # one line a row: nothing wrapped
