"""Refusals and notes that say what the user did and what to do next (issue 49, findings 13, 15, 16, 17, 19)."""

from __future__ import annotations

import numpy as np
import pytest
import yaml


@pytest.fixture(scope="module")
def part(tmp_path_factory):
    from pfl_cli.cli.app import main

    root = tmp_path_factory.mktemp("messages")
    assert main(["partition", "--dataset", "builtin:digits", "--dirichlet", "0.5", "-n", "6", "--out",
                 str(root / "part"), "--format", "quiet"]) == 0
    return root


def _spec(root, name: str, doc: dict):
    path = root / name
    path.write_text(yaml.safe_dump(doc))
    return path


def test_a_config_tuned_for_one_algorithm_is_refused_for_another(part, cli):
    # tune's best.yaml: one algorithm's values, flat. Before, --algorithm fedavg trained with SCAFFOLD's lr, exit 0.
    best = part / "best.yaml"
    best.write_text("algorithm: scaffold\nlr: 0.83\nrounds: 2\n")
    for how in (("--algorithm", "fedavg"), ("--set", "algorithm=fedavg")):
        run = cli("train", "--partition", part / "part", "--config", best, *how, "--out", part / "x")
        assert run.code == 2 and not (part / "x").exists()
        assert run.err.strip() == (
            f"pflx: error: --config {best} is a config of 'scaffold' (its values were chosen for it), not of "
            "'fedavg'; train scaffold with it, or give a config of 'fedavg' (e.g. the best.yaml of `pflx tune "
            "--algorithm fedavg`).")
    # a recipe (a train: section) stays shared by the algorithms it names (recipes/flowdup: --set algorithm=fedavg)
    recipe = part / "recipe.yaml"
    recipe.write_text("train:\n  algorithm: pefll\n  lr: 0.05\n")
    run = cli("train", "--partition", part / "nope", "--config", recipe, "--algorithm", "fedavg", "--out", part / "x")
    assert run.code == 2 and "--partition" in run.err and "a config of" not in run.err


def test_another_tools_key_name_points_to_pflxs(part, cli):
    cfg = part / "lr.yaml"
    cfg.write_text("train:\n  algorithm: fedavg\n  learning_rate: 0.1\n")
    run = cli("train", "--partition", part / "part", "--config", cfg, "--out", part / "x")
    assert run.code == 2
    assert "unknown config file key 'learning_rate' for algorithm 'fedavg' (did you mean 'lr'?)" in run.err


def test_a_specs_mistakes_are_named_where_the_spec_has_them(part, cli):
    base = {"partition": str(part / "part"), "seeds": [0, 1]}
    bad_value = _spec(part, "value.yaml", {**base, "algorithms": {"fedavg": {"set": {"local_steps": "ten"}}}})
    run = cli("compare", "--spec", bad_value, "--out", part / "c")
    assert run.code == 2
    assert run.err.strip() == (f"pflx: error: --spec {bad_value}: algorithms.fedavg.set: local_steps must be an "
                               "integer; got 'ten'.")
    no_part = _spec(part, "nopart.yaml", {**base, "partition": str(part / "nope"), "algorithms": {"fedavg": {}}})
    run = cli("compare", "--spec", no_part, "--out", part / "c")
    assert run.code == 2 and run.err.startswith(f"pflx: error: --spec {no_part}: partition {part / 'nope'}: no such")
    misspelt = _spec(part, "misspelt.yaml", {**base, "algorithms": {"fedavgg": {}}})
    run = cli("compare", "--spec", misspelt, "--out", part / "c")
    assert run.code == 2 and "algorithms.fedavgg: no such algorithm (did you mean 'fedavg'?)" in run.err
    stacked = _spec(part, "stack.yaml", {**base, "algorithms": {"ditto": {"tune": {"trials": 2, "stack": 2}}}})
    run = cli("compare", "--spec", stacked, "--out", part / "c")
    assert run.code == 2 and "--seeds" not in run.err and "set stack: 1 under algorithms.ditto.tune" in run.err
    assert "stack: fedavg, fedprox, pefll)" in run.err  # every stackable algorithm, loaded or not
    assert not (part / "c").exists()


def test_a_single_class_dataset_is_refused_at_partition(tmp_path, cli):
    rng = np.random.default_rng(0)
    np.savez(tmp_path / "one.npz", x=rng.normal(size=(60, 4)).astype(np.float32), y=np.zeros(60, dtype=np.int64))
    run = cli("partition", "--dataset", f"npz:{tmp_path / 'one.npz'}", "--iid", "-n", "3", "--out", tmp_path / "p")
    assert run.code == 2 and not (tmp_path / "p").exists()
    assert "its labels must name at least 2 classes (pflx trains classifiers); got 1 class in 60 samples" in run.err


