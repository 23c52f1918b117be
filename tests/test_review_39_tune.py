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
