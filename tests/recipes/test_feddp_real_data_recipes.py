"""The thesis's US census and StackOverflow recipes (§6.5) run end to end on tiny files in their layouts."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import numpy as np
import pytest

RECIPES = Path(__file__).resolve().parents[2] / "recipes" / "feddp-kmeans"
ACS_COLUMNS = ("RT", "ST", "AGEP", "COW", "SCHL", "MAR", "OCCP", "POBP", "RELP", "WKHP", "SEX", "RAC1P", "PINCP", "PWGTP")


def census_csv():
    spec = importlib.util.spec_from_file_location("census_csv", RECIPES / "census_csv.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def write_acs(path, n=1200, seed=0):
    rng = np.random.default_rng(seed)
    rows = [",".join(ACS_COLUMNS)]
    for _ in range(n):
        wkhp = str(rng.integers(0, 60)) if rng.random() > 0.05 else ""  # empty cells occur in ACS files
        rows.append(",".join(["P", str(rng.choice([1, 6, 36])), str(rng.integers(10, 80)), str(rng.choice([1, 5, 5])),
                              *(str(v) for v in (rng.integers(1, 25), rng.integers(1, 6), rng.choice([10, 4000]),
                                                 rng.integers(1, 60), rng.integers(0, 18))),
                              wkhp, str(rng.integers(1, 3)), str(rng.integers(1, 10)), str(rng.integers(0, 90000)),
                              str(rng.integers(1, 100))]))
    path.write_text("\n".join(rows) + "\n")
    return path


def partition_and_cluster(cli, recipe, clients, server, tmp_path):
    """The recipe's two commands with the test's files: ``pflx partition`` -> p, ``pflx cluster`` -> km."""
    run = cli("partition", "--config", RECIPES / recipe, "--dataset", clients, "--out", tmp_path / "p", "--format", "quiet")
    assert run.code == 0, run.err
    run = cli("cluster", "--config", RECIPES / recipe, "--server-data", server, "--partition", tmp_path / "p",
              "--out", tmp_path / "km", "--format", "json")
    assert run.code == 0, run.err


def test_census_csv_follows_acs_income_and_one_hot_encodes(tmp_path):
    mod = census_csv()
    acs = mod.read_acs(write_acs(tmp_path / "acs.csv"))
    keep = mod.acs_income_rows(acs)
    # slow reference of folktables' adult_filter, row by row
    ref = [a > 16 and p > 100 and w > 0 and g >= 1 for a, p, w, g in zip(acs["AGEP"], acs["PINCP"], acs["WKHP"], acs["PWGTP"])]
    assert keep.tolist() == ref
    x, names = mod.one_hot(acs, keep)
    assert (x.sum(axis=1) == len(mod.FEATURES)).all()  # exactly one value per feature
    assert len(names) == sum(len(np.unique(acs[f][keep])) for f in mod.FEATURES)
    states, clients, server, _ = mod.build(acs, 5, 1, np.random.default_rng(0), n_server_other=100)
    assert len(server) == 120 and len(clients) == int(np.sum(acs["COW"][keep] == 5)) - 20
    assert set(states) <= {"01", "06", "36"}
    with pytest.raises(SystemExit, match="column COW is missing"):
        (tmp_path / "bad.csv").write_text("ST,AGEP\n1,30\n")
        mod.read_acs(tmp_path / "bad.csv")


def test_census_recipe_end_to_end(tmp_path, cli):
    census_csv().main(["--acs", str(write_acs(tmp_path / "acs.csv")), "--cow", "5", "--server-other", "100",
                       "--out", str(tmp_path / "census")])
    partition_and_cluster(cli, "census.yaml", f"csv:{tmp_path}/census/clients.csv?client=ST&label=",
                          f"csv:{tmp_path}/census/server.csv?label=", tmp_path)
    d = len((tmp_path / "census" / "server.csv").read_text().splitlines()[0].split(","))
    assert np.load(tmp_path / "km" / "centers.npy").shape == (10, d)
    manifest = json.loads((tmp_path / "km" / "manifest.json").read_text())
    assert manifest["config"]["split"] == [0.15, 0.16, 0.52, 0.17]  # Table D.2, census federal employees
    metrics = json.loads((tmp_path / "km" / "metrics.json").read_text())
    assert metrics["privacy_unit"] == "example" and metrics["server_points"] == 120


def test_stackoverflow_recipe_end_to_end(tmp_path, cli):
    rng = np.random.default_rng(0)
    centers = rng.normal(size=(10, 12))

    def write(path, n, users):
        cols = (["client_id"] if users else []) + [f"e{j}" for j in range(12)]
        lines = [",".join(cols)]
        for _ in range(n):
            v = centers[rng.integers(10)] + 0.1 * rng.normal(size=12)
            lines.append(",".join(([f"u{rng.integers(users)}"] if users else []) + [f"{a:.5f}" for a in v / np.linalg.norm(v)]))
        path.write_text("\n".join(lines) + "\n")

    write(tmp_path / "clients.csv", 1500, 200)
    write(tmp_path / "server.csv", 300, None)
    partition_and_cluster(cli, "stackoverflow.yaml", f"csv:{tmp_path}/clients.csv?client=client_id&label=",
                          f"csv:{tmp_path}/server.csv?label=", tmp_path)
    metrics = json.loads((tmp_path / "km" / "metrics.json").read_text())
    assert metrics["privacy_unit"] == "client" and metrics["dimension"] == 12
