"""`pflx compare --spec` trains the seeds of a stackable algorithm as one stack on a run axis (its ``stack:`` key,
default 8), each seed written where and as its own training writes it: the models are compared with separate
`pflx train` runs tensor by tensor, the artifacts file by file; a half-finished protocol continues (a finished run
kept, a killed stack resumed from its runs' checkpoints); the stack key's refusals are one line."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from pfl_cli.cli.app import main as _main

PART = ["--dataset", "builtin:digits", "--classes-per-client", "2", "--class-shares", "equal", "--num-clients", "16",
        "--holdout-clients", "4", "--test-fraction", "0.3", "--format", "quiet"]
# every key a train flag or --set can give: the separate runs below get the same values
SET = {"rounds": 3, "eval_every": 1, "clients_per_round": 4, "local_steps": 3, "lr": 0.05, "momentum": 0.5,
       "mlp_hidden": [16]}


def main(argv):
    return _main([str(a) for a in argv])


@pytest.fixture(scope="module")
def part(tmp_path_factory):
    root = tmp_path_factory.mktemp("spec-stack")
    assert main(["partition", *PART, "--out", root / "part"]) == 0
    return root / "part"


def write_spec(path: Path, part: Path, runs: Path, seeds, extra: str = "", sets: dict = SET) -> Path:
    path.write_text(f"partition: {part}\nseeds: {json.dumps(list(seeds))}\nruns: {runs}\nnew_clients: false\n{extra}"
                    f"algorithms:\n  fedavg: {{set: {json.dumps(sets)}}}\n")
    return path


def separate(part: Path, out: Path, seed: int, sets: dict = SET) -> Path:
    """`pflx train` of one seed, the spec's set as --set."""
    args = [a for k, v in sets.items() for a in ("--set", f"{k}={json.dumps(v)}")]
    assert main(["train", "--partition", part, "--algorithm", "fedavg", "--seed", seed, *args, "--out", out,
                 "--format", "quiet"]) == 0
    return out


def weights(run: Path) -> dict:
    return torch.load(run / "model.pt", weights_only=True)["weights"]["client"]


def assert_same_run(got: Path, alone: Path) -> None:
    """The stacked seed's artifact against the separate run's: model bit-identical, every file but the manifest
    byte-identical."""
    a, b = weights(got), weights(alone)
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a), \
        max(float((a[k] - b[k]).abs().max()) for k in a)
    files = sorted(p.relative_to(alone).as_posix() for p in alone.rglob("*") if p.is_file())
    assert sorted(p.relative_to(got).as_posix() for p in got.rglob("*") if p.is_file()) == files
    for name in ("config.yaml", "metrics.csv", "metrics.json", "clients.csv"):
        assert (got / name).read_text() == (alone / name).read_text(), name


def stacked_note(run: Path):
    return json.loads((run / "manifest.json").read_text()).get("stacked")


def test_a_specs_seeds_train_as_one_stack_each_equal_to_its_separate_training(part, tmp_path):
    runs = tmp_path / "runs"
    spec = write_spec(tmp_path / "spec.yaml", part, runs, [0, 1, 2])
    assert main(["compare", "--spec", spec, "--out", tmp_path / "t", "--format", "quiet"]) == 0
    for seed in (0, 1, 2):
        got = runs / "fedavg" / f"seed-{seed}"
        assert stacked_note(got) == {"seeds": [0, 1, 2], "runs": 3}  # trained together
        assert_same_run(got, separate(part, tmp_path / f"alone-{seed}", seed))
    assert any(not torch.equal(v, weights(runs / "fedavg" / "seed-1")[k]) for k, v in weights(runs / "fedavg" /
                                                                                           "seed-0").items())
    # stack: 1 trains them one at a time, as before: the same models, no stacked note (and nothing retrained: the
    # runs found up to date whatever the stack)
    mtimes = {p: p.stat().st_mtime_ns for p in runs.rglob("manifest.json")}
    one = write_spec(tmp_path / "one.yaml", part, runs, [0, 1, 2], extra="stack: 1\n")
    assert main(["compare", "--spec", one, "--out", tmp_path / "t1", "--format", "quiet"]) == 0
    assert {p: p.stat().st_mtime_ns for p in runs.rglob("manifest.json")} == mtimes
    assert (tmp_path / "t" / "table.csv").read_text() == (tmp_path / "t1" / "table.csv").read_text()


