"""A private study that can select, says how well it selects, and composes with the training it chooses (issue 39, 9).

The default ``--dp-score-noise 3`` on a sum over ~24 clients is a standard error of ~14 points on the mean:
the selection was noise on small federations and nothing said so. And training with the released
best.yaml on the same data is a second mechanism whose epsilon composes with the study's.
"""

import json

import numpy as np
import pytest

from pfl_cli.errors import ConfigError
from pfl_cli.tune.private import (DEFAULT_SCORE_NOISE, SCORE_SE_LIMIT, release_score, resolve_score_noise,
                                  score_standard_error)


@pytest.mark.parametrize("score, clients, noise", [(0.9, 24, 3.0), (0.5, 24, 1.0), (0.2, 100, 3.0)])
def test_the_standard_error_matches_the_released_scores_spread(score, clients, noise):
    """Against the mechanism itself: the spread of many releases of one trial's score."""
    rng = np.random.default_rng(0)
    acc = np.full(clients, score)
    released = np.array([release_score(acc, noise, rng)["score"] for _ in range(20000)])
    assert np.std(released) == pytest.approx(score_standard_error(noise, clients, score), rel=0.06)


def test_the_default_comes_from_the_public_federation_size():
    # 5 points of standard error at score 1 over the population bound, at most 3
    assert resolve_score_noise(3.0, False, population=24, group="train", validation_clients=0.0) == \
        pytest.approx(0.05 * 24 / np.sqrt(2), abs=1e-4)
    assert resolve_score_noise(3.0, False, population=10_000, group="train", validation_clients=0.0) == 3.0
    assert resolve_score_noise(3.0, False, population=None, group="train", validation_clients=0.0) == \
        DEFAULT_SCORE_NOISE
    # scored on validation clients: their share of the population
    assert resolve_score_noise(3.0, False, population=200, group="holdout", validation_clients=0.2) == \
        pytest.approx(0.05 * 40 / np.sqrt(2), abs=1e-4)
    for n in (24, 100, 1000):
        noise = resolve_score_noise(3.0, False, population=n, group="train", validation_clients=0.0)
        assert score_standard_error(noise, n, 1.0) <= 0.05 + 1e-9


def test_a_score_noise_that_cannot_select_is_refused_with_the_number():
    with pytest.raises(ConfigError, match=r"--dp-score-noise 3: .* at most 24 train clients .* standard error of at "
                                          r"least 12.5 points, above the 10 .* give --dp-score-noise 2.4 or less"):
        resolve_score_noise(3.0, True, population=24, group="train", validation_clients=0.0)
    assert resolve_score_noise(2.0, True, population=24, group="train", validation_clients=0.0) == 2.0
    with pytest.raises(ConfigError, match="too few for a private selection"):
        resolve_score_noise(3.0, False, population=8, group="train", validation_clients=0.0)
    assert SCORE_SE_LIMIT == 0.10


DP = "eps=2,delta=1e-6,clip=0.5,population=30,noise=seeded"
SMALL = ["--rounds", "2", "--eval-every", "2", "--local-steps", "2", "--batch-size", "8", "--set", "normalize=false",
         "--set", "mlp_hidden=[8]", "--set", "dp_sampling_rate=0.3"]


@pytest.fixture(scope="module")
def study(tmp_path_factory):
    """A partition of 30 clients and a private fedavg study on it (the population bound is public: 30)."""
    from pfl_cli.cli.app import main

    d = tmp_path_factory.mktemp("dpsel")
    assert main(["partition", "--dataset", "builtin:digits", "--iid", "--num-clients", "34", "--holdout-clients", "4",
                 "--out", str(d / "part"), "--format", "quiet"]) == 0
    assert main(["tune", "--partition", str(d / "part"), "--algorithm", "fedavg", "--trials", "2", "--dp", DP, *SMALL,
                 "--out", str(d / "study"), "--format", "quiet"]) == 0
    return d


