"""`pflx flower app` and the Flower app it writes: FedAvg / FedProx / PeFLL / pFedHN on Flower's Message API.

The protocol runs in process here (``flower_fake_grid``: the generated ClientApp called with
Flower's own messages); ``test_flower_loopback.py`` runs it on a real SuperLink and SuperNodes.
Equality with ``pflx train``: each node trains its one client on the batches the simulation
draws for it (the server ships the round generator's state) and the server's aggregation is
the simulation's code, so the weights agree to float rounding; we measured bitwise equality
and assert max |difference| <= 1e-6. PeFLL: every tensor of Alg. 8 is the simulation's bitwise
except the embedding network's gradient, a sum of the nodes' VJPs on the server where the
simulation back-propagates the whole cohort's batch at once (the same terms in another order);
we measured max |difference| 3e-8 (hypernetwork) and 9e-8 (embedding) after 3 rounds and
assert <= 1e-6.
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


def _deploy_and_simulate(setup, name: str, *sets: str):
    """One deployment (fake grid) of ``sets`` and its simulation: (grid, deployed, simulated, sim model.pt)."""
    from flower_fake_grid import FakeGrid

    app = _app(setup, f"app-{name}", *sets)
    grid = FakeGrid(app, _nodes(setup), run_config_overrides={"out": str(setup / f"deployed-{name}")})
    _serve(grid)
    sim = _simulate(setup, setup / f"sim-{name}", *sets)
    return grid, setup / f"deployed-{name}", setup / f"sim-{name}", sim


@pytest.fixture(scope="module")
def pefll_run(setup):
    """One PeFLL deployment (fake grid) and its simulation, shared by the PeFLL tests."""
    return _deploy_and_simulate(setup, "pefll", "algorithm=pefll")


def _assert_deployment_is_the_simulation(deployed, simulated, sim, algorithm: str, nets: tuple) -> dict:
    """The deployed artifact's ``nets`` weights within 1e-6 of the simulation's, its metrics and ledger
    equal; returns the deployed metrics.json."""
    got = torch.load(deployed / "model.pt", weights_only=True)
    assert got["algorithm"] == algorithm
    for net in nets:
        assert got["weights"][net].keys() == sim["weights"][net].keys()
        for k, v in sim["weights"][net].items():
            assert torch.allclose(got["weights"][net][k], v, rtol=0, atol=1e-6), (net, k)
    m_sim = json.loads((simulated / "metrics.json").read_text())
    m_got = json.loads((deployed / "metrics.json").read_text())
    for group in ("train", "holdout"):
        assert m_got[group]["pooled_accuracy"] == pytest.approx(m_sim[group]["pooled_accuracy"], abs=1e-12)
        assert m_got[group]["loss"] == pytest.approx(m_sim[group]["loss"], rel=1e-5)
    assert m_got["communication"] == m_sim["communication"]
    return m_got


def test_pefll_on_flower_equals_pflx_train(pefll_run):
    grid, deployed, simulated, sim = pefll_run
    _assert_deployment_is_the_simulation(deployed, simulated, sim, "pefll", ("hypernetwork", "embedding"))
    # The frozen standardization comes from the first cohort client's descriptor of round 1: the
    # node's forward pass of step 6 is the simulation's, bit for bit.
    got = torch.load(deployed / "model.pt", weights_only=True)
    assert torch.equal(got["weights"]["descriptor_stats"], sim["weights"]["descriptor_stats"])
    # Alg. 8's three exchanges per cohort client per round, then Alg. 7's two per node to evaluate.
    for kind in ("train.pflx_pefll_describe", "train.pflx_pefll_local", "train.pflx_pefll_backprop"):
        assert grid.sent.count(kind) == 3 * 2
    assert grid.sent.count("query.pflx_pefll_describe") == grid.sent.count("evaluate.pflx_pefll_model") == 4


def test_pefll_wire_bytes_are_the_ledgers_six_messages(pefll_run):
    """§1.5's messages come in pairs of equal shapes: eta_v down / d eta_v up, v up / dv down, theta down /
    delta theta up; on the wire each float is 4 bytes plus one .npy header per array."""
    _, deployed, _, _ = pefll_run
    m = json.loads((deployed / "metrics.json").read_text())
    down, up = m["wire"]["bytes_down"], m["wire"]["bytes_up"]
    assert down["train.descriptor"] == up["train.embedding_grad"]     # eta_v, d eta_v
    assert up["train.descriptor"] == down["train.embedding_grad"]     # v, dv
    assert down["train.model"] == up["train.model"]                   # theta, delta theta
    ledger = m["communication"]["total_bytes"]
    assert m["wire"]["train_round_bytes"] == sum(down[k] + up[k] for k in down if k.startswith("train"))
    assert ledger < m["wire"]["train_round_bytes"] < 1.1 * ledger


@pytest.mark.parametrize("run, steps", [("pefll_run", 0), ("pfedhn_run", None)])
def test_deployed_artifact_serves_new_clients_with_predict(request, run, steps, cli):
    """predict on the deployed artifact gives the holdout node's accuracy the deployment measured (PeFLL:
    Alg. 7, no optimizer step; pFedHN: A.9.4's embedding fit, with predict's generator)."""
    _, deployed, _, _ = request.getfixturevalue(run)
    setup = deployed.parent
    r = cli("predict", "--model", deployed, "--partition", setup / "part", "--clients", "holdout",
            "--out", setup / f"pred-{run}", "--format", "json")
    assert r.code == 0, r.err
    pred = json.loads(r.out)
    assert pred["num_clients"] == 1 and (steps is None or pred["optimizer_steps"] == steps)
    m = json.loads((deployed / "metrics.json").read_text())
    assert pred["mean_accuracy"] == pytest.approx(m["holdout"]["mean_accuracy"], abs=1e-12)


def test_pefll_node_joining_after_training_gets_its_model_in_one_round_trip(setup, tmp_path, pefll_run):
    """The holdout client's SuperNode connects only while the rounds run: after training the server
    handshakes it and serves it by Alg. 7 (descriptor up, model down, zero steps), the model and the
    accuracy the run gives when the node is there from the start."""
    from flower_fake_grid import FakeGrid
    from flwr.app import Context, RecordDict

    from pfl_cli.artifacts import load_partition

    part, _, _ = load_partition(setup / "part")
    holdout = int(np.flatnonzero(part.role == 1)[0])
    nodes = _nodes(setup)
    late = {100 + holdout: nodes.pop(100 + holdout)}
    out = tmp_path / "deployed"
    grid = FakeGrid(setup / "app-pefll", nodes, run_config_overrides={"out": str(out), "connect-timeout": 0.5})
    real = grid.send_and_receive

    def joins_during_training(messages, *, timeout=None):
        if messages and messages[0].metadata.message_type == "train.pflx_pefll_local":
            for node, cfg in late.items():
                grid.contexts[node] = Context(run_id=1, node_id=node, node_config=cfg, state=RecordDict(),
                                              run_config=grid.run_config)
        return real(messages, timeout=timeout)

    grid.send_and_receive = joins_during_training
    _serve(grid)
    m = json.loads((out / "metrics.json").read_text())
    full = json.loads((pefll_run[1] / "metrics.json").read_text())
    assert m["holdout"]["num_clients"] == 1
    assert m["holdout"]["pooled_accuracy"] == full["holdout"]["pooled_accuracy"]
    assert m["deployment"]["nodes"][str(int(part.client_id[holdout]))] == 100 + holdout
    assert grid.sent.count("query.pflx_pefll_describe") == grid.sent.count("evaluate.pflx_pefll_model") == 4


def _pefll_with_a_death(setup, out, victim, exchange: str):
    """A PeFLL deployment (cohort 3) whose ``victim`` node is gone from round 2's ``exchange`` on."""
    from flower_fake_grid import FakeGrid

    app = _app(setup, f"app-pefll-dead-{out.name}", "algorithm=pefll", "clients_per_round=3")
    grid = FakeGrid(app, _nodes(setup), run_config_overrides={"out": str(out)})
    real = grid.send_and_receive

    def dies_in_round_two(messages, *, timeout=None):
        if messages and messages[0].metadata.message_type == exchange and grid.sent.count(exchange) >= 3:
            grid.dead.add(victim)
        return real(messages, timeout=timeout)

    grid.send_and_receive = dies_in_round_two
    _serve(grid)
    return torch.load(out / "model.pt", weights_only=True)["weights"]