def test_stack_size_chunks_the_seeds_and_a_finished_run_is_kept(part, tmp_path):
    """stack: 2 over seeds [0, 1, 2] after seed 0 alone: 0 is kept as it is, 1 and 2 train as one stack."""
    runs = tmp_path / "runs"
    first = write_spec(tmp_path / "first.yaml", part, runs, [0])
    assert main(["compare", "--spec", first, "--out", tmp_path / "t0", "--format", "quiet"]) == 0
    s0 = runs / "fedavg" / "seed-0" / "manifest.json"
    stamp = s0.stat().st_mtime_ns
    assert stacked_note(s0.parent) is None  # one seed: the ordinary training
    spec = write_spec(tmp_path / "spec.yaml", part, runs, [0, 1, 2], extra="stack: 2\n")
    assert main(["compare", "--spec", spec, "--out", tmp_path / "t", "--format", "quiet"]) == 0
    assert s0.stat().st_mtime_ns == stamp
    assert stacked_note(runs / "fedavg" / "seed-1") == {"seeds": [1], "runs": 1}  # its stack [0, 1]: 0 was done
    assert stacked_note(runs / "fedavg" / "seed-2") is None  # the last, alone
    assert_same_run(runs / "fedavg" / "seed-1", separate(part, tmp_path / "alone-1", 1))


@pytest.mark.parametrize("extra,needle", [
    ("stack: 0\n", "--spec {spec}: stack must be an integer >= 1"),
    ("stack: two\n", "--spec {spec}: stack must be an integer >= 1"),
])
def test_a_bad_stack_is_one_line_and_writes_nothing(part, tmp_path, cli, extra, needle):
    spec = write_spec(tmp_path / "spec.yaml", part, tmp_path / "runs", [0, 1], extra=extra)
    result = cli("compare", "--spec", spec, "--out", tmp_path / "t")
    assert result.code == 2 and needle.format(spec=spec) in result.err, result.err
    assert len(result.err.strip().splitlines()) == 1
    assert not (tmp_path / "t").exists() and not (tmp_path / "runs").exists()


def test_a_tune_entrys_stack_for_an_algorithm_that_cannot_stack_is_refused(part, tmp_path, cli):
    spec = tmp_path / "spec.yaml"
    spec.write_text(f"partition: {part}\nseeds: [0]\nruns: {tmp_path / 'runs'}\nalgorithms:\n"
                    "  ditto: {tune: {trials: 2, rounds: 2, stack: 4}}\n")
    result = cli("compare", "--spec", spec, "--out", tmp_path / "t")
    assert result.code == 2 and "algorithms.ditto.tune:" in result.err and "'ditto' cannot train runs stacked" in \
        result.err and len(result.err.strip().splitlines()) == 1, result.err
    assert not (tmp_path / "t").exists() and not (tmp_path / "runs").exists()


def test_studies_take_the_specs_stack_where_the_algorithm_stacks():
    """The plan: fedavg's study --stack 8 (the default), 3 with stack: 3, 1 with --jobs 2 (trials in processes);
    ditto's 1 (it cannot stack); a tune entry's own stack wins."""
    from pfl_cli.cli.compare_run import _plan_spec
    from pfl_cli.compare.spec import parse_spec

    def stacks(doc, jobs=1):
        spec = parse_spec({"partition": "p", "seeds": [0], **doc})
        return {s.name: s.options.stack for s in _plan_spec(spec, nonprivate=False, jobs=jobs) if s.kind == "tune"}

    algorithms = {"fedavg": {"tune": {"trials": 2}}, "ditto": {"tune": {"trials": 2}},
                  "fedprox": {"tune": {"trials": 2, "stack": 2}}}
    assert stacks({"algorithms": algorithms}) == {"fedavg": 8, "ditto": 1, "fedprox": 2}
    assert stacks({"algorithms": algorithms, "stack": 3}) == {"fedavg": 3, "ditto": 1, "fedprox": 2}
    assert stacks({"algorithms": {"fedavg": {"tune": {"trials": 2}}}}, jobs=2) == {"fedavg": 1}


def _spawn(args, cwd):
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PFLX_PROGRESS_EVERY": "0"}
    return subprocess.Popen([sys.executable, "-m", "pfl_cli", *map(str, args)], cwd=cwd, env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)