def test_a_copy_of_best_yaml_outside_its_study_still_composes(study, cli, tmp_path):
    # Issue 49, finding 3: best.yaml copied out of the study directory (cp STUDY/best.yaml ../mine.yaml) trained
    # with epsilon 2.000 (one event) instead of 3.793 (two), silently. The provenance travels in the file now.
    import shutil

    shutil.copy(study / "study" / "best.yaml", tmp_path / "mine.yaml")
    run = cli("train", "--partition", study / "part", "--config", tmp_path / "mine.yaml", "--out", tmp_path / "run")
    assert run.code == 0, run.err
    assert "composes the private study" in run.err + run.out
    study_events = json.loads((study / "study" / "privacy.json").read_text())["events"]
    events = json.loads((tmp_path / "run" / "privacy.json").read_text())["events"]
    assert events[:len(study_events)] == study_events and len(events) > len(study_events)
    # the header without the provenance (an edited copy): refused, never trained with the study's epsilon dropped
    text = (study / "study" / "best.yaml").read_text()
    head, rest = text.split("\nprovenance:", 1)
    body = "\n".join(line for line in rest.splitlines() if not line.startswith(" "))
    (tmp_path / "edited.yaml").write_text(head + body)
    run = cli("train", "--partition", study / "part", "--config", tmp_path / "edited.yaml", "--out", tmp_path / "r2")
    assert run.code == 2 and "carries no provenance" in run.err and len(run.err.strip().splitlines()) == 1, run.err
    assert not (tmp_path / "r2").exists()


def test_a_nonprivate_studys_config_under_dp_on_its_partition_is_refused_without_opt_in(study, cli, tmp_path):
    # Issue 49, finding 4: a study without --dp chose its config on the private data; train --dp with it on the same
    # partition was accepted without a word.
    from pfl_cli.cli.app import main

    assert main(["tune", "--partition", str(study / "part"), "--algorithm", "fedavg", "--trials", "2", *SMALL,
                 "--out", str(tmp_path / "plain"), "--format", "quiet"]) == 0
    args = ["train", "--partition", study / "part", "--config", tmp_path / "plain" / "best.yaml", "--dp", DP]
    run = cli(*args, "--out", tmp_path / "run")
    assert run.code == 2 and len(run.err.strip().splitlines()) == 1, run.err
    assert "chosen by a study without --dp on this --partition" in run.err and "--allow-nonprivate-config" in run.err
    assert not (tmp_path / "run").exists()
    # the Python API (pfl_cli.train) given the same file refuses with the same line (issue 49, item 3)
    from pfl_cli import registry
    from pfl_cli.config import load_config_file
    from pfl_cli.errors import ConfigError
    from pfl_cli.train import run_train

    best = tmp_path / "plain" / "best.yaml"
    cfg = registry.train_config(**{**load_config_file(best, "train"), "dp_epsilon": 2.0, "dp_delta": 1e-6,
                                   "dp_clip": 0.5, "dp_population": 30, "dp_noise": "seeded"})
    with pytest.raises(ConfigError) as refused:
        run_train(cfg, partition=study / "part", out=tmp_path / "api", config_file=best)
    assert str(refused.value).strip() == run.err.strip().removeprefix("pflx: error: ")
    assert not (tmp_path / "api").exists()
    run = cli(*args, "--allow-nonprivate-config", "--out", tmp_path / "run")
    assert run.code == 0, run.err
    assert "not the choice of config" in run.err + run.out
    # without --dp nothing is promised about the choice: trained as before
    assert cli("train", "--partition", study / "part", "--config", tmp_path / "plain" / "best.yaml", "--out",
               tmp_path / "plain-run").code == 0


