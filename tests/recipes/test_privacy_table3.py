"""recipes/hyperfl/privacy_table3.py and its recipes: Table 3's IG protocol (HyperFL, spec B.9)."""

import importlib.util
import json
import pickle
from pathlib import Path

import numpy as np
import pytest
import yaml
from pflx_testing import only_taken

from pfl_cli.config import load_config_file, resolve_config

ROOT = Path(__file__).resolve().parents[2] / "recipes" / "hyperfl"
RECIPES = [ROOT / "privacy-table3.yaml", ROOT / "privacy-table3-digits-smoke.yaml"]
METHODS = ["fedavg", "pfedhn", "pfedhn-pc", "ldp-fedavg", "hyperfl"]


def driver():
    spec = importlib.util.spec_from_file_location("privacy_table3", ROOT / "privacy_table3.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("path", RECIPES, ids=lambda p: p.name)
def test_every_methods_config_resolves(path, tmp_path):
    """Each method's merged config is a valid partition / train / attack config (typos and bad values fail)."""
    from pfl_cli.attack.config import AttackConfig
    from pfl_cli import registry
    from pfl_cli.partition import PartitionConfig

    recipe = yaml.safe_load(path.read_text())
    assert list(recipe["methods"]) == METHODS and set(recipe["paper"]) == set(METHODS)
    for name, cfg in driver().method_configs(recipe, "npz:data.npz").items():
        file = tmp_path / f"{name}.yaml"
        file.write_text(yaml.safe_dump(cfg))
        train = registry.resolve_train_config(file_values=load_config_file(file, "train"))
        attack = resolve_config(AttackConfig, file_values=load_config_file(file, "attack"))
        resolve_config(PartitionConfig, file_values=load_config_file(file, "partition"))
        assert train.algorithm == name and attack.attack == "ig" and attack.batch_size == 1
        assert (attack.lr, attack.tv) == (0.1, 1e-6)
        assert (train.dp_epsilon is not None) == (name == "ldp-fedavg")
        assert attack.upload == ("weights" if name == "ldp-fedavg" else "gradient")
    if path.name == "privacy-table3.yaml":  # the paper's counts
        assert (recipe["attack"]["images"], recipe["attack"]["iterations"]) == (50, 10000)


def test_report_exit_code_follows_the_checks_not_t_p2(tmp_path, capsys):
    """T-P2 is printed (HOLDS / DOES NOT HOLD) and never decides the exit code; a missed check exits 1."""
    recipe = yaml.safe_load(RECIPES[1].read_text())
    row = {"mean_ssim": 0.5, "upload_mode": "gradient", "upload_steps": 0}
    measured = {m: {**row, "mean_psnr": p, "median_psnr": p}
                for m, p in zip(METHODS, [30.0, 25.0, 22.0, 5.0, 40.0])}  # HyperFL above FedAvg
    assert driver().report(recipe, measured, tmp_path) == 0
    out = capsys.readouterr().out
    assert "DOES NOT HOLD" in out and "MISS" not in out and "16.16 / 0.6415" in out and "7.85 / 0.3010" in out
    measured["hyperfl"] = {**row, "mean_psnr": 9.0, "median_psnr": 9.0}
    measured["ldp-fedavg"] = {**row, "mean_psnr": 15.0, "median_psnr": 15.0}  # a DP upload rebuilt: broken
    assert driver().report(recipe, measured, tmp_path) == 1
    out = capsys.readouterr().out
    assert ": HOLDS" in out and "check ldp-fedavg: median PSNR <= 12 dB: MISS" in out
    assert json.loads((tmp_path / "table3.json").read_text())["tp2_holds"] is True


def make_cifar10(root, per_batch=40, n_test=60):
    """CIFAR-10's python batches as published (pickled dicts, bytes keys, uint8 rows of 3072), tiny."""
    d = root / "cifar-10-batches-py"
    d.mkdir(parents=True)
    rng = np.random.default_rng(0)

    def batch(n, name, start):
        labels = [(start + j) % 10 for j in range(n)]
        with open(d / name, "wb") as fh:
            pickle.dump({b"batch_label": name.encode(), b"labels": labels, b"filenames": [b"f.png"] * n,
                         b"data": rng.integers(0, 256, (n, 3072), dtype=np.uint8)}, fh, protocol=2)

    for i in range(1, 6):
        batch(per_batch, f"data_batch_{i}", i)
    batch(n_test, "test_batch", 0)
    return d


def test_cifar10_recipe_end_to_end_on_a_fixture(tmp_path, capsys):
    """The paper-scale recipe, scaled down (rounds, widths, images, iterations), on a CIFAR-10 fixture read
    from a local path: every method trains on the HyperFL CNN and is attacked; the table and T-P2 print."""
    recipe = yaml.safe_load(RECIPES[0].read_text())
    recipe["train"].update(rounds=1, eval_every=1, device="cpu")
    recipe["attack"].update(images=2, iterations=2, device="cpu")
    for name, own in recipe["methods"].items():
        small = dict(rounds=1, hyper_hidden=4, local_steps=1, local_epochs=1, clients_per_round=2)
        own["train"].update(only_taken(own["train"]["algorithm"], small))  # each algorithm's own keys only
        if name == "ldp-fedavg":
            own["train"].update(dp_sampling_rate=0.5, local_epochs=None)
    tiny = tmp_path / "tiny.yaml"
    tiny.write_text(yaml.safe_dump(recipe))
    data = make_cifar10(tmp_path)
    out = tmp_path / "t3"
    assert driver().main([str(tiny), "--out", str(out), "--dataset", f"cifar10:{data}"]) == 0  # no checks here
    printed = capsys.readouterr().out
    assert all(f"\n{m} " in "\n" + printed for m in METHODS) and "T-P2 (HyperFL's median PSNR" in printed
    doc = json.loads((out / "table3.json").read_text())
    assert set(doc["measured"]) == set(METHODS) and doc["checks"] == []
    assert doc["measured"]["ldp-fedavg"]["upload_mode"] == "weights"
    for m in METHODS:
        metrics = json.loads((out / f"attack-{m}" / "metrics.json").read_text())
        assert metrics["images"] == 2 and metrics["clients"] == "train"
        assert doc["measured"][m]["median_psnr"] == metrics["results"]["ig"]["median_psnr"]
    assert json.loads((out / "part" / "manifest.json").read_text())["config"]["dataset"] == f"npz:{out / 'data.npz'}"
    x = np.load(out / "data.npz")["x"]
    assert x.shape[1:] == (3, 32, 32) and 0.0 <= x.min() and x.max() <= 1.0