def test_pefll_node_dying_mid_round_is_dropped_and_recorded(setup, tmp_path):
    """A node that trained in round 2 but never returns its d eta_v, then is gone (round 3): both rounds
    complete with the others, and round 2's step is the one without it from the start (its theta and
    delta theta discarded, the hypernetwork's VJP recomputed over the others, their d eta_v rescaled)."""
    victim = _train_node(setup, 1)
    late = _pefll_with_a_death(setup, tmp_path / "late", victim, "train.pflx_pefll_backprop")
    early = _pefll_with_a_death(setup, tmp_path / "early", victim, "train.pflx_pefll_describe")
    for net in ("hypernetwork", "embedding"):
        for k, v in early[net].items():
            assert torch.isfinite(late[net][k]).all() and torch.allclose(late[net][k], v, rtol=0, atol=1e-6), k
    rows = [line.split(",") for line in (tmp_path / "late" / "participation.csv").read_text().splitlines()[1:]]
    dropped = [(r[0], r[2]) for r in rows if r[3] != "trained"]
    assert dropped == [("2", str(victim)), ("3", str(victim))]
    m = json.loads((tmp_path / "late" / "metrics.json").read_text())
    assert m["communication"]["client_rounds"] == 3 + 2 + 2


@pytest.fixture(scope="module")
def pfedhn_run(setup):
    """One pFedHN deployment (fake grid) and its simulation, shared by the pFedHN tests."""
    return _deploy_and_simulate(setup, "pfedhn", *PFEDHN)


