"""`pflx attack` end to end: partition -> train -> attack, artifact consistency, bad input."""

import csv
import json

import numpy as np
import pytest
import torch

from pfl_cli.cli.app import main as _main
from pflx_testing import cli_args


def main(argv):
    """pflx; a train command gets the shared small settings only where its algorithm takes them."""
    argv = [str(a) for a in argv]
    return _main(cli_args(argv) if argv[:1] == ["train"] else argv)

PART = ["--dataset", "builtin:digits", "--classes-per-client", "2", "--class-shares", "equal", "--num-clients", "20",
        "--test-fraction", "0.3", "--holdout-clients", "4", "--format", "quiet"]
FAST = ["--rounds", "6", "--eval-every", "6", "--local-steps", "3", "--set", "mlp_hidden=[16]", "--format", "quiet"]


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    root = tmp_path_factory.mktemp("attack")
    assert main(["partition", *PART, "--out", str(root / "part")]) == 0
    for alg in ("fedavg", "local", "fedprox"):
        extra = ["--local-epochs", "1"] if alg == "local" else []
        assert main(["train", "--partition", str(root / "part"), "--algorithm", alg, "--out", str(root / alg),
                     *FAST, *extra]) == 0
    return root


def attack(root, out, *extra, model="fedavg", fmt="json"):
    return main(["attack", "--model", str(root / model), "--partition", str(root / "part"), "--out", str(out),
                 "--format", fmt, *extra])


