"""``--upload weights``: the attacked message is what the training round really sends (spec B.9).

A client whose whole data is the attacked batch runs the real round (``run_round``) alone in its
cohort; with one client the server's aggregate is that client's upload, so the change of the
global parameters must equal the ``upload(steps=None)`` the attack matches.
"""

import numpy as np
import pytest
import torch

from pfl_cli.data import load_dataset
from pfl_cli.fl.api import make_algorithm
from pflx_testing import small_config
from pfl_cli.fl.store import build_store
from pfl_cli.partition.base import Partition

SIZES = (1, 2, 30, 30)  # client 0 holds one image, client 1 two; the others make round 0 a real round


@pytest.fixture(scope="module")
def store():
    ds = load_dataset("builtin:digits")
    order = np.random.default_rng(0).permutation(ds.num_samples)[:sum(SIZES)]
    part = Partition(client_id=np.arange(len(SIZES)), role=np.zeros(len(SIZES), np.uint8),
                     train_offsets=np.concatenate([[0], np.cumsum(SIZES)]), train_indices=order,
                     test_offsets=np.zeros(len(SIZES) + 1, np.int64), test_indices=np.zeros(0, np.int64))
    return part, build_store(ds.x, ds.y, ds.num_classes, part, val_fraction=0.0, rng=None, device="cpu")


def global_params(alg):
    if alg.name == "hyperfl":
        return {k: p.detach().clone() for k, p in alg.hnet.named_parameters()}
    return {k: v.detach().clone() for k, v in alg.global_params.items()}


# clip, momentum and weight decay on, so a step the attack's model left out would show
OPTS = dict(lr=0.05, momentum=0.5, client_clip=0.7, lambda_theta=1e-3, batch_size=4, mlp_hidden=(16,), seed=0)


@pytest.mark.parametrize("algorithm, extra", [("hyperfl", dict(local_epochs=3, hyper_hidden=16, embed_dim=8)),
                                              ("fedavg", dict(local_epochs=2)),
                                              ("fedavg", dict(local_steps=3))])
@pytest.mark.parametrize("client", [0, 1])
def test_weights_upload_is_what_the_round_sends(store, algorithm, extra, client):
    part, st = store
    cfg = small_config(algorithm=algorithm, **OPTS, **extra)
    alg = make_algorithm(cfg, st)
    gen = torch.Generator().manual_seed(0)
    alg.run_round(0, torch.arange(len(SIZES)), gen)   # every client trains once: HyperFL's private state exists
    before = global_params(alg)
    idx = torch.as_tensor(part.train_of(client))[None]
    msg, start = alg.upload(st.inputs(idx), st.y[idx], steps=None, clients=torch.tensor([client]))
    for k, v in before.items():
        torch.testing.assert_close(start[k][0], v)    # the dummy's upload starts where the server's model is
    alg.run_round(1, torch.tensor([client]), gen)     # the real round, the client alone in its cohort
    after = global_params(alg)
    assert sorted(msg) == sorted(f"delta/{k}" for k in before)
    for k in before:
        torch.testing.assert_close(msg[f"delta/{k}"][0], after[k] - before[k], rtol=1e-4, atol=1e-6)
        assert float((after[k] - before[k]).abs().max()) > 0  # the round did move every uploaded tensor
    steps = alg.round_upload_steps()
    assert steps == (extra.get("local_epochs") or extra.get("local_steps"))


def test_hyperfl_weights_upload_runs_the_classifier_epoch_first(store):
    """phi_i depends on step 1: the same upload without the classifier epoch (step 2 alone) differs."""
    part, st = store
    alg = make_algorithm(small_config(algorithm="hyperfl", local_epochs=1, hyper_hidden=16, embed_dim=8, **OPTS), st)
    alg.run_round(0, torch.arange(len(SIZES)), torch.Generator().manual_seed(0))
    idx = torch.as_tensor(part.train_of(0))[None]
    x, y, c = st.inputs(idx), st.y[idx], torch.tensor([0])
    whole, _ = alg.upload(x, y, steps=None, clients=c)
    step2, _ = alg.upload(x, y, steps=1, clients=c)
    assert sorted(whole) == sorted(step2)
    assert max(float((whole[k] - step2[k]).detach().abs().max()) for k in whole) > 1e-6


def test_hyperfl_weights_upload_of_one_step_leaks_the_image(store):
    """With one step-2 epoch phi moves by one SGD step after the classifier epoch, so the affine heads' bias
    delta is that step's dL/dtheta (spec D.3 T-P3): the image follows exactly, embedding and classifier unknown."""
    from pfl_cli.attack import analytic

    part, st = store
    alg = make_algorithm(small_config(algorithm="hyperfl", local_epochs=1, hyper_hidden=16, embed_dim=8, **OPTS), st)
    alg.run_round(0, torch.arange(len(SIZES)), torch.Generator().manual_seed(0))
    idx = torch.as_tensor(part.train_of(0))[None]
    msg, start = alg.upload(st.inputs(idx), st.y[idx], steps=None, clients=torch.tensor([0]))
    leak = alg.leaked_gradients({k: v.detach() for k, v in msg.items()}, start)
    w, b = analytic.first_affine(list(leak), {k: v.shape[1:] for k, v in leak.items()})
    rec = analytic.recover_affine_input(leak[w], leak[b])
    assert float((rec - st.inputs(idx)[0]).abs().max()) < 1e-4
