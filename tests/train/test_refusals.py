"""The train core refuses what `pflx train` refuses (issue 49): each case runs the command and the Python API
(:mod:`pfl_cli.train`) on the same inputs; both refuse with the same one line and write nothing."""

from __future__ import annotations

import pytest

from pfl_cli.errors import InputError, PflxError


@pytest.fixture(scope="module")
def part(tmp_path_factory):
    from pfl_cli.cli.app import main

    root = tmp_path_factory.mktemp("refusals")
    assert main(["partition", "--dataset", "builtin:digits", "--num-clients", "6", "--holdout-clients", "2",
                 "--out", str(root / "part"), "--format", "quiet"]) == 0
    return root / "part"


def fedavg(**keys):
    from pfl_cli import registry

    return registry.train_config("fedavg", rounds=2, eval_every=1, local_steps=1, **keys)


def api_seeds(seeds, **keys):
    from pfl_cli.train import run_train_seeds

    return lambda part, out: run_train_seeds(fedavg(**keys), seeds, partition=part, out=out)


def api_train(plot=None, **keys):
    from pfl_cli.train import run_train

    return lambda part, out: run_train(fedavg(**keys), partition=part, out=out, plot=plot)


def checkpoint_left(out):
    """What a killed run leaves beside ``out``: its checkpoint (only its presence is read before the refusal)."""
    from pfl_cli.fl.checkpoint import checkpoint_dir

    ck = checkpoint_dir(out)
    ck.mkdir(parents=True)
    (ck / "state.pt").write_bytes(b"a killed run's checkpoint")


# (case, the command's extra arguments, the Python call, what the line says, set-up beside --out)
CASES = [
    ("--plot under --dp", ["--plot", "--dp", "eps=1,clip=1,population=100", "--set", "normalize=false"],
     lambda: api_train(plot=lambda *paths: None, dp_epsilon=1.0, dp_clip=1.0, dp_population=100, normalize=False),
     "--plot draws accuracies measured on the private clients", None),
    ("a checkpoint left without --resume", [], lambda: api_train(), "pass --resume to continue from it",
     checkpoint_left),
    ("--device cuda that is not there", ["--device", "cuda:99"], lambda: api_train(device="cuda:99"), "cuda", None),
    ("--seeds not distinct", ["--seeds", "1,1"], lambda: api_seeds([1, 1]), "distinct integers >= 0", None),
    ("--seeds of an algorithm that does not stack", ["--seeds", "0,1", "--dropout", "0.5"],
     lambda: api_seeds([0, 1], dropout=0.5), "stacking: federation conditions", None),
]


@pytest.mark.parametrize("case, args, call, says, setup", CASES, ids=[c[0] for c in CASES])
def test_the_python_api_refuses_what_the_command_refuses(part, tmp_path, cli, case, args, call, says, setup):
    out = tmp_path / "run"
    if setup is not None:
        setup(out)
    def written():  # the --out lock file (pfl_cli.artifacts) stays, as every refused command leaves it
        return sorted(p.name for p in tmp_path.iterdir() if p.name != ".run.lock")

    before = written()
    run = cli("train", "--partition", part, "--algorithm", "fedavg", "--rounds", 2, "--eval-every", 1,
              "--local-steps", 1, "--out", out, *args)
    assert run.code == 2 and says in run.err and len(run.err.strip().splitlines()) == 1, run.err
    with pytest.raises(PflxError) as refused:
        call()(part, out)
    assert refused.value.exit_code == 2
    assert str(refused.value) in run.err  # the same line
    assert written() == before  # neither wrote anything


def test_seeds_under_torchrun_are_refused_by_the_core(part, tmp_path, monkeypatch):
    monkeypatch.setenv("WORLD_SIZE", "2")  # what torchrun sets in each rank: the stack is one process
    with pytest.raises(InputError, match="torchrun"):
        api_seeds([0, 1])(part, tmp_path / "run")
    assert not (tmp_path / "run").exists()


def test_loggers_need_events_that_build_them(part, tmp_path):
    """The core's default events log nothing: a logger named without them is refused, not ignored."""
    from pfl_cli.train import run_train

    with pytest.raises(InputError, match="experiment loggers"):
        run_train(fedavg(), partition=part, out=tmp_path / "run", logs=("csv",))
    assert not (tmp_path / "run").exists()