PFEDHN = ("algorithm=pfedhn", "embed_rounds=3")


def test_pfedhn_on_flower_equals_pflx_train(pfedhn_run):
    """Alg. 1 split across the network: theta_i = h(v_i) down, K steps on the node, delta theta_i up, the
    server's step. Every tensor is the simulation's: the node computes theta~ - theta, the server
    negates it (the simulation's theta - theta~, the same float), so the weights agree bitwise
    (asserted to 1e-6, as the other algorithms)."""
    grid, deployed, simulated, sim = pfedhn_run
    m_got = _assert_deployment_is_the_simulation(deployed, simulated, sim, "pfedhn", ("hypernetwork", "table"))
    got = torch.load(deployed / "model.pt", weights_only=True)
    assert torch.equal(got["weights"]["partition_sha"], sim["weights"]["partition_sha"])
    down, up = m_got["wire"]["bytes_down"], m_got["wire"]["bytes_up"]
    assert down["train.model"] == up["train.model"]  # theta_i down, delta theta_i of the same shapes up
    # One exchange per cohort client per round; the holdout client's embedding fit (embed_rounds = 3
    # exchanges), then every node's model to evaluate.
    assert grid.sent.count("train.pflx_pfedhn_local") == 3 * 2 + 3
    assert grid.sent.count("evaluate.pflx_pfedhn_model") == 4


