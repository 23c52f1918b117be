"""The communication ledger: figures in metrics.json equal the numel of the tensors really exchanged."""

import pytest
import torch

from pfl_cli.fl import train_federated
from pflx_testing import small_config
from pfl_cli.fl.communication import Traffic
from pfl_cli.models import build, num_parameters

BASE = dict(mlp_hidden=(8,), hyper_hidden=16, embed_dim=4, descriptor_batch=8, batch_size=8, rounds=4,
            eval_every=2, local_steps=2, clients_per_round=3)


def test_ledger_sums_and_resumes():
    t = Traffic()
    t.send("w", torch.zeros(3, 5))           # a per-client stack: 3 clients x 5 floats
    t.receive("w", torch.zeros(7), copies=3)  # 3 messages of 7 floats
    t.close_round(3)
    s = t.summary()
    assert (s["floats_down_per_client_round"], s["floats_up_per_client_round"]) == (5, 7)
    assert s["total_bytes"] == 4 * (15 + 21) and s["bytes_per_round"] == 4 * 36
    again = Traffic()
    again.load_state(t.state())
    assert again.summary() == s


@pytest.mark.parametrize("alg", ["fedavg", "pefll", "local"])
def test_metrics_match_the_message_tensors(digits_clients, alg):
    ds, part = digits_clients
    cfg = small_config(algorithm=alg, local_epochs=1 if alg == "local" else None, **BASE)
    run = train_federated(ds.x, ds.y, ds.num_classes, part, cfg, device="cpu")
    comm = run.algorithm.traffic.summary()
    arch = run.model["arch"]
    d = num_parameters(arch["client"])
    if alg == "local":
        assert comm["total_bytes"] == 0 and comm["rounds"] == 0
        return
    assert comm["rounds"] == 4 and comm["client_rounds"] == 12
    if alg == "fedavg":
        down = up = d
    else:  # theta + eta_v + dv down; delta + d eta_v + v up (PeFLL §1.5)
        e = num_parameters(arch["embedding"])
        down = up = d + e + arch["hypernetwork"]["in_dim"]
        assert 2 * down == type(run.algorithm).floats_per_client_round(arch)
    assert comm["floats_down_per_client_round"] == down and comm["floats_up_per_client_round"] == up
    assert comm["total_bytes"] == 4 * 12 * (down + up) and comm["bytes_per_round"] == 4 * 3 * (down + up)
    net = build(arch["client"])
    msgs = run.algorithm.exchanged()
    for k, p in net.named_parameters():  # the model-sized messages are exactly the client net's tensors
        assert msgs["down"][k] == p.numel()


@pytest.mark.parametrize("alg", ["pfedhn", "pfedhn-pc", "fedrep", "fedbabu"])
def test_the_reported_floats_are_the_measured_ones(digits_clients, alg):
    """floats_per_client_round (metrics.json) against the tensors the run really sent and received."""
    ds, part = digits_clients
    cfg = small_config(algorithm=alg, **BASE)
    run = train_federated(ds.x, ds.y, ds.num_classes, part, cfg, device="cpu")
    comm = run.algorithm.traffic.summary()
    measured = comm["floats_down_per_client_round"] + comm["floats_up_per_client_round"]
    assert type(run.algorithm).floats_per_client_round(run.model["arch"]) == measured
