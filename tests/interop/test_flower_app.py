"""`pflx flower app` and the Flower app it writes: FedAvg / FedProx on Flower's Message API.

The protocol runs in process here (``flower_fake_grid``: the generated ClientApp called with
Flower's own messages); ``test_flower_loopback.py`` runs it on a real SuperLink and SuperNodes.
Equality with ``pflx train``: each node trains its one client on the batches the simulation
draws for it (the server ships the round generator's state) and the server's aggregation is
the simulation's code, so the weights agree to float rounding; we measured bitwise equality
and assert max |difference| <= 1e-6.
"""

from __future__ import annotations

import json
import logging

import numpy as np
import pytest
import torch

pytestmark = pytest.mark.flower

RECIPE = """# test recipe
seed: 0
partition:
  dataset: builtin:digits
  scheme: iid
  num-clients: 4
  holdout-clients: 1
  test-fraction: 0.3
train:
  algorithm: fedavg
  rounds: 3
  eval_every: 3
  clients_per_round: 2
  local_steps: 4
  batch_size: 16
  lr: 0.05
  val_fraction: 0
  model_arch: mlp
  mlp_hidden: [16]
"""


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    from pfl_cli.cli.app import main

    root = tmp_path_factory.mktemp("flower")
    (root / "recipe.yaml").write_text(RECIPE)
    assert main(["partition", "--config", str(root / "recipe.yaml"), "--out", str(root / "part"),
                 "--format", "quiet"]) == 0
    return root


def _app(setup, name: str, *sets: str):
    from pfl_cli.cli.app import main

    args = ["flower", "app", "--config", str(setup / "recipe.yaml"), "--partition", str(setup / "part"),
            "--out", str(setup / name), "--format", "quiet"]
    for s in sets:
        args += ["--set", s]
    assert main(args) == 0
    return setup / name


def _nodes(setup, count=4, **extra):
    return {100 + k: {"partition-dir": str(setup / "part"), "partition-id": k, **extra.get(k, {})}
            for k in range(count)}


def _simulate(setup, out, *sets):
    from pfl_cli.cli.app import main

    args = ["train", "--config", str(setup / "recipe.yaml"), "--partition", str(setup / "part"), "--out", str(out),
            "--format", "quiet"]
    for s in sets:
        args += ["--set", s]
    assert main(args) == 0
    return torch.load(out / "model.pt", weights_only=True)


def _train_node(setup, k=0):
    """The fake node id holding the k-th train client of the partition."""
    from pfl_cli.artifacts import load_partition

    part, _, _ = load_partition(setup / "part")
    return 100 + int(np.flatnonzero(part.role == 0)[k])


def _serve(grid):
    from pfl_cli.cli.flower import server_main  # what the generated server_app.py registers

    server_main(grid, grid.server_context())


@pytest.mark.parametrize("algorithm", ["fedavg", "fedprox"])
def test_flower_run_equals_pflx_train(setup, algorithm):
    from flower_fake_grid import FakeGrid

    sets = [f"algorithm={algorithm}"] + (["mu=0.5"] if algorithm == "fedprox" else [])
    app = _app(setup, f"app-{algorithm}", *sets)
    grid = FakeGrid(app, _nodes(setup), run_config_overrides={"out": str(setup / f"deployed-{algorithm}")})
    _serve(grid)
    sim = _simulate(setup, setup / f"sim-{algorithm}", *sets)
    got = torch.load(setup / f"deployed-{algorithm}" / "model.pt", weights_only=True)
    assert got["algorithm"] == algorithm
    for k, v in sim["weights"]["client"].items():
        assert torch.allclose(got["weights"]["client"][k], v, rtol=0, atol=1e-6), k
    assert float((got["weights"]["client"]["fc1.weight"] - sim["weights"]["client"]["fc1.weight"]).abs().sum()) < 1e-5
    for key in ("mean", "std"):
        assert torch.equal(got["normalization"][key], sim["normalization"][key])
    m_sim = json.loads((setup / f"sim-{algorithm}" / "metrics.json").read_text())
    m_got = json.loads((setup / f"deployed-{algorithm}" / "metrics.json").read_text())
    for group in ("train", "holdout"):
        assert m_got[group]["pooled_accuracy"] == pytest.approx(m_sim[group]["pooled_accuracy"], abs=1e-12)
        assert m_got[group]["loss"] == pytest.approx(m_sim[group]["loss"], rel=1e-5)
    assert m_got["communication"] == m_sim["communication"]  # the ledger counts the same tensors
    wire = m_got["wire"]
    # Measured on the wire: every float32 of the ledger plus the .npy headers of each array.
    assert wire["train_round_bytes"] > m_got["communication"]["total_bytes"]
    assert wire["wire_over_ledger"] < 1.2
    assert grid.sent.count("train.pflx_round") == 3 * 2  # rounds x clients_per_round


def test_flower_artifact_works_with_predict_and_show(setup, cli):
    from flower_fake_grid import FakeGrid

    app = _app(setup, "app-predict")
    out = setup / "deployed-predict"
    _serve(FakeGrid(app, _nodes(setup), run_config_overrides={"out": str(out)}))
    r = cli("predict", "--model", out, "--partition", setup / "part", "--clients", "holdout",
            "--out", setup / "pred", "--format", "json")
    assert r.code == 0, r.err
    assert json.loads(r.out)["num_clients"] == 1
    r = cli("show", out, "--format", "json")
    assert r.code == 0, r.err
    rows = (out / "participation.csv").read_text().splitlines()
    assert rows[0] == "round,client_id,node_id,status" and len(rows) == 1 + 3 * 2