def test_pfedhn_node_dying_mid_run_is_dropped_and_recorded(setup, tmp_path):
    """A train node gone from round 2 on: the rounds complete with the clients that reply (the server's
    step averages over them), participation.csv records the drops, the weights stay finite."""
    from flower_fake_grid import FakeGrid

    victim = _train_node(setup, 1)
    app = _app(setup, "app-pfedhn-dead", *PFEDHN, "clients_per_round=3")
    out = tmp_path / "deployed"
    grid = FakeGrid(app, _nodes(setup), run_config_overrides={"out": str(out)})
    real = grid.send_and_receive

    def dies_in_round_two(messages, *, timeout=None):
        if messages and messages[0].metadata.message_type == "train.pflx_pfedhn_local" and \
                grid.sent.count("train.pflx_pfedhn_local") >= 3:
            grid.dead.add(victim)
        return real(messages, timeout=timeout)

    grid.send_and_receive = dies_in_round_two
    _serve(grid)
    weights = torch.load(out / "model.pt", weights_only=True)["weights"]
    assert all(torch.isfinite(v).all() for v in weights["hypernetwork"].values())
    rows = [line.split(",") for line in (out / "participation.csv").read_text().splitlines()[1:]]
    assert [(r[0], r[2]) for r in rows if r[3] != "trained"] == [("2", str(victim)), ("3", str(victim))]
    m = json.loads((out / "metrics.json").read_text())
    assert m["communication"]["client_rounds"] == 3 + 2 + 2
    assert m["train"]["num_clients"] == 2  # the dead node has no evaluation either


DP = ("dp_epsilon=4", "dp_clip=1", "dp_population=4", "normalize=false")


def _outputs(artifact) -> set:
    return {o["path"] for o in json.loads((artifact / "manifest.json").read_text())["outputs"]}


def test_dp_fedavg_on_flower_is_pflx_train_dp_with_seeded_noise(setup, tmp_path, caplog, cli):
    """DP-FedAvg on Flower: the server draws the Poisson cohort, clips each node's delta and adds the noise
    (FedAvg.aggregate, the simulation's code). With noise=seeded the model is `pflx train --dp`'s; the
    artifact is the same DP artifact (ledger, model, public facts), its release contract holds, and
    nothing private is logged, written or evaluated: no loss, no cohort, no participation, no accuracy."""
    from flower_fake_grid import FakeGrid

    from pfl_cli.artifacts import release_contract_violations

    app = _app(setup, "app-dp-seeded", *DP, "dp_noise=seeded")
    out = tmp_path / "deployed"
    grid = FakeGrid(app, _nodes(setup), run_config_overrides={"out": str(out)})
    with caplog.at_level(logging.INFO):
        _serve(grid)
    sim = _simulate(setup, tmp_path / "sim", *DP, "dp_noise=seeded")
    got = torch.load(out / "model.pt", weights_only=True)
    for k, v in sim["weights"]["client"].items():
        assert torch.allclose(got["weights"]["client"][k], v, rtol=0, atol=1e-6), k
    assert not torch.equal(got["weights"]["client"]["fc1.weight"], _simulate(setup, tmp_path / "plain")["weights"]
                           ["client"]["fc1.weight"])  # the noise is there
    assert json.loads((out / "privacy.json").read_text()) == json.loads((tmp_path / "sim" / "privacy.json").read_text())
    assert _outputs(out) == _outputs(tmp_path / "sim")  # no participation.csv, no metrics.csv, no clients.csv
    assert release_contract_violations(out) == []
    m = json.loads((out / "metrics.json").read_text())
    assert "train" not in m and "communication" not in m and "wire" not in m and m["dp"]["noise"] == "seeded"
    pflx_lines = [r.getMessage() for r in caplog.records if "pflx:" in r.getMessage()]
    assert any("round 3/3" in line for line in pflx_lines)
    assert not any("loss" in line or "clients" in line or "dropped" in line for line in pflx_lines), pflx_lines
    assert grid.sent.count("evaluate.pflx_final") == 0  # no evaluation on private test data unless asked
    r = cli("privacy-account", out)  # the deployment's ledger, read as any train --dp artifact's
    assert r.code == 0 and "(epsilon = 4, delta = 1e-06)-DP for each client" in r.out, r.err


