"""HyperFL-LPM (spec B.5) on tiny backbones of both families: frozen backbone, upload, new clients, resume,
the Table 2 baselines through `train`, and the attack's model of its upload."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from pfl_cli.registry import entries
REGISTRY = {n: e.algorithm for n, e in entries().items()}
from pfl_cli.errors import ConfigError
from pflx_testing import replace, small_config
from pfl_cli.fl.store import build_store
from pfl_cli.rng import make_rng
from tests.models.test_models_pretrained import _published

SMALL = dict(algorithm="hyperfl-lpm", backbone="vit-micro", hyper_hidden=8, embed_dim=8, batch_size=32, lr=0.05,
             momentum=0.5, local_epochs=1, clients_per_round=3, val_fraction=0.0)


@pytest.fixture(scope="module")
def store(digits_clients):
    ds, part = digits_clients
    return build_store(ds.x, ds.y, ds.num_classes, part, val_fraction=0.0, rng=make_rng(0, "v"), device="cpu")


def test_defaults_are_the_papers_lpm_setting():
    """HyperFL App. D.1, Training Settings: "batch size 16 is adopted for all datasets"; eta_h = eta_v =
    0.1 for CIFAR-10 with ViT (0.02 EMNIST, 0.01 with ResNet), not the CNN setting's 50 / 0.01 (issue 34, item 4)."""
    import dataclasses

    cfg_class = REGISTRY["hyperfl-lpm"].config
    cfg = cfg_class()
    assert (cfg.batch_size, cfg.lr, cfg.embed_lr) == (16, 0.1, None)  # embed_lr null: eta_v = eta_h
    fields = {f.name: f.metadata for f in dataclasses.fields(cfg_class)}
    for name in ("batch_size", "lr"):
        assert "App. D.1" in fields[name]["source"] and "specs/" not in fields[name]["source"], fields[name]
    assert "0.02" in fields["lr"]["source"] and "0.01" in fields["lr"]["source"]


@pytest.mark.parametrize("backbone", ["vit-micro", "resnet-micro"])
def test_backbone_stays_bit_identical_and_the_upload_is_the_hypernetwork(store, tmp_path, backbone):
    state = _published(backbone, tmp_path / "w.pth")
    alg = REGISTRY["hyperfl-lpm"](small_config(**{**SMALL, "backbone": backbone, "backbone_weights": str(tmp_path / "w.pth")}), store)
    assert alg.names and all(k.startswith("adapters.") for k in alg.names)        # generated: the adapters only
    assert alg.head_names == ["head.weight", "head.bias"]
    assert not any(k.startswith("backbone.") for k, _ in alg.net.named_parameters())  # frozen: buffers
    before = {k: t.clone() for k, t in alg.net.backbone.state_dict().items()}
    assert all(torch.equal(before[k], state[k]) for k in before)                  # loaded from the file
    for t in range(2):
        cohort = torch.tensor([0, 5, 9])
        alg.run_round(t, cohort, torch.Generator().manual_seed(t))
        alg.traffic.close_round(len(cohort))
    after = alg.net.backbone.state_dict()
    assert all(torch.equal(before[k], after[k]) for k in before)                  # bit-identical after training
    keys = {k for k, _ in alg.hnet.named_parameters()}
    assert {k.removeprefix("hypernetwork.") for k in alg.traffic.up} == keys     # phi_i up, nothing else
    s = alg.traffic.summary()
    assert s["floats_up_per_client_round"] == sum(p.numel() for p in alg.hnet.parameters())


def test_hyperfl_lpm_needs_a_backbone_tuned_by_adapters(store):
    with pytest.raises(ConfigError, match="hyperfl-lpm needs a backbone: --set backbone=vit-s16"):
        REGISTRY["hyperfl-lpm"](small_config(**{**SMALL, "backbone": ""}), store)
    with pytest.raises(ConfigError, match="backbone_tune must be adapters; got 'probe'"):
        REGISTRY["hyperfl-lpm"](small_config(**{**SMALL, "backbone_tune": "probe"}), store)


@pytest.mark.slow  # default-tier budget (2026-11-29): minutes-long or a learning run
def test_new_clients_resume_and_predict(digits_clients):
    from pfl_cli.fl.checkpoint import torch_bytes
    from pfl_cli.fl import PredictConfig, predict_clients
    from tests.algorithms.test_algorithms_hyperfl import assert_resume_ends_where_the_run_ends

    ds, part = digits_clients
    cfg = small_config(**SMALL, rounds=3, eval_every=1)
    full = assert_resume_ends_where_the_run_ends(ds, part, cfg)
    assert set(full.model["weights"]) == {"hypernetwork", "private"}  # no backbone in the model: it is the file's
    frozen = torch_bytes(full.model["weights"])
    out = predict_clients(full.model, cfg, ds.x, ds.y, ds.num_classes, part, PredictConfig(local_epochs=2), device="cpu")
    assert torch_bytes(full.model["weights"]) == frozen
    assert out.protocol["new_clients"] == 4 and "frozen" in out.protocol["protocol"]


TABLE2 = [("local", "probe"), ("fedavg", "probe"), ("local", "adapters"), ("fedavg", "adapters"), ("fedavg", "full")]


