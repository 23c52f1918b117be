"""Issue 23: on the ring, unmasked, PeFLL's new clients and pFedHN's training clients beat FedAvg by >= 15 points.

The ring (``specs/pefll.md`` §7.2 L2/L3) is the task built to need personalization: one global model is
capped near the 10-way Bayes accuracy of 47%, a model that knows a client's 2 classes reaches about 89%.
Without label masking a personalized model must itself suppress the 8 classes its client never has.
The configurations are the demo's recipes (recipes/quickstart/ring-{pefll,pfedhn}.yaml), read from the
files, so the demo's table and these tests measure the same thing; FedAvg is the demo's (client lr
0.005, server step 1, 150 rounds, the recipe's other settings).

Before the fix (lambda_theta = 0, the [x, y] MLP descriptor) PeFLL's new clients reached 32% and its
training clients 34% (test loss ~8, local loss 0.003), pFedHN's training clients 48%; FedAvg ~31%.
"""

import dataclasses
import pathlib

import pytest
import yaml

from pfl_cli.data import load_dataset
from pfl_cli.fl import PredictConfig, TrainConfig, predict_clients, train_federated
from pfl_cli.partition import PartitionConfig, partition_labels, resolve_scheme
from pfl_cli.rng import make_rng

pytestmark = pytest.mark.slow
RECIPES = pathlib.Path(__file__).resolve().parents[2] / "recipes" / "quickstart"
MARGIN = 0.15  # the done-when margin over FedAvg, unmasked


def _recipe(name):
    doc = yaml.safe_load((RECIPES / f"ring-{name}.yaml").read_text())
    part = {k.replace("-", "_"): v for k, v in doc["partition"].items() if k != "dataset"}
    return doc["partition"]["dataset"], part, TrainConfig(**doc["train"])


def _ring(seed):
    spec, options, _ = _recipe("pefll")
    ds = load_dataset(spec)
    cfg = PartitionConfig(**{**options, "dataset": spec, "seed": seed})
    cfg = dataclasses.replace(cfg, scheme=resolve_scheme(cfg))
    part = partition_labels(ds.y, cfg, num_classes=ds.num_classes, rng=make_rng(seed, "partition"), pool=ds.pool)
    return ds, part


def _run(ds, part, cfg):
    """(train-client accuracy, new-client accuracy), both unmasked, of the validation-selected model."""
    run = train_federated(ds.x, ds.y, ds.num_classes, part, cfg, device="cpu")
    train = run.outcome.best.summaries()["train"]["mean_accuracy"]
    out = predict_clients(run.model, cfg, ds.x, ds.y, ds.num_classes, part, PredictConfig(label_mask=False),
                          device="cpu")
    return train, out.evaluation.summary()["mean_accuracy"]


def _fedavg(ds, part, seed):
    _, _, base = _recipe("pefll")
    return _run(ds, part, dataclasses.replace(base, algorithm="fedavg", lr=0.005, server_lr=1.0, rounds=150,
                                              seed=seed))


@pytest.mark.parametrize("seed", [0, 1])
def test_ring_pefll_new_clients_beat_fedavg_without_label_masking(seed):
    ds, part = _ring(seed)
    _, _, cfg = _recipe("pefll")
    assert not cfg.label_mask
    pefll_train, pefll_new = _run(ds, part, dataclasses.replace(cfg, seed=seed))
    fedavg_train, fedavg_new = _fedavg(ds, part, seed)
    print(seed, {"pefll": (pefll_train, pefll_new), "fedavg": (fedavg_train, fedavg_new)})
    assert pefll_new >= fedavg_new + MARGIN, (pefll_new, fedavg_new)
    assert pefll_new >= 0.60, pefll_new  # far above the one-model cap of ~47%


@pytest.mark.parametrize("seed", [0, 1])
def test_ring_pfedhn_training_clients_beat_fedavg_without_label_masking(seed):
    ds, part = _ring(seed)
    _, _, cfg = _recipe("pfedhn")
    assert cfg.algorithm == "pfedhn" and not cfg.label_mask
    run = train_federated(ds.x, ds.y, ds.num_classes, part, dataclasses.replace(cfg, seed=seed), device="cpu")
    pfedhn_train = run.outcome.best.summaries()["train"]["mean_accuracy"]
    fedavg_train, _ = _fedavg(ds, part, seed)
    print(seed, {"pfedhn": pfedhn_train, "fedavg": fedavg_train})
    assert pfedhn_train >= fedavg_train + MARGIN, (pfedhn_train, fedavg_train)