def test_under_dp_a_node_learns_only_that_it_was_selected(setup, tmp_path):
    """Under --dp the realized cohort is secret (the ledger's sampling amplification rests on it): a node's
    training message holds the global model, the round number and its own batches (positions in its own
    data, as wide as min(batch size, its size)), never the cohort nor the round generator that drew it
    (issue 34, item 3). A fake grid records everything each node receives."""
    from flower_fake_grid import FakeGrid

    from pfl_cli.artifacts import load_partition
    from pfl_cli.interop.flower_app.common import ROUND

    class RecordingGrid(FakeGrid):
        received: list = []

        def send_and_receive(self, messages, *, timeout=None):
            for m in messages:
                self.received.append((m.metadata.dst_node_id, m.metadata.message_type, m.content))
            return super().send_and_receive(messages, timeout=timeout)

    app = _app(setup, "app-dp-recorded", *DP, "dp_noise=seeded")
    grid = RecordingGrid(app, _nodes(setup), run_config_overrides={"out": str(tmp_path / "deployed")})
    _serve(grid)
    part, _, _ = load_partition(setup / "part")
    fit = {100 + k: int(part.train_sizes[k]) for k in range(part.num_clients)}  # val_fraction 0: fit = train
    rounds = [(node, content) for node, kind, content in grid.received if kind == ROUND]
    assert rounds, "no training message was sent"
    for node, content in rounds:
        assert set(content.keys()) == {"global", "round", "batches"}, set(content.keys())
        assert dict(content["round"]) == {"round": dict(content["round"])["round"]}  # the round number alone
        batches = {k: a.numpy() for k, a in content["batches"].items()}
        assert set(batches) == {"slots", "mask"} and batches["slots"].shape == batches["mask"].shape
        assert batches["slots"].shape[1] == min(16, fit[node]) and batches["slots"].max() < fit[node]
    # The model is still the simulation's (the seeded test above), so each node trained on its own batches.


def test_dp_fedavg_on_flower_secure_noise_and_nonprivate_diagnostics(setup, tmp_path):
    """The default noise=secure draws the cohorts and the noise from OS entropy (two runs differ);
    --set write_nonprivate=true adds the diagnostics, in nonprivate* files only."""
    from flower_fake_grid import FakeGrid

    from pfl_cli.artifacts import release_contract_violations

    app = _app(setup, "app-dp-secure", *DP, "write_nonprivate=true")
    models = []
    for run in ("a", "b"):
        out = tmp_path / run
        _serve(FakeGrid(app, _nodes(setup), run_config_overrides={"out": str(out)}))
        models.append(torch.load(out / "model.pt", weights_only=True)["weights"]["client"]["fc1.weight"])
        assert json.loads((out / "privacy.json").read_text())["noise"] == "secure"
        assert release_contract_violations(out) == []
    assert not torch.equal(*models)
    nonprivate = {p for p in _outputs(tmp_path / "a") if p.startswith("nonprivate")}
    assert {"nonprivate.json", "nonprivate-participation.csv", "nonprivate-deployment.json"} <= nonprivate
    assert "train" in json.loads((tmp_path / "a" / "nonprivate.json").read_text())


