"""Secure aggregation (pfl_cli.fl.secagg): the server step reads sums only, generated over the registry."""

import dataclasses
from pathlib import Path

import numpy as np
import pytest
import torch

from pfl_cli import registry
from pfl_cli.errors import ConfigError
from pfl_cli.fl.api import plan_dp, validate_train_config
from pfl_cli.fl.secagg import SecureSum, audit_individual_reads, individual_reads, secure_sum, table_markdown
from pflx_testing import needs_backbone, small_config, smoke_values

DOC = Path(__file__).resolve().parents[2] / "docs" / "privacy" / "secure-aggregation.md"
BASE = dict(mlp_hidden=(8,), local_steps=2, batch_size=8, lr=0.05, momentum=0.5, normalize=False, val_fraction=0.0,
            clients_per_round=4)
COHORT = torch.tensor([0, 3, 5, 8])


def _algorithms() -> dict:
    return {name: registry.get(name).algorithm for name in registry.names()}


SECURE = [n for n, cls in _algorithms().items() if individual_reads(cls) == ""]
REFUSED = [n for n, cls in _algorithms().items() if individual_reads(cls)]


@pytest.fixture(scope="module")
def uneven_store():
    """Digits over 10 clients of 9 to 27 train samples each: FedAvg's size weights matter."""
    from pfl_cli.data import load_dataset
    from pfl_cli.fl.store import build_store
    from pfl_cli.partition.base import Partition

    ds = load_dataset("builtin:digits")
    order = np.random.default_rng(1).permutation(ds.num_samples)
    sizes = 9 + 2 * np.arange(10)
    train_off = np.concatenate([[0], np.cumsum(sizes)])
    test_idx = order[train_off[-1]:train_off[-1] + 50]
    part = Partition(client_id=np.arange(10), role=np.zeros(10, np.uint8), train_offsets=train_off,
                     train_indices=order[:train_off[-1]], test_offsets=np.arange(11) * 5, test_indices=test_idx)
    return build_store(ds.x / 16.0, ds.y, ds.num_classes, part, val_fraction=0.0, rng=None, device="cpu",
                       normalize=False)


def _leaves(tree) -> list:
    if isinstance(tree, torch.Tensor):
        return [tree.detach().reshape(-1).to(torch.float64)] if tree.is_floating_point() else []
    return [v for k in sorted(tree) for v in _leaves(tree[k])] if isinstance(tree, dict) else []


def _flat(alg) -> torch.Tensor:
    """The server's model: every float tensor of the algorithm's weights (the global "client" model, FedEM's
    components, LD-FedAvg's psi, HyperFL's hypernetwork, FedProto's prototypes, ...) but the clients' private state
    (trained on the server's model, where float rounding grows over local steps)."""
    weights = alg.weights()
    return torch.cat(_leaves({k: v for k, v in weights.items() if k != "private"}))


def test_secure_sum_holds_sums_and_count_only():
    rows = {"w": torch.arange(6.0).view(3, 2), "b": torch.ones(3)}
    s = secure_sum(rows)
    assert s.count() == 3 and torch.equal(s.total()["w"], torch.tensor([6.0, 9.0])) and s.total()["b"].item() == 3
    assert not hasattr(s, "__dict__") and set(SecureSum.__slots__) == {"_total", "_count", "_modulus"}
    with audit_individual_reads():
        secure_sum(rows)
    assert torch.isnan(rows["w"]).all()  # the instrument: a summed row is no longer readable
    ints = secure_sum({"q": torch.tensor([[7, 1], [6, 2]])}, modulus=8)
    assert ints.total()["q"].tolist() == [5, 3]


def test_every_algorithm_declares_what_its_server_reads():
    """A class attribute in each algorithm's own body (not inherited): the docs table's source."""
    undeclared = [n for n, cls in _algorithms().items() if not isinstance(individual_reads(cls), str)]
    assert undeclared == []
    assert {"fedavg", "fedprox", "fedexp"} <= set(SECURE)


def test_docs_table_is_generated_from_the_registry():
    text = DOC.read_text()
    assert table_markdown(_algorithms()) in text, (
        "docs/privacy/secure-aggregation.md's table is stale: paste pfl_cli.fl.secagg.table_markdown(...) of the "
        "registry between its markers")


@pytest.mark.parametrize("algorithm", REFUSED)
def test_secagg_refused_in_one_line_naming_the_individual_read(algorithm):
    cfg = dataclasses.replace(registry.train_config(algorithm), secagg=True)
    with pytest.raises(ConfigError) as err:
        validate_train_config(cfg)
    msg = str(err.value)
    assert "\n" not in msg and individual_reads(registry.get(algorithm).algorithm) in msg, msg