@pytest.mark.slow  # two cold processes and four separate trainings: ~30 s of CPU
def test_a_killed_stack_resumes_its_runs_from_their_checkpoints(part, tmp_path):
    """Seed 0 finished earlier; the stack of 1 and 2 SIGKILLed once both have checkpointed a round: the rerun
    keeps seed 0 as it is and continues 1 and 2 from their checkpoints, each ending equal to its separate run."""
    sets = {**SET, "rounds": 40}
    runs = tmp_path / "runs"
    first = write_spec(tmp_path / "first.yaml", part, runs, [0], sets=sets)
    assert main(["compare", "--spec", first, "--out", tmp_path / "t0", "--format", "quiet"]) == 0
    s0 = runs / "fedavg" / "seed-0" / "manifest.json"
    stamp = s0.stat().st_mtime_ns
    spec = write_spec(tmp_path / "spec.yaml", part, runs, [0, 1, 2], sets=sets)
    args = ["compare", "--spec", spec, "--out", tmp_path / "t", "--format", "quiet"]
    cks = [runs / "fedavg" / f".s{s}.checkpoint" / "state.pt" for s in (1, 2)]
    proc = _spawn(args, tmp_path)
    end = time.monotonic() + 240
    while not all(c.is_file() for c in cks):
        assert proc.poll() is None, proc.stderr.read()
        assert time.monotonic() < end, "the stack did not checkpoint"
        time.sleep(0.02)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert not (runs / "fedavg" / "seed-1").exists() and not (runs / "fedavg" / "seed-2").exists()
    from pfl_cli.fl.checkpoint import read_checkpoint

    killed = [int(read_checkpoint(c)["round"]) for c in cks]
    assert all(0 < r < 40 for r in killed), killed
    done = _spawn(args, tmp_path)
    assert done.wait(timeout=300) == 0, done.stderr.read()
    assert s0.stat().st_mtime_ns == stamp
    for seed in (1, 2):
        got = runs / "fedavg" / f"seed-{seed}"
        assert stacked_note(got) == {"seeds": [1, 2], "runs": 2}
        assert_same_run(got, separate(part, tmp_path / f"alone-{seed}", seed, sets=sets))
        assert not (runs / "fedavg" / f".seed-{seed}.checkpoint").exists()


@pytest.mark.slow  # two cold processes and a separate training: ~20 s of CPU
def test_a_killed_training_that_does_not_stack_continues_from_its_checkpoint(part, tmp_path):
    """An algorithm that does not stack trains alone; SIGKILLed mid-training, the rerun continues it from its
    checkpoint (compare has no --resume: the rerun refused with 'pass --resume' before) to the separate run's
    model."""
    sets = {k: v for k, v in SET.items() if k != "momentum"} | {"rounds": 40}
    runs = tmp_path / "runs"
    spec = tmp_path / "spec.yaml"
    spec.write_text(f"partition: {part}\nseeds: [0]\nruns: {runs}\nnew_clients: false\n"
                    f"algorithms:\n  fedper: {{set: {json.dumps(sets)}}}\n")
    args = ["compare", "--spec", spec, "--out", tmp_path / "t", "--format", "quiet"]
    ck = runs / "fedper" / ".seed-0.checkpoint" / "state.pt"
    proc = _spawn(args, tmp_path)
    end = time.monotonic() + 240
    while not ck.is_file():
        assert proc.poll() is None, proc.stderr.read()
        assert time.monotonic() < end, "the training did not checkpoint"
        time.sleep(0.02)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert not (runs / "fedper" / "seed-0").exists()
    done = _spawn(args, tmp_path)
    assert done.wait(timeout=300) == 0, done.stderr.read()
    alone = tmp_path / "alone"
    flags = [a for k, v in sets.items() for a in ("--set", f"{k}={json.dumps(v)}")]
    assert main(["train", "--partition", part, "--algorithm", "fedper", "--seed", 0, *flags, "--out", alone,
                 "--format", "quiet"]) == 0
    a = torch.load(runs / "fedper" / "seed-0" / "model.pt", weights_only=True)
    b = torch.load(alone / "model.pt", weights_only=True)
    assert _equal(a, b)  # every tensor of the payload (the shared body, each client's personal head)


def _equal(a, b) -> bool:
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(_equal(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return isinstance(b, (list, tuple)) and len(a) == len(b) and all(_equal(x, y) for x, y in zip(a, b))
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and torch.equal(a, b)
    return a == b