@pytest.mark.parametrize("sets, message", [
    (["algorithm=pfedhn-pc"], "flower app: algorithm must be one of fedavg, fedprox, pefll, pfedhn (what runs on "
                              "Flower so far); got 'pfedhn-pc'."),
    (["algorithm=pfedhn", "client_sizes=S,M"], "flower app: client_sizes is not deployed on Flower (one model size "
                                               "per run); got 'S,M'; drop it."),
    (["algorithm=pefll", "track_descriptors=true"], "flower app: track_descriptors is not deployed on Flower"),
    (["algorithm=pefll", "dp_epsilon=4", "dp_clip=1", "dp_population=4", "normalize=false"],
     "flower app: dp: --dp runs on Flower for fedavg (DP-FedAvg, the server adding the noise); got 'pefll'."),
    # FedProx declares no DP variant (issue 34, item 9): what the message names is what runs
    (["algorithm=fedprox", "dp_epsilon=4", "dp_clip=1", "dp_population=4", "normalize=false"],
     "flower app: dp: --dp runs on Flower for fedavg (DP-FedAvg, the server adding the noise); got 'fedprox'."),
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


def test_under_dp_the_server_log_names_no_client_and_is_not_flooded(setup, tmp_path, caplog):
    """Under --dp the ServerApp's log names no client (partition id), no client range of the partition and
    no list of clients without a node, and dp_accounting's per-order warnings (absl) stay quiet, as in
    `pflx` itself (issue 34, item 18). Without --dp the same refusals name the partition ids."""
    from flower_fake_grid import FakeGrid

    nodes = _nodes(setup, count=3)  # the fourth client has no node
    nodes[998] = {"partition-dir": str(setup / "part"), "partition-id": 7}  # not a client of the partition
    nodes[997] = {"partition-dir": str(setup / "part"), "partition-id": 1}  # already held by node 101

    def served(name, *sets):
        from pfl_cli.privacy.accounting import cache_clear

        app = _app(setup, name, *sets)
        logging.getLogger("absl").setLevel(logging.NOTSET)  # as in a fresh ServerApp process: nothing calibrated,
        cache_clear()  # absl at its default level
        caplog.clear()
        with caplog.at_level(logging.INFO):
            _serve(FakeGrid(app, dict(nodes), run_config_overrides={"out": str(tmp_path / name)}))
        return [r.getMessage() for r in caplog.records if "pflx:" in r.getMessage()], caplog.records

    plain, _ = served("app-log-plain")
    assert any("partition-id 7" in line and "(0..3)" in line for line in plain), plain
    assert any("no accepted node for clients [3]" in line for line in plain), plain
    private, records = served("app-log-dp", *DP, "dp_noise=seeded", "dp_delta=1e-5")
    refusals = [line for line in private if "refused" in line]
    assert len(refusals) == 2 and all("node 99" in line for line in refusals), private
    assert not any("partition-id 7" in line or "0..3" in line or "[3]" in line or "node 101" in line
                   for line in private), private
    assert any("some clients of the partition have no accepted node" in line for line in private), private
    assert not [r for r in records if r.name.startswith("absl") and r.levelno >= logging.WARNING]


# --secagg on Flower (issue 48): FedAvg's rounds through Flower's SecAgg+ workflow and secaggplus_mod.
class _Recording:
    """A fake grid that records every reply the ServerApp receives (all it ever holds of the nodes)."""

    @staticmethod
    def grid(app, nodes, out):
        from flower_fake_grid import FakeGrid

        class RecordingGrid(FakeGrid):
            def __init__(self, *args, **kwargs):
                super().__init__(*args, **kwargs)
                self.replies = []

            def send_and_receive(self, messages, *, timeout=None):
                replies = super().send_and_receive(messages, timeout=timeout)
                self.replies += [(r.metadata.src_node_id, r.metadata.message_type, r.content) for r in replies]
                return replies

        return RecordingGrid(app, nodes, run_config_overrides={"out": str(out)})


def _rows_and_sums(monkeypatch, row_function: str):
    """Record each node's row (its update before masking) and the secure sum the algorithm's server half gets."""
    from pfl_cli.algorithms.fedavg import FedAvg
    from pfl_cli.interop.flower_app import secure

    rows, sums = [], []
    original, aggregate = getattr(secure, row_function), FedAvg.aggregate_secure

    def recorded(*args, **kwargs):
        rows.append(original(*args, **kwargs))
        return rows[-1]

    def server_half(self, t, total):
        sums.append((t, total.total(), total.count(), total.modulus, {k: v.clone() for k, v in self.global_params.items()}))
        return aggregate(self, t, total)

    monkeypatch.setattr(secure, row_function, recorded)
    monkeypatch.setattr(FedAvg, "aggregate_secure", server_half)
    return rows, sums


def test_secagg_on_flower_server_holds_no_update_and_equals_pflx_train_secagg(setup, tmp_path, monkeypatch):
    """Every reply the ServerApp receives in a round is one of SecAgg+'s: keys, encrypted shares, a masked vector
    (uniform mod 2^32: its entries are not the node's quantized row, which lies below 2^22), num_examples 1 and
    no metrics; no model array. The sum it unmasks is the nodes' rows' sum (Flower's quantization: 2^22 levels
    over [-8, 8]), and the deployed model is `pflx train --secagg`'s to that tolerance (measured 5e-6 after 3
    rounds; asserted 1e-4)."""
    from flwr.common import bytes_to_ndarray
    from flwr.common.secure_aggregation.secaggplus_constants import RECORD_KEY_CONFIGS, Key

    from pfl_cli.fl.secagg import WEIGHT
    from pfl_cli.interop.flower_app.secure import CLIP_RANGE, QUANT_RANGE

    rows, sums = _rows_and_sums(monkeypatch, "plain_row")
    grid = _Recording.grid(_app(setup, "app-secagg", "secagg=true"), _nodes(setup), tmp_path / "deployed")
    _serve(grid)
    train = [(node, content) for node, kind, content in grid.replies if kind == "train"]
    assert len(train) == 3 * 2 * 4  # rounds x cohort x SecAgg+'s four stages
    masked = 0
    for node, content in train:
        assert all(len(record) == 0 for record in content.array_records.values()), (node, list(content.keys()))
        if "fitres.num_examples" in content.metric_records:  # the masked-vector stage: Flower's FitRes fields
            assert dict(content.metric_records["fitres.num_examples"]) == {"num_examples": 1}  # no size revealed
            assert len(content.config_records["fitres.metrics"]) == 0  # no loss, no metric
        assert set(content.metric_records) <= {"fitres.num_examples"}
        config = content.config_records[RECORD_KEY_CONFIGS]
        if Key.MASKED_PARAMETERS in config:
            masked += 1
            vector = np.concatenate([bytes_to_ndarray(b).ravel() for b in config[Key.MASKED_PARAMETERS][1:]])
            assert (vector >= 2 * QUANT_RANGE).mean() > 0.95, "a masked vector looks like a quantized row"
    assert masked == 3 * 2 and len(rows) == 3 * 2 and len(sums) == 3
    step = 2 * CLIP_RANGE / QUANT_RANGE  # one quantization level: Flower rounds each coordinate of a row to one
    for t, total, count, modulus, start in sums:
        assert count == 2 and modulus is None
        own = rows[2 * t: 2 * t + 2]  # (w_i Delta_i, w_i) of this round's two nodes
        weight = sum(float(r[WEIGHT][0]) for r in own)
        assert float(total[WEIGHT]) == pytest.approx(weight, abs=2 * step)
        for k, g in start.items():  # sum_i w_i theta_i = sum_i w_i Delta_i + g sum_i w_i
            want = sum(torch.as_tensor(r[k]) for r in own) + g.double() * weight
            assert float((total[k].double() - want).abs().max()) <= 2 * step * (1 + float(g.abs().max())) + 1e-6, k
    # The deployed model against `pflx train --secagg`: each round's aggregate is the simulation's to Flower's
    # quantization, and later rounds train from it; a ReLU flipped by that difference moves a unit's weights by
    # more (measured: max 6e-6 in most runs, 6e-4 in one of three), so the bounds are on each tensor's median, the
    # whole model's mean and a loose max. (A per-tensor mean failed CI in one run of three: one flipped unit at 3.2e-4
    # in fc1.bias, whose few entries lifted its mean to 2.15e-5, the other entries at 1e-6.)
    sim = _simulate(setup, tmp_path / "sim", "secagg=true")
    got = torch.load(tmp_path / "deployed" / "model.pt", weights_only=True)
    diffs = {k: (got["weights"]["client"][k] - v).abs() for k, v in sim["weights"]["client"].items()}
    for k, diff in diffs.items():
        assert float(diff.median()) < 2e-5 and float(diff.max()) < 5e-3, (k, float(diff.median()), float(diff.max()))
    whole = torch.cat([d.flatten() for d in diffs.values()])
    assert float(whole.mean()) < 2e-5, float(whole.mean())
    m_got = json.loads((tmp_path / "deployed" / "metrics.json").read_text())
    m_sim = json.loads((tmp_path / "sim" / "metrics.json").read_text())
    assert m_got["communication"] == m_sim["communication"]
    assert m_got["wire"]["bytes_up"]["train.secaggplus"] > 0


@pytest.mark.slow
def test_ddg_on_flower_nodes_add_their_noise_and_the_server_unmasks_their_exact_sum(setup, tmp_path, monkeypatch):
    """dp_mechanism=ddg under --secagg on Flower: each node clips, encodes and adds its discrete Gaussian share
    (pfl_cli.privacy.distributed) before SecAgg+ masks it; the integers pass Flower's quantizer exactly, so the
    sum the server's half receives is the nodes' rows' sum mod 2^b, bit for bit. The artifact is a DP artifact
    whose release contract holds, with the simulation's ledger."""
    from pfl_cli.artifacts import release_contract_violations

    rows, sums = _rows_and_sums(monkeypatch, "ddg_row")
    ddg = ("secagg=true", "dp_epsilon=4", "dp_clip=1", "dp_mechanism=ddg", "normalize=false", "dp_noise=seeded")
    out = tmp_path / "deployed"
    _serve(_Recording.grid(_app(setup, "app-secagg-ddg", *ddg), _nodes(setup), out))
    assert len(rows) == 3 * 2 and len(sums) == 3
    for t, total, count, modulus, _ in sums:
        assert count == 2 and modulus == 2 ** 20
        own = rows[2 * t: 2 * t + 2]
        for k, v in total.items():
            want = (sum(torch.as_tensor(r[k]).to(torch.int64) + 2 ** 19 for r in own)).remainder(modulus)
            assert torch.equal(v.cpu().view(-1), want.view(-1)), k
    assert release_contract_violations(out) == []
    sim = tmp_path / "sim"
    _simulate(setup, sim, *ddg)
    assert json.loads((out / "privacy.json").read_text()) == json.loads((sim / "privacy.json").read_text())


@pytest.mark.parametrize("sets, message", [
    (["algorithm=pefll", "secagg=true"], "flower app: secagg runs on Flower's SecAgg+ for fedavg, fedprox"),
    (["secagg=true", "dp_epsilon=4", "dp_clip=1", "dp_population=4", "normalize=false"],
     "flower app: secagg with --dp runs on Flower with the distributed mechanism only"),
    (["secagg=true", "dp_epsilon=4", "dp_clip=1", "dp_mechanism=ddg", "dp_bits=31", "normalize=false"],
     "flower app: dp_bits must be at most 30 on Flower"),
])
def test_flower_app_refuses_what_secagg_does_not_run(setup, cli, sets, message):
    args = ["flower", "app", "--config", setup / "recipe.yaml", "--partition", setup / "part", "--out",
            setup / "refused-secagg"]
    for s in sets:
        args += ["--set", s]
    r = cli(*args)
    assert r.code == 2 and message in r.err and len(r.err.strip().splitlines()) == 1, r.err
    assert not (setup / "refused-secagg").exists()