@pytest.mark.parametrize("algorithm", SECURE)
def test_secagg_round_equals_the_plain_round_and_reads_no_individual_update(uneven_store, algorithm):
    """Two rounds plain and under --secagg with every summed row poisoned (NaN): the server under secure
    aggregation computes the same model (to float rounding of sum-then-divide), so it read no individual row."""
    values = {**BASE, **smoke_values(algorithm), **({"backbone": "resnet-micro"} if needs_backbone(algorithm) else {})}
    if registry.get(algorithm).algorithm.dp_required:  # local DP (its noise seeded: the same in both runs)
        values.update(normalize=False, rounds=2, dp_epsilon=4.0, dp_delta=1e-5, dp_clip=0.5, dp_noise="seeded",
                      dp_sampling_rate=0.25)
    models = []
    for secagg in (False, True):
        cfg = small_config(algorithm, **values)
        cfg = dataclasses.replace(cfg, secagg=secagg)
        validate_train_config(cfg)
        alg = cfg.algorithm_class(cfg, uneven_store)
        if alg.dp_required:
            alg.dp = plan_dp(cfg, uneven_store)
        with audit_individual_reads():
            for t in range(2):
                alg.run_round(t, COHORT, torch.Generator().manual_seed(11 + t))
        models.append(_flat(alg))
    assert torch.isfinite(models[1]).all(), f"{algorithm}: its server read a poisoned individual update"
    assert not torch.equal(models[0], _flat(cfg.algorithm_class(cfg, uneven_store)))  # it trained
    torch.testing.assert_close(models[1], models[0], rtol=1e-5, atol=1e-6)


def test_fedexp_step_size_from_sums_equals_the_individual_one(uneven_store):
    """FedExP's eta_g: its numerator sum_i p_i ||Delta_i||^2 from the clients' own terms equals the server's."""
    etas = []
    for secagg in (False, True):
        cfg = dataclasses.replace(small_config("fedexp", **BASE), secagg=secagg)
        alg = cfg.algorithm_class(cfg, uneven_store)
        for t in range(3):
            alg.run_round(t, COHORT, torch.Generator().manual_seed(t))
        etas.append(alg.server_eta)
    assert max(etas[0]) > 1.0  # an extrapolating step was taken
    np.testing.assert_allclose(etas[1], etas[0], rtol=1e-5)


@pytest.mark.parametrize("algorithm", ["fedavg", "ffa-lora", "fedsa-lora"])
def test_central_dp_under_secagg_equals_dp_fedavg_bit_for_bit(uneven_store, algorithm):
    """Clients clip their own deltas, the secure sum gets the server's noise: DP-FedAvg's release, torch.equal
    (FedAvg's whole model, FFA-LoRA's B and classifier, FedSA-LoRA's A)."""
    from pfl_cli.fl.dp import ClientLevelDP

    dp = ClientLevelDP(1.0, 1e-6, 0.05, 0.4, 10, 2, 0.7, denominator=4.0)
    models = []
    for secagg in (False, True):
        cfg = dataclasses.replace(small_config(algorithm, **{**BASE, **smoke_values(algorithm)}), secagg=secagg, dp_epsilon=1.0, dp_clip=0.05,
                                  dp_noise="seeded", dp_population=10)
        alg = cfg.algorithm_class(cfg, uneven_store)
        alg.dp = dp
        with audit_individual_reads():
            for t in range(2):
                alg.run_round(t, COHORT, torch.Generator().manual_seed(t))
        models.append(_flat(alg))
    assert torch.equal(models[0], models[1])


def test_secagg_key_changes_nothing_else_it_is_refused_with_the_reason():
    """The one-line refusal of an algorithm whose server reads individual updates names the quantity."""
    cfg = dataclasses.replace(registry.train_config("pefll"), secagg=True)
    with pytest.raises(ConfigError, match="hypernetwork"):
        validate_train_config(cfg)


def test_cli_secagg_refusal_exit_2(cli, tmp_path):
    part = tmp_path / "part"
    r = cli("partition", "--dataset", "builtin:digits", "--num-clients", "6", "--out", str(part))
    assert r.code == 0
    r = cli("train", "--partition", str(part), "--algorithm", "fedfomo", "--secagg", "--out", str(tmp_path / "x"))
    assert r.code == 2 and "--secagg" in r.err and not (tmp_path / "x").exists()



def test_ifca_cluster_means_from_per_cluster_secure_sums_equal_the_plain_ones():
    """IFCA under --secagg: rows of k slots (zero but the chosen cluster's) summed securely give every cluster's
    weighted mean, and a cluster no client chose keeps its model, as :func:`cluster_means` does."""
    from pfl_cli.fl.clusters import cluster_means, cluster_means_secure

    g = torch.Generator().manual_seed(0)
    theta = {"w": torch.randn(5, 3, 2, generator=g), "b": torch.randn(5, 2, generator=g)}
    old = {"w": torch.randn(4, 3, 2, generator=g), "b": torch.randn(4, 2, generator=g)}
    assign, size = torch.tensor([0, 2, 2, 0, 3]), torch.tensor([9, 11, 13, 15, 17])
    plain = cluster_means(theta, assign, size, old)
    with audit_individual_reads():
        secure = cluster_means_secure({k: v.clone() for k, v in theta.items()}, assign, size, old)
    for k in theta:
        torch.testing.assert_close(secure[k], plain[k], rtol=1e-5, atol=1e-6)
    assert torch.equal(secure["w"][1], old["w"][1])  # cluster 1: no client chose it