def _interrupt_after_a_checkpoint(monkeypatch):
    """train_federated that keeps a checkpoint of round 1, then meets Ctrl-C."""

    def interrupted(*args, on_checkpoint, **kwargs):
        on_checkpoint({"round": 1})
        raise KeyboardInterrupt

    monkeypatch.setattr("pfl_cli.fl.api.train_federated", interrupted)


def test_an_interrupted_spec_says_how_compare_continues(part, cli, monkeypatch):
    # compare has no --resume (exit 2): its rerun continues the training from its checkpoint by itself.
    _interrupt_after_a_checkpoint(monkeypatch)
    spec = _spec(part, "one.yaml", {"partition": str(part / "part"), "seeds": [0], "stack": 1, "new_clients": False,
                                    "runs": str(part / "runs"),
                                    "algorithms": {"fedavg": {"set": {"rounds": 2, "eval_every": 1}}}})
    run = cli("compare", "--spec", spec, "--out", part / "cmp")
    assert run.code == 130
    assert "--resume" not in run.err
    assert "run the same command again (compare --spec continues where it stopped) to continue from it." in run.err
    run = cli("train", "--partition", part / "part", "--algorithm", "fedavg", "--rounds", "2", "--out", part / "t")
    assert run.code == 130 and "run the same command with --resume to continue from it." in run.err


def test_algorithm_keys_in_a_file_wrap_at_the_help_width(cli, monkeypatch):
    monkeypatch.delenv("COLUMNS", raising=False)
    run = cli("algorithms", "scaffold")  # captured: not a terminal
    assert run.code == 0 and "lr" in run.out
    assert max(len(line) for line in run.out.splitlines()) <= 100


def test_dry_run_plans_the_spec_says_what_is_done_and_writes_nothing(part, cli):
    import json

    runs = part / "plan-runs"
    small = {"rounds": 3, "local_steps": 2, "eval_every": 3}
    spec = _spec(part, "plan.yaml", {"partition": str(part / "part"), "seeds": [0, 1], "runs": str(runs),
                                     "algorithms": {"fedavg": {"set": small},
                                                    "fedprox": {"set": {"local_steps": 2},
                                                                "tune": {"trials": 2, "rounds": 2,
                                                                         "space": {"lr": [0.1, 0.01]}}}}})
    assert cli("train", "--partition", part / "part", "--algorithm", "fedavg", "--rounds", "3", "--local-steps", "2",
               "--eval-every", "3", "--seed", "0", "--out", runs / "fedavg" / "seed-0", "--format", "quiet").code == 0
    before = sorted(p.relative_to(part) for p in part.rglob("*"))
    run = cli("compare", "--spec", spec, "--out", part / "planned", "--dry-run", "--format", "json")
    assert run.code == 0, run.err
    doc = json.loads(run.out)
    assert sorted(p.relative_to(part) for p in part.rglob("*")) == before  # nothing trained or written
    assert [(s["kind"], s["algorithm"], s["seed"], s["rounds"], s["status"]) for s in doc["steps"]] == [
        ("study", "fedprox", None, 4, "to run"),
        ("run", "fedavg", 0, 3, "done"), ("run", "fedavg", 1, 3, "to run"),
        ("run", "fedprox", 0, 2, "after its study"), ("run", "fedprox", 1, 2, "after its study")]
    assert (doc["studies"], doc["runs"], doc["runs_done"], doc["rounds_left"]) == (1, 4, 1, 11)
    assert set(doc["seconds_per_round"]) == {"fedavg", "fedprox"} and doc["estimated_seconds"] > 0
    run = cli("compare", "--out", part / "planned", "--dry-run")
    assert run.code == 2 and "--dry-run shows the plan of --spec" in run.err


def test_tune_metrics_say_the_cpu_time_beside_the_wall_and_trial_times(part, cli):
    # trial_seconds sums each trial's duration (stacked trials overlap): the CPU time is its own figure (finding 21)
    import json

    run = cli("tune", "--partition", part / "part", "--algorithm", "fedavg", "--trials", "1", "--rounds", "1",
              "--set", "local_steps=1", "--out", part / "tune", "--format", "quiet")
    assert run.code == 0, run.err
    m = json.loads((part / "tune" / "metrics.json").read_text())
    assert m["cpu_seconds"] > 0 and m["wall_seconds"] > 0 and m["trial_seconds"] >= 0