def test_the_study_prints_its_scores_standard_error(study):
    metrics = json.loads((study / "study" / "metrics.json").read_text())
    dp = metrics["dp"]
    assert dp["score_noise_multiplier"] == pytest.approx(0.05 * 30 / np.sqrt(2), abs=1e-4)
    best = metrics["best"]
    assert dp["score_standard_error"] == pytest.approx(score_standard_error(
        dp["score_noise_multiplier"], best["noisy_count"], min(max(best["noisy_score"], 0), 1)))


def test_an_explicit_noise_that_cannot_select_is_refused_and_nothing_written(study, cli):
    out = study / "refused"
    run = cli("tune", "--partition", study / "part", "--algorithm", "fedavg", "--trials", "2", "--dp", DP, *SMALL,
              "--dp-score-noise", "5", "--out", out)
    lines = run.err.strip().splitlines()
    assert run.code == 2 and len(lines) == 1, run.err
    assert "--dp-score-noise 5" in lines[0] and "16.7 points" in lines[0]
    assert not out.exists()


def test_training_with_the_released_config_composes_the_studys_ledger(study, cli):
    import shutil

    from pfl_cli.privacy.ledger import PrivacyLedger

    run = cli("train", "--partition", study / "part", "--config", study / "study" / "best.yaml", "--out",
              study / "run")
    assert run.code == 0, run.err
    assert "composes the private study" in run.err + run.out
    # The same keys without the study's header and provenance: training alone (the reference ledger of this run).
    import yaml

    keys = {k: v for k, v in yaml.safe_load((study / "study" / "best.yaml").read_text()).items() if k != "provenance"}
    (study / "alone.yaml").write_text(yaml.safe_dump(keys))
    assert cli("train", "--partition", study / "part", "--config", study / "alone.yaml", "--out",
               study / "run-alone").code == 0
    total = json.loads((study / "run" / "privacy.json").read_text())
    alone = PrivacyLedger.from_dict(json.loads((study / "run-alone" / "privacy.json").read_text()))
    prior = PrivacyLedger.from_dict(json.loads((study / "study" / "privacy.json").read_text()))
    assert total["events"] == [*json.loads((study / "study" / "privacy.json").read_text())["events"],
                               *json.loads((study / "run-alone" / "privacy.json").read_text())["events"]]
    expected = prior.compose(alone).epsilon("rdp")
    assert total["epsilon"] == pytest.approx(expected)
    assert total["epsilon"] > max(prior.epsilon("rdp"), alone.epsilon("rdp"))
    # what the run reports is the model's guarantee, the total (before: metrics.json and the table said 2.0 alone)
    assert json.loads((study / "run" / "metrics.json").read_text())["dp"]["epsilon_total"] == total["epsilon"]
    assert f"{total['epsilon']:.4g}" in run.out
    assert "epsilon_total" not in json.loads((study / "run-alone" / "metrics.json").read_text())["dp"]
    acct = cli("privacy-account", study / "run", "--format", "json")
    assert acct.code == 0, acct.err
    assert json.loads(acct.out)["epsilon"] == pytest.approx(expected)


def test_a_study_on_another_partition_is_named_not_composed(study, cli):
    from pfl_cli.cli.app import main

    assert main(["partition", "--dataset", "builtin:digits", "--iid", "--num-clients", "34", "--holdout-clients", "4",
                 "--seed", "1", "--out", str(study / "other"), "--format", "quiet"]) == 0
    run = cli("train", "--partition", study / "other", "--config", study / "study" / "best.yaml", "--out",
              study / "run-other")
    assert run.code == 0, run.err
    assert "pflx privacy-account" in run.err + run.out and "not on --partition" in run.err + run.out
    events = json.loads((study / "run-other" / "privacy.json").read_text())["events"]
    assert not any(e.get("type", "").startswith("RepeatAndSelect") or "repeat" in json.dumps(e).lower()
                   for e in events)