@pytest.mark.slow  # default-tier budget (2026-11-29): minutes-long or a learning run
def test_table2_baselines_train_end_to_end(tmp_path, cli):
    """Local / FedAvg with a linear probe (+) and adapter fine-tuning (++), FedAvg FPT, HyperFL-LPM: one command each."""
    _published("resnet-micro", tmp_path / "r.pth")
    assert cli("partition", "--dataset", "builtin:digits", "--num-clients", "6", "--dirichlet", "0.5",
               "--holdout-clients", "1", "--out", tmp_path / "p", "--format", "quiet").code == 0
    common = ["--partition", tmp_path / "p", "--rounds", "1", "--eval-every", "1", "--local-epochs", "1",
              "--batch-size", "32", "--lr", "0.05", "--device", "cpu", "--format", "quiet",
              "--set", "backbone=resnet-micro", "--set", f"backbone_weights={tmp_path / 'r.pth'}"]
    counts = {}
    for algorithm, tune in [*TABLE2, ("hyperfl-lpm", "adapters")]:
        out = tmp_path / f"{algorithm}-{tune}"
        run = cli("train", "--algorithm", algorithm, "--set", f"backbone_tune={tune}", "--out", out, *common)
        assert run.code == 0, (algorithm, tune, run.err)
        m = json.loads((out / "metrics.json").read_text())
        counts[algorithm, tune] = (m["parameters"]["client"], m["floats_per_client_round"])
        if algorithm != "local":  # the static count agrees with the ledger of what was sent
            c = m["communication"]
            assert m["floats_per_client_round"] == c["floats_down_per_client_round"] + c["floats_up_per_client_round"]
    probe, adapters, full = counts["fedavg", "probe"][0], counts["fedavg", "adapters"][0], counts["fedavg", "full"][0]
    assert probe == 32 * 10 + 10 and adapters > probe and full > adapters   # what trains grows with the tune
    assert counts["local", "probe"][1] == 0 and counts["fedavg", "probe"][1] == 2 * probe  # local sends nothing
    # FPT uploads the backbone too; HyperFL-LPM uploads its hypernetwork (both ways)
    assert counts["fedavg", "full"][1] == 2 * full
    m = json.loads((tmp_path / "hyperfl-lpm-adapters" / "metrics.json").read_text())
    assert counts["hyperfl-lpm", "adapters"][1] == 2 * m["parameters"]["hypernetwork"]
    bad = cli("train", "--algorithm", "fedavg", "--set", "backbone=resnet-micro", "--set",
              f"backbone_weights={tmp_path / 'missing.pth'}", "--out", tmp_path / "bad", *common[:2], "--format", "quiet")
    assert bad.code == 2 and "backbone_weights: no such file" in bad.err and not (tmp_path / "bad").exists()


def test_attack_models_the_lpm_upload(tmp_path, cli):
    assert cli("partition", "--dataset", "builtin:digits", "--num-clients", "6", "--classes-per-client", "2",
               "--holdout-clients", "1", "--out", tmp_path / "p", "--format", "quiet").code == 0
    assert cli("train", "--partition", tmp_path / "p", "--algorithm", "hyperfl-lpm", "--set", "backbone=vit-micro",
               "--set", "hyper_hidden=8", "--set", "embed_dim=8", "--rounds", "1", "--local-epochs", "1",
               "--batch-size", "32", "--device", "cpu", "--out", tmp_path / "m", "--format", "quiet").code == 0
    run = cli("attack", "--model", tmp_path / "m", "--partition", tmp_path / "p", "--out", tmp_path / "a",
              "--attack", "ig", "--images", "1", "--batch-size", "1", "--iterations", "3", "--format", "json")
    assert run.code == 0, run.err
    m = json.loads((tmp_path / "a" / "metrics.json").read_text())
    assert m["algorithm"] == "hyperfl-lpm"
    assert m["upload"] and all(k.startswith("grad/heads.") or k.startswith("grad/body.") for k in m["upload"])
    assert np.isfinite(m["results"]["ig"]["mean_psnr"])


@pytest.mark.slow
def test_the_cpu_smoke_recipe_runs_partition_train_predict(tmp_path, cli):
    recipe = "recipes/hyperfl/lpm-digits-smoke.yaml"
    assert cli("partition", "--config", recipe, "--out", tmp_path / "p", "--format", "quiet").code == 0
    run = cli("train", "--config", recipe, "--partition", tmp_path / "p", "--out", tmp_path / "t", "--rounds", "2",
              "--eval-every", "2", "--format", "quiet")
    assert run.code == 0, run.err
    run = cli("predict", "--config", recipe, "--model", tmp_path / "t", "--partition", tmp_path / "p",
              "--out", tmp_path / "n", "--format", "json")
    assert run.code == 0, run.err
    assert json.loads((tmp_path / "t" / "metrics.json").read_text())["algorithm"] == "hyperfl-lpm"


@pytest.mark.slow  # default-tier budget (2026-11-29): minutes-long or a learning run
def test_predict_refuses_a_weights_file_changed_after_training(tmp_path, cli):
    _published("resnet-micro", tmp_path / "w.pth")
    assert cli("partition", "--dataset", "builtin:digits", "--num-clients", "6", "--dirichlet", "0.5",
               "--holdout-clients", "1", "--out", tmp_path / "p", "--format", "quiet").code == 0
    assert cli("train", "--partition", tmp_path / "p", "--algorithm", "hyperfl-lpm", "--set", "backbone=resnet-micro",
               "--set", f"backbone_weights={tmp_path / 'w.pth'}", "--set", "hyper_hidden=8", "--set", "embed_dim=8",
               "--rounds", "1", "--local-epochs", "1", "--device", "cpu", "--out", tmp_path / "m",
               "--format", "quiet").code == 0
    _published("resnet-micro", tmp_path / "w.pth", head=False)  # same keys, another file
    run = cli("predict", "--model", tmp_path / "m", "--partition", tmp_path / "p", "--out", tmp_path / "n",
              "--device", "cpu", "--format", "quiet")
    assert run.code == 2 and "changed since" in run.err and "sha256 differs" in run.err and not (tmp_path / "n").exists()
