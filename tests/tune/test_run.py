"""The study runner below the CLI (`pfl_cli.tune.plan`, `pfl_cli.tune.run`): a study planned, run and summed up
as a library call, with no command, no printer and no tracker, and `pflx tune`'s body without --log."""

import optuna
import pytest

SMALL = ["--rounds", "2", "--eval-every", "1", "--local-steps", "3", "--clients-per-round", "4",
         "--set", "mlp_hidden=[16]", "--device", "cpu"]


@pytest.fixture(scope="module")
def part(tmp_path_factory):
    from pfl_cli.cli.app import main

    out = tmp_path_factory.mktemp("run") / "part"
    assert main(["partition", "--dataset", "builtin:digits", "--classes-per-client", "2", "--num-clients", "12",
                 "--format", "quiet", "--out", str(out)]) == 0
    return out


def _cfg(**keys):
    from pfl_cli import registry

    return registry.train_config("fedavg", **{"rounds": 2, "eval_every": 1, "local_steps": 3, "clients_per_round": 4,
                                              "mlp_hidden": (16,), "device": "cpu", **keys})


def test_a_study_runs_from_the_core_alone(part, tmp_path):
    """plan -> data -> run_study -> best_config, no callback given: the trials ran, the best is their best."""
    from pfl_cli.data.location import load_partition_dataset
    from pfl_cli.tune.plan import TuneOptions, plan_data, plan_study
    from pfl_cli.tune.run import best_config, run_study, study_location, study_metrics
    from pfl_cli.tune.study import study_identity

    cfg = _cfg()
    o = TuneOptions(space=("lr=choice:0.003,0.3",), trials=2, sampler="grid", pruner="none")
    p, _info, art, ds = load_partition_dataset(part)
    plan, o = plan_study(cfg, o, p)
    url, staging = study_location(tmp_path / "t", o, force=False)
    assert staging == tmp_path / ".t.study" and staging.is_dir() and not (tmp_path / "t").exists()
    meta = study_identity(plan.trial_cfg, plan.params, plan.objective, partition=art.content_hash,
                          validation={"fraction": o.validation_fraction, "clients": plan.validation_clients,
                                      "unlabeled": plan.unlabeled_validation})
    study = run_study(plan, o, plan_data(plan, o, ds, p), url=url, name=o.name(cfg.algorithm), meta=meta,
                      partition=part)
    # the study as stored, read back with Optuna itself
    stored = optuna.load_study(study_name="pflx-tune-fedavg", storage=url).trials
    lr = plan.params[0].decode  # a choice is stored as its rank
    assert sorted(lr(t.params["lr"]) for t in stored) == [0.003, 0.3]
    assert all(t.state == optuna.trial.TrialState.COMPLETE and len(t.intermediate_values) == 2 for t in stored)
    top = max(stored, key=lambda t: t.value)
    best_cfg, best = best_config(study, plan, out=tmp_path / "t")
    assert best.number == top.number and best_cfg.lr == lr(top.params["lr"])
    assert best_cfg == _cfg(lr=lr(top.params["lr"]))
    metrics = study_metrics(study, plan, o, started=0.0)
    assert metrics["best"]["value"] == top.value and metrics["trials"] == {"complete": 2}
    assert metrics["storage"] == "study.db"


def test_the_command_body_runs_without_log_and_without_a_log_dir(part, tmp_path):
    """``run_tune`` with the options' defaults (no --log, so no log directory: None) writes the artifact. Before,
    the study runner built its trackers whatever --log said, and ``Path(None)`` failed: every caller but the
    command itself (compare --spec's studies) had to invent a log directory first."""
    from pfl_cli.cli.output import Reporter
    from pfl_cli.cli.tune_run import run_tune
    from pfl_cli.tune.plan import TuneOptions

    o = TuneOptions(space=("lr=log:1e-2:1e-1",), trials=1, pruner="none")
    assert o.logs == () and o.log_dir is None
    run_tune(_cfg(), o, partition=part, out=tmp_path / "t", force=False, report=Reporter("quiet"))
    assert (tmp_path / "t" / "best.yaml").is_file()
    assert not (tmp_path / "t.logs").exists()


def test_a_tracker_needs_a_directory_and_no_tracker_needs_none():
    from pfl_cli.cli.loggers import StudyLoggers

    study = optuna.create_study(direction="maximize")
    StudyLoggers((), None, study).finish(study)  # nothing to log, nowhere
    with pytest.raises(ValueError, match="needs a log directory"):
        StudyLoggers(("mlflow",), None, study)