@pytest.mark.parametrize("how", ["copied", "recreated"])
def test_a_copy_of_the_studys_partition_composes_too(study, cli, how):
    # The same records under another path: a copy (cp -r), or the study's partition command run again elsewhere
    # (same options and seed over the same data). Before (review of issue 39, item 9), only a note was printed
    # and privacy.json held the training run's epsilon alone (2.0 instead of 10.1).
    import shutil

    from pfl_cli.cli.app import main

    where = study / how / "deeper" / "part"
    if how == "copied":
        shutil.copytree(study / "part", where)
    else:
        assert main(["partition", "--dataset", "builtin:digits", "--iid", "--num-clients", "34", "--holdout-clients",
                     "4", "--out", str(where), "--format", "quiet"]) == 0
    run = cli("train", "--partition", where, "--config", study / "study" / "best.yaml", "--out", study / how / "run")
    assert run.code == 0, run.err
    assert "composes the private study" in run.err + run.out
    study_events = json.loads((study / "study" / "privacy.json").read_text())["events"]
    events = json.loads((study / how / "run" / "privacy.json").read_text())["events"]
    assert events[:len(study_events)] == study_events and len(events) > len(study_events)


def test_a_private_study_started_from_anothers_release_composes_it(study, cli):
    # tune --dp --config STUDY/best.yaml: the second study's release is a function of the first one's too. Before
    # (review of issue 39, item 9), its privacy.json held its own event alone, and so did a training run's after it.
    run = cli("tune", "--partition", study / "part", "--config", study / "study" / "best.yaml", "--algorithm",
              "fedavg", "--trials", "2", "--set", "dp_sampling_rate=0.3", "--space", "momentum=float:0.5:0.9",
              "--out", study / "second")
    assert run.code == 0, run.err
    assert "composes the private study" in run.err + run.out
    first = json.loads((study / "study" / "privacy.json").read_text())
    second = json.loads((study / "second" / "privacy.json").read_text())
    assert second["events"][:len(first["events"])] == first["events"] and len(second["events"]) > len(first["events"])
    assert second["epsilon"] > first["epsilon"]
    assert json.loads((study / "second" / "metrics.json").read_text())["dp"]["epsilon"] == second["epsilon"]


def test_compare_spec_with_the_released_config_composes_the_studys_ledger(study, cli):
    # compare --spec trains each algorithm's config as `train --config` does. Before (review of issue 39, item 9),
    # it did not compose: the run's privacy.json said 2.0 where `train --config` says 10.1.
    spec = study / "spec.yaml"
    best = study / "study" / "best.yaml"
    spec.write_text(f"partition: {study / 'part'}\nseeds: [0]\nnew_clients: false\nruns: {study / 'cmp-runs'}\n"
                    f"algorithms:\n  fedavg: {{config: {best}, set: {{write_nonprivate: true}}}}\n")
    run = cli("compare", "--spec", spec, "--nonprivate", "--out", study / "cmp")
    assert run.code == 0, run.err
    study_events = json.loads((study / "study" / "privacy.json").read_text())["events"]
    events = json.loads((study / "cmp-runs" / "fedavg" / "seed-0" / "privacy.json").read_text())["events"]
    assert events[:len(study_events)] == study_events and len(events) > len(study_events)


def test_compare_spec_with_a_dp_config_and_no_nonprivate_is_refused_before_training(study, cli):
    # Before (review): every run was trained, written under runs:, and then the comparison refused them (exit 2).
    spec = study / "spec-refused.yaml"
    spec.write_text(f"partition: {study / 'part'}\nseeds: [0]\nnew_clients: false\nruns: {study / 'refused-runs'}\n"
                    f"algorithms:\n  fedavg: {study / 'study' / 'best.yaml'}\n")
    run = cli("compare", "--spec", spec, "--out", study / "refused-cmp")
    assert run.code == 2 and len(run.err.strip().splitlines()) == 1, run.err
    assert "algorithms.fedavg trains with --dp" in run.err
    assert not (study / "refused-runs").exists() and not (study / "refused-cmp").exists()