def test_attack_all_writes_consistent_artifact(root, tmp_path, capsys):
    out = tmp_path / "att"
    assert attack(root, out, "--attack", "all", "--images", "4", "--iterations", "60", "--infer-labels") == 0
    result = json.loads(capsys.readouterr().out)
    m = json.loads((out / "metrics.json").read_text())
    assert {k: result[k] for k in m} == m
    assert m["algorithm"] == "fedavg" and m["attacks"] == ["dlg", "ig", "rog", "analytic"]
    assert m["labels"] == "inferred" and m["label_accuracy"] == 1.0
    assert m["upload"] == ["grad/fc1.weight", "grad/fc1.bias", "grad/fc2.weight", "grad/fc2.bias"]
    with open(out / "images.csv", newline="") as fh:
        rows = list(csv.DictReader(fh))
    assert len(rows) == 4 * 4
    for a, r in m["results"].items():
        psnr = [float(row["psnr"]) for row in rows if row["attack"] == a]
        ssim = [float(row["ssim"]) for row in rows if row["attack"] == a]
        assert r["mean_psnr"] == pytest.approx(np.mean(psnr)) and r["median_psnr"] == pytest.approx(np.median(psnr))
        assert r["mean_ssim"] == pytest.approx(np.mean(ssim))
    assert m["results"]["analytic"]["median_psnr"] > 80      # exact leak
    assert (out / "reconstructions.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    # the same command again: nothing to do
    assert attack(root, out, "--attack", "all", "--images", "4", "--iterations", "60", "--infer-labels") == 0
    assert json.loads(capsys.readouterr().out)["up_to_date"] is True


def test_batches_of_images_from_one_client(root, tmp_path, capsys):
    out = tmp_path / "att"
    assert attack(root, out, "--attack", "dlg", "--images", "4", "--batch-size", "2", "--iterations", "20",
                  "--local-steps", "2", "--clients", "train") == 0
    with open(out / "images.csv", newline="") as fh:
        rows = list(csv.DictReader(fh))
    assert [r["client_id"] for r in rows][0::2] == [r["client_id"] for r in rows][1::2]  # a batch is one client's
    assert len({r["sample"] for r in rows}) == 4
    assert json.loads(capsys.readouterr().out)["upload"][0] == "delta/fc1.weight"


@pytest.mark.parametrize("extra, model, message", [
    ((), "local", "algorithm 'local' is not attacked"),
    # FedProx inherits FedAvg's upload code but its clients send proximal steps' deltas: refused, not mis-modelled.
    ((), "fedprox", "algorithm 'fedprox' is not attacked: pflx attack models the uploads of ditto, fedavg, hyperfl, hyperfl-lpm, "
                    "knnper, ldp-fedavg, pefll, pfedhn, pfedhn-pc."),
    (("--images", "0"), "fedavg", "images must be an integer >= 1"),
    (("--images", "100000"), "fedavg", "the 4 holdout clients hold only"),
    (("--images", "3", "--batch-size", "2"), "fedavg", "images must be a multiple of batch_size"),
    (("--batch-size", "2", "--images", "4", "--infer-labels"), "fedavg", "iDLG rule needs batch_size 1"),
    (("--attack", "nope"), "fedavg", "attack must be one of dlg, ig, rog, analytic, all"),
    (("--attack", "analytic", "--local-steps", "3"), "fedavg", "attack analytic: the closed form is exact"),
])
def test_bad_input_is_one_line_exit_2_no_artifact(root, tmp_path, capsys, extra, model, message):
    out = tmp_path / "att"
    assert attack(root, out, *extra, model=model) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1
    assert not out.exists()


def test_colour_images_on_lenet(tmp_path, capsys):
    """CIFAR-shaped uint8 images: LeNet uploads, an image grid; no analytic leak through a first conv layer."""
    rng = np.random.default_rng(0)
    y = np.repeat(np.arange(10), 24)
    x = (rng.integers(0, 96, size=(240, 3, 32, 32)) + 16 * y[:, None, None, None]).astype(np.uint8)
    np.savez(tmp_path / "img.npz", x=x, y=y)
    part, model = tmp_path / "part", tmp_path / "fedavg"
    assert main(["partition", "--dataset", f"npz:{tmp_path / 'img.npz'}", "--classes-per-client", "2",
                 "--class-shares", "equal", "--num-clients", "10", "--holdout-clients", "2", "--test-fraction", "0.25",
                 "--out", str(part), "--format", "quiet"]) == 0
    assert main(["train", "--partition", str(part), "--algorithm", "fedavg", "--rounds", "2", "--eval-every", "2",
                 "--local-steps", "2", "--batch-size", "8", "--out", str(model), "--format", "quiet"]) == 0
    from pfl_cli.attack.lpips import expected_shapes

    g = torch.Generator().manual_seed(0)
    torch.save({k: 0.05 * torch.rand(s, generator=g) for k, s in expected_shapes().items()}, tmp_path / "lpips.pt")
    common = ["attack", "--model", str(model), "--partition", str(part), "--images", "2", "--format", "json"]
    assert main([*common, "--attack", "all", "--iterations", "10", "--lpips-weights", str(tmp_path / "lpips.pt"),
                 "--out", str(tmp_path / "att")]) == 0
    m = json.loads(capsys.readouterr().out)
    with open(tmp_path / "att" / "images.csv", newline="") as fh:
        lp = [float(r["lpips"]) for r in csv.DictReader(fh) if r["attack"] == "ig"]
    assert m["results"]["ig"]["mean_lpips"] == pytest.approx(np.mean(lp)) and all(v > 0 for v in lp)
    assert m["attacks"] == ["dlg", "ig", "rog"] and m["upload"][0] == "grad/conv1.weight"
    assert all(-1 <= r["mean_ssim"] <= 1 and r["mean_psnr"] > 0 for r in m["results"].values())
    assert (tmp_path / "att" / "reconstructions.png").stat().st_size > 1000
    assert main([*common, "--attack", "analytic", "--out", str(tmp_path / "bad")]) == 2
    assert "needs a first fully connected layer with bias" in capsys.readouterr().err
    assert not (tmp_path / "bad").exists()


def test_lpips_weights_that_are_not_a_state_dict_or_small_images(root, tmp_path, capsys):
    torch.save([1, 2], tmp_path / "list.pt")
    assert attack(root, tmp_path / "a", "--lpips-weights", str(tmp_path / "list.pt")) == 2
    err = capsys.readouterr().err
    assert "expected a state dict" in err and err.count("\n") == 1 and not (tmp_path / "a").exists()
    from pfl_cli.attack.lpips import expected_shapes

    torch.save({k: torch.zeros(s) for k, s in expected_shapes().items()}, tmp_path / "ok.pt")
    assert attack(root, tmp_path / "b", "--lpips-weights", str(tmp_path / "ok.pt")) == 2  # digits are 8x8
    assert "at least 32x32" in capsys.readouterr().err and not (tmp_path / "b").exists()


def test_vector_data_gets_feature_errors(tmp_path, capsys):
    """Ring features (64 values, some negative) are a vector: no SSIM, no rog, a feature-error chart."""
    part, model = tmp_path / "part", tmp_path / "fedavg"
    assert main(["partition", "--dataset", "ring:?train_per_class=20&test_per_class=10", "--classes-per-client", "2",
                 "--num-clients", "10", "--holdout-clients", "2", "--out", str(part), "--format", "quiet"]) == 0
    assert main(["train", "--partition", str(part), "--algorithm", "fedavg", "--rounds", "2", "--eval-every", "2",
                 "--local-steps", "2", "--out", str(model), "--format", "quiet"]) == 0
    assert main(["attack", "--model", str(model), "--partition", str(part), "--images", "2", "--attack", "all",
                 "--iterations", "50", "--out", str(tmp_path / "att"), "--format", "json"]) == 0
    m = json.loads(capsys.readouterr().out)
    assert m["attacks"] == ["dlg", "ig", "analytic"]
    assert all(r["mean_ssim"] is None and r["mean_psnr"] > 0 for r in m["results"].values())
    assert m["results"]["analytic"]["median_psnr"] > 80
    assert (tmp_path / "att" / "reconstructions.png").stat().st_size > 1000


def test_targets_the_model_trained_on_are_refused_on_another_partition(root, tmp_path, capsys):
    # Another partition of the same digits: its holdout clients' samples include samples the model trained
    # on, so they are not the unseen clients they claim to be (issue 34, item 1). On the model's own
    # partition, --clients train attacks the uploads of the clients it trained on, by design.
    assert main(["partition", *PART[:-4], "--holdout-clients", "10", "--seed", "3", "--format", "quiet",
                 "--out", tmp_path / "other"]) == 0
    assert main(["attack", "--model", root / "fedavg", "--partition", tmp_path / "other", "--clients", "holdout",
                 "--out", tmp_path / "x", "--images", "2", "--iterations", "2", "--format", "quiet"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "the model trained on" in err and not (tmp_path / "x").exists()


def test_model_help_names_exactly_the_attacked_algorithms():
    import re
    import typing

    from pfl_cli.registry import entries
    REGISTRY = {n: e.algorithm for n, e in entries().items()}
    from pfl_cli.cli.attack import attack_command

    help_text = typing.get_type_hints(attack_command, include_extras=True)["model"].__metadata__[0].help
    named = set(re.findall(r"[a-z]+(?:-[a-z]+)*", help_text.split(":", 1)[1].split("(", 1)[0])) - {"or"}
    from pfl_cli.attack.protocol import attackable

    assert named == {name for name, cls in REGISTRY.items() if attackable(cls)}
