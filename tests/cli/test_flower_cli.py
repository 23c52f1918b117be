"""`pflx flower app` bad input: one line, exit 2, nothing written (needs no flwr: it only writes files)."""

import pytest


@pytest.fixture(scope="module")
def part(tmp_path_factory):
    from pfl_cli.cli.app import main

    root = tmp_path_factory.mktemp("flower-cli")
    assert main(["partition", "--dataset", "builtin:digits", "--num-clients", "3", "--out", str(root / "part"),
                 "--format", "quiet"]) == 0
    return root / "part"


@pytest.mark.parametrize("args, message", [
    (["--min-clients", "0"], "--min-clients must be an integer >= 1; got 0."),
    (["--round-timeout", "0"], "--round-timeout must be > 0 seconds; got 0.0."),
    (["--set", "algorithm=ditto"], "algorithm must be one of fedavg, fedprox, pefll, pfedhn"),
])
def test_bad_options_are_one_line_exit_2(part, tmp_path, cli, args, message):
    r = cli("flower", "app", "--partition", part, "--out", tmp_path / "app", "--set", "val_fraction=0",
            "--set", "algorithm=fedavg", *args)
    assert r.code == 2 and message in r.err and r.err.count("\n") == 1
    assert not (tmp_path / "app").exists()


def test_partition_must_be_an_artifact(tmp_path, cli):
    r = cli("flower", "app", "--partition", tmp_path, "--out", tmp_path / "app", "--set", "val_fraction=0",
            "--set", "algorithm=fedavg")
    assert r.code == 2 and "not a pflx artifact (no manifest.json)" in r.err
    assert not (tmp_path / "app").exists()


def test_the_app_holds_the_resolved_config_and_the_paths(part, tmp_path, cli):
    import json
    import tomllib

    r = cli("flower", "app", "--partition", part, "--out", tmp_path / "app", "--set", "val_fraction=0",
            "--set", "algorithm=fedprox", "--set", "mu=0.1", "--seed", "7", "--format", "json")
    assert r.code == 0, r.err
    doc = tomllib.loads((tmp_path / "app" / "pyproject.toml").read_text())
    run = doc["tool"]["flwr"]["app"]["config"]
    cfg = json.loads(run["pflx-config"])
    assert (cfg["algorithm"], cfg["mu"], cfg["seed"], cfg["val_fraction"]) == ("fedprox", 0.1, 7, 0.0)
    assert run["partition"] == str(part.resolve()) and run["out"] == str((tmp_path / "app-train").resolve())
    assert json.loads(r.out)["files"] == sorted(["pyproject.toml", "pflx_flower_app/__init__.py",
                                                 "pflx_flower_app/server_app.py", "pflx_flower_app/client_app.py"])