def test_wrong_dataset_node_is_refused_with_a_clear_log_line(setup, tmp_path, caplog):
    from flower_fake_grid import FakeGrid

    from pfl_cli.data import load_dataset

    ds = load_dataset("builtin:digits")
    np.savez(tmp_path / "wrong.npz", x=np.concatenate([ds.x, ds.x], axis=1), y=ds.y)  # 128 features
    app = _app(setup, "app-wrong")
    nodes = _nodes(setup)
    nodes[999] = {"partition-dir": str(setup / "part"), "partition-id": 2, "dataset": f"npz:{tmp_path / 'wrong.npz'}"}
    out = tmp_path / "deployed"
    with caplog.at_level(logging.WARNING, logger="flwr"):
        _serve(FakeGrid(app, nodes, run_config_overrides={"out": str(out)}))
    lines = [r.getMessage() for r in caplog.records if "refused" in r.getMessage()]
    assert len(lines) == 1 and "node 999 refused" in lines[0] and "input-shape [128]" in lines[0]
    assert "(the partition's dataset has [64])" in lines[0]
    nodes_used = json.loads((out / "metrics.json").read_text())["deployment"]["nodes"]
    assert "999" not in {str(v) for v in nodes_used.values()}


def test_a_node_that_dies_is_dropped_and_recorded(setup, tmp_path):
    from flower_fake_grid import FakeGrid

    app = _app(setup, "app-dead", "clients_per_round=3")
    out = tmp_path / "deployed"
    grid = FakeGrid(app, _nodes(setup), run_config_overrides={"out": str(out)})
    real, victim = grid.send_and_receive, _train_node(setup, 1)

    def dies_after_round_one(messages, *, timeout=None):
        if grid.sent.count("train.pflx_round") >= 3:
            grid.dead.add(victim)  # this client's SuperNode is gone from round 2 on
        return real(messages, timeout=timeout)

    grid.send_and_receive = dies_after_round_one
    _serve(grid)
    rows = [line.split(",") for line in (out / "participation.csv").read_text().splitlines()[1:]]
    dropped = [r for r in rows if r[3] != "trained"]
    assert {(r[0], r[2]) for r in dropped} == {("2", str(victim)), ("3", str(victim))}
    assert all(r[3].startswith("no reply within") for r in dropped)
    m = json.loads((out / "metrics.json").read_text())
    assert m["communication"]["client_rounds"] == 3 + 2 + 2
    assert m["train"]["num_clients"] == 2  # the dead client was not evaluated either


def test_too_few_replies_fail_the_run_and_write_nothing(setup, tmp_path):
    from flower_fake_grid import FakeGrid

    from pfl_cli.errors import RunError

    app = _app(setup, "app-min", "clients_per_round=3")
    out = tmp_path / "deployed"
    grid = FakeGrid(app, _nodes(setup), run_config_overrides={"out": str(out), "min-clients": 3})
    real, victim = grid.send_and_receive, _train_node(setup, 2)

    def dies_after_handshake(messages, *, timeout=None):
        if "query.pflx_hello" in grid.sent:
            grid.dead.add(victim)
        return real(messages, timeout=timeout)

    grid.send_and_receive = dies_after_handshake
    with pytest.raises(RunError, match=r"round 1: 2 of the cohort's 3 clients replied .* fewer than min-clients \(3\)"):
        _serve(grid)
    assert not out.exists()


@pytest.mark.parametrize("sets, message", [
    (["algorithm=pefll"], "flower app: algorithm must be one of fedavg, fedprox (what runs on Flower so far); got 'pefll'."),
    (["val_fraction=0.1"], "flower app: val_fraction must be 0 on Flower"),
    (["finetune_steps=3"], "flower app: finetune_steps must be 0 on Flower"),
])
def test_flower_app_refuses_what_it_does_not_run(setup, cli, sets, message):
    args = ["flower", "app", "--config", setup / "recipe.yaml", "--partition", setup / "part", "--out",
            setup / "refused"]
    for s in sets:
        args += ["--set", s]
    r = cli(*args)
    assert r.code == 2 and message in r.err and len(r.err.strip().splitlines()) == 1
    assert not (setup / "refused").exists()


def test_flower_app_writes_a_valid_flower_app(setup, cli):
    from flwr.cli.config_utils import load_and_validate

    app = _app(setup, "app-valid")
    config, warnings = load_and_validate(app / "pyproject.toml")
    assert config is not None and warnings == []
    components = config["tool"]["flwr"]["app"]["components"]
    assert components == {"serverapp": "pflx_flower_app.server_app:app", "clientapp": "pflx_flower_app.client_app:app"}
    run = config["tool"]["flwr"]["app"]["config"]
    assert json.loads(run["pflx-config"])["algorithm"] == "fedavg"
    assert run["out"] == str((setup / "app-valid-train").resolve())
    r = cli("flower", "app", "--config", setup / "recipe.yaml", "--partition", setup / "part", "--out", app)
    assert r.code == 2 and "exists; pass --force" in r.err
