"""q-FFL's server step beside Flower's own QFedAvg strategy (issue 47): the same inputs give the same new model.

benchmarks/conformance_rules.py compares whole rounds on the ring (docs/performance/conformance.md); this is its
smoke: random w^t, five clients' trained models and losses, q in {0, 0.2, 2}, Flower's ``aggregate_train`` fed one
reply per client (its model and ``train_loss`` = F_k(w^t)) against :func:`qfedavg_messages` and :func:`qfedavg_step`.
"""

import sys
from pathlib import Path

import pytest
import torch

from pfl_cli.algorithms.qffl import qfedavg_messages, qfedavg_step

pytestmark = [pytest.mark.flower, pytest.mark.slow]  # importing flwr alone takes seconds


@pytest.mark.parametrize("q", [0.0, 0.2, 2.0])
def test_pflx_and_flower_take_the_same_qfedavg_step(q):
    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
    from conformance_rules import flower_qfedavg

    g = torch.Generator().manual_seed(3)
    w = {"a.weight": torch.randn(4, 3, generator=g), "a.bias": torch.randn(4, generator=g)}
    theta = {k: v.unsqueeze(0) + 0.1 * torch.randn(5, *v.shape, generator=g) for k, v in w.items()}
    f = torch.rand(5, generator=g) * 2 + 0.05
    lr = 0.05
    delta, h = qfedavg_messages(w, theta, f, q=q, lipschitz=1.0 / lr)
    ours = qfedavg_step(w, delta, h)
    theirs = flower_qfedavg(w, theta, f, q=q, lr=lr)
    for k in w:
        torch.testing.assert_close(ours[k].double(), torch.as_tensor(theirs[k]).double(), rtol=1e-5, atol=1e-6)
        assert (ours[k] - w[k]).abs().max() > 1e-4  # a step the comparison can see
