"""Compressed uploads of the methods whose upload is a delta of a part of the model (issue 47): FedPer, FedRep and
LG-FedAvg send their shared part's delta, FedBABU its body's. One round with top-k compression (no error memory)
against a reference that takes each client's top-k by a per-client sort and averages the decoded models by hand."""

import math

import numpy as np
import pytest
import torch

from baseline_support import alg_factory, gen
from pfl_cli.fl.compression import UploadCodec
from pfl_cli.fl.store import ROLE_TRAIN
from pflx_testing import small_config

DENSITY = 0.1


def shared_names(alg):
    return list(alg.shared) if hasattr(alg, "shared") else list(alg.body)


def topk_row(u: np.ndarray, k: int) -> np.ndarray:
    keep = np.argsort(-np.abs(u), kind="stable")[:k]
    out = np.zeros_like(u)
    out[keep] = u[keep]
    return out


@pytest.mark.parametrize("name", ["fedper", "fedrep", "lg-fedavg", "fedbabu"])
def test_the_shared_parts_delta_is_what_is_compressed(store, name):
    cfg = small_config(algorithm=name, mlp_hidden=(8,), local_steps=3, batch_size=8, lr=0.1, clients_per_round=4)
    alg, plain = alg_factory(cfg)(store), alg_factory(cfg)(store)
    alg.upload_codec = UploadCodec("topk", density=DENSITY, levels=16, error_feedback=False,
                                   num_clients=store.num_clients, seed=0)
    alg.upload_codec.begin_round(0)
    seen = {}
    sgd = plain.cohort_sgd

    def record(*a, **k):
        out = sgd(*a, **k)
        seen["theta"] = out[0]  # FedRep's last call (its body's steps) holds every trained tensor
        return out

    plain.cohort_sgd = record
    names = shared_names(alg)
    x = {k: plain.global_params[k].clone() for k in names}
    cohort = torch.as_tensor(store.clients(ROLE_TRAIN)[[0, 3, 5, 9]])
    alg.run_round(0, cohort, gen())
    plain.run_round(0, cohort, gen())
    theta = seen["theta"]
    flat_x = np.concatenate([x[k].numpy().ravel() for k in names]).astype(np.float64)
    d = flat_x.size
    decoded = [flat_x + topk_row(np.concatenate([theta[k][r].numpy().ravel() for k in names]) - flat_x,
                                 math.ceil(DENSITY * d)) for r in range(len(cohort))]
    size = store.fit.length[cohort].numpy().astype(np.float64)
    w = size / size.sum() if getattr(alg, "average_by_size", True) else np.full(len(cohort), 1 / len(cohort))
    want = sum(wi * di for wi, di in zip(w, decoded))
    got = np.concatenate([alg.global_params[k].numpy().ravel() for k in names])
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    uncompressed = np.concatenate([plain.global_params[k].numpy().ravel() for k in names])
    assert np.abs(got - uncompressed).max() > 1e-4
    private = [k for k in alg.global_params if k not in names]
    assert private  # a part of the net that never travels


def test_fedbabu_takes_one_server_step_a_round(store):
    """With server_lr 0.5 and server momentum 0.9 the body moves once, x + 0.5 (mean - x) (FedAvgM's first step; its
    buffer starts at zero), the head not at all (until the secure-aggregation merge the round stepped twice)."""
    cfg = small_config(algorithm="fedbabu", mlp_hidden=(8,), local_steps=3, batch_size=8, lr=0.1, clients_per_round=4,
                       server_lr=0.5, server_momentum=0.9)
    alg, plain = alg_factory(cfg)(store), alg_factory(cfg)(store)
    seen, sgd = {}, plain.cohort_sgd

    def record(*a, **k):
        out = sgd(*a, **k)
        seen["theta"] = out[0]
        return out

    plain.cohort_sgd = record
    x = {k: v.clone() for k, v in alg.global_params.items()}
    cohort = torch.as_tensor(store.clients(ROLE_TRAIN)[[0, 3, 5, 9]])
    alg.run_round(0, cohort, gen())
    plain.run_round(0, cohort, gen())
    size = store.fit.length[cohort].to(torch.float64)
    w = size / size.sum()
    for k in alg.body:
        mean = torch.einsum("r,r...->...", w, seen["theta"][k].double())
        torch.testing.assert_close(alg.global_params[k].double(), x[k].double() + 0.5 * (mean - x[k].double()),
                                   rtol=1e-5, atol=1e-6)
    for k in alg.head:
        assert torch.equal(alg.global_params[k], x[k])
