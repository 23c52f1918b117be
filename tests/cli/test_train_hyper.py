"""`pflx train` / `pflx predict` with pfedhn, pfedhn-pc and hyperfl: artifacts, communication, new-client
protocols, resume after an interruption, bad input."""

import json

import numpy as np
import pytest
import torch

from pfl_cli import formats
from pfl_cli.cli.app import main as _main
from pflx_testing import cli_args
from pfl_cli.fl.checkpoint import checkpoint_dir


def main(argv):
    """pflx; a train command gets the shared small settings only where its algorithm takes them."""
    argv = [str(a) for a in argv]
    return _main(cli_args(argv) if argv[:1] == ["train"] else argv)

FAST = ["--rounds", "6", "--eval-every", "3", "--local-steps", "5", "--set", "hyper_hidden=16",
        "--set", "mlp_hidden=[16]", "--set", "embed_rounds=2", "--batch-size", "16"]
PER_ALGORITHM = {"pfedhn": ["--clients-per-round", "2"], "pfedhn-pc": ["--clients-per-round", "2"],
                 "hyperfl": ["--clients-per-round", "4", "--local-epochs", "1", "--lr", "0.05"]}


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    root = tmp_path_factory.mktemp("hyper")
    assert main(["partition", "--dataset", "builtin:digits", "--classes-per-client", "2", "--class-shares", "equal",
                 "--num-clients", "12", "--holdout-clients", "3", "--test-fraction", "0.3",
                 "--out", str(root / "part"), "--format", "quiet"]) == 0
    for alg, extra in PER_ALGORITHM.items():
        assert train(root, root / alg, "--algorithm", alg, *extra) == 0
    return root


def train(root, out, *extra):
    return main(["train", "--partition", str(root / "part"), "--out", str(out), "--format", "quiet", *FAST, *extra])


def predict(root, model, out, *extra):
    return main(["predict", "--model", str(root / model), "--partition", str(root / "part"), "--out", str(out),
                 "--format", "quiet", *extra])


@pytest.mark.parametrize("alg", list(PER_ALGORITHM))
def test_metrics_report_the_communication_of_the_real_messages(root, alg):
    from pfl_cli.models import build

    metrics = json.loads((root / alg / "metrics.json").read_text())
    model = torch.load(root / alg / "model.pt", weights_only=True)
    comm = metrics["communication"]
    net = build(model["arch"]["client"])
    features = sum(p.numel() for k, p in net.named_parameters() if k in ("fc1.weight", "fc1.bias"))
    if alg == "hyperfl":  # the whole hypernetwork each way
        floats = sum(v.numel() for v in model["weights"]["hypernetwork"].values())
        client_rounds = 5 * 4 + 9  # the last round takes all 9 train clients
    else:
        floats = sum(p.numel() for p in net.parameters()) if alg == "pfedhn" else features
        client_rounds = 6 * 2
    assert comm["floats_down_per_client_round"] == floats == comm["floats_up_per_client_round"]
    assert comm["client_rounds"] == client_rounds and comm["rounds"] == 6
    assert comm["total_bytes"] == 4 * 2 * floats * client_rounds
    assert comm["bytes_per_round"] == comm["total_bytes"] / 6
    assert metrics["parameters"]["hypernetwork"] == sum(v.numel() for v in model["weights"]["hypernetwork"].values())


@pytest.mark.parametrize("alg", list(PER_ALGORITHM))
def test_predict_runs_each_papers_protocol(root, tmp_path, alg):
    assert predict(root, alg, tmp_path / "new") == 0
    new = json.loads((tmp_path / "new" / "metrics.json").read_text())
    assert new["new_clients"] == 3 == new["num_clients"] and new["optimizer_steps"] > 0
    if alg.startswith("pfedhn"):
        assert new["rounds"] == 2 and "delta-VJP" in new["protocol"]
        assert predict(root, alg, tmp_path / "more", "--embed-rounds", "3") == 0
        more = json.loads((tmp_path / "more" / "metrics.json").read_text())
        assert more["rounds"] == 3 and more["optimizer_steps"] == new["optimizer_steps"] * 3 // 2
    else:
        assert "frozen" in new["protocol"]
    assert predict(root, alg, tmp_path / "train", "--clients", "train") == 0
    known = json.loads((tmp_path / "train" / "metrics.json").read_text())
    assert known["new_clients"] == 0 and known["optimizer_steps"] == 0 and known["rounds"] == 0
    # the training clients' personalized models are the trained ones: the same accuracies as train's clients.csv
    trained = {r.split(",")[0]: r.split(",")[4] for r in (root / alg / "clients.csv").read_text().splitlines()[1:]
               if r.split(",")[1] == "0"}
    predicted = {r.split(",")[0]: r.split(",")[4] for r in (tmp_path / "train" / "clients.csv").read_text()
                 .splitlines()[1:]}
    assert predicted == trained
    # --clients all: trained models for the train clients, the protocol for the new ones, in one run
    assert predict(root, alg, tmp_path / "all", "--clients", "all") == 0
    both = json.loads((tmp_path / "all" / "metrics.json").read_text())
    assert both["num_clients"] == 12 and both["new_clients"] == 3
    rows = {r.split(",")[0]: r.split(",")[4] for r in (tmp_path / "all" / "clients.csv").read_text().splitlines()[1:]}
    assert {k: rows[k] for k in trained} == trained


MIXED_PC = ["--client-sizes", "S,M,L", "--clients-per-round", "3"]   # pfedhn-pc: per-size private heads


@pytest.mark.parametrize("alg, extra", [*PER_ALGORITHM.items(), ("pfedhn-pc", MIXED_PC)],
                         ids=[*PER_ALGORITHM, "pfedhn-pc-sizes"])
def test_an_interrupted_run_resumes_byte_identically(root, tmp_path, monkeypatch, alg, extra):
    """A run stopped right after its round-3 checkpoint (as by a kill) and resumed equals an uninterrupted one."""
    whole, killed = tmp_path / "whole", tmp_path / "killed"
    assert train(root, whole, "--algorithm", alg, *extra, "--set", "checkpoint_every=2") == 0
    real = formats.write_atomic

    def write_then_die(path, data):
        real(path, data)
        raise KeyboardInterrupt  # the process dies after the checkpoint reached the disk

    monkeypatch.setattr(formats, "write_atomic", write_then_die)
    assert train(root, killed, "--algorithm", alg, *extra, "--set", "checkpoint_every=2") != 0
    assert not killed.exists() and torch.load(checkpoint_dir(killed) / "state.pt", weights_only=True)["round"] == 2
    monkeypatch.setattr(formats, "write_atomic", real)
    assert train(root, killed, "--algorithm", alg, *extra, "--set", "checkpoint_every=2",
                 "--resume") == 0
    for name in ("metrics.csv", "metrics.json", "clients.csv", "model.pt", "checkpoint/state.pt"):
        assert (killed / name).read_bytes() == (whole / name).read_bytes(), name


def test_bad_input_is_one_line_exit_2_and_no_artifact(root, tmp_path, capsys):
    capsys.readouterr()
    assert predict(root, "pfedhn", tmp_path / "p", "--embed-rounds", "0") == 2
    err = capsys.readouterr().err
    assert "embed_rounds must be >= 1" in err and "untrained embedding is not a model" in err
    assert len(err.strip().splitlines()) == 1 and not (tmp_path / "p").exists()
    assert train(root, tmp_path / "t", "--algorithm", "hyperfl", "--set", "mlp_hidden=[]") == 2
    err = capsys.readouterr().err
    assert "a feature extractor before the classifier is needed" in err and not (tmp_path / "t").exists()
    assert train(root, tmp_path / "t", "--algorithm", "pfedhn-pc", "--set", "mlp_hidden=[]") == 2
    assert not (tmp_path / "t").exists()


def test_a_partition_with_more_classes_than_the_model_is_refused(root):
    from pfl_cli.artifacts import load_partition
    from pfl_cli.data import load_dataset
    from pfl_cli.errors import InputError
    from pfl_cli.fl import PredictConfig, predict_clients
    from pflx_testing import small_config

    model = torch.load(root / "pfedhn" / "model.pt", weights_only=True)
    cfg = small_config(**json.loads((root / "pfedhn" / "manifest.json").read_text())["config"])
    part, info, _ = load_partition(root / "part")
    ds = load_dataset(info["spec"])
    with pytest.raises(InputError, match="the model was trained on 10, the dataset has 11"):
        predict_clients(model, cfg, ds.x, np.asarray(ds.y), 11, part, PredictConfig(), device="cpu")


@pytest.mark.parametrize("alg", ["pfedhn", "pfedhn-pc"])
def test_mixed_model_sizes_train_and_predict_a_client_of_each_size(root, tmp_path, alg):
    """pFedHN §5.2: one hypernetwork, S/M/L target nets; a client of each size trains and predicts.
    pFedHN-PC: h generates each size's feature extractor; each client's private head has its size's width."""
    from pfl_cli.fl import PredictConfig, predict_clients
    from pflx_testing import small_config
    from pfl_cli.artifacts import load_partition
    from pfl_cli.data import load_dataset

    out = tmp_path / "sizes"
    assert train(root, out, "--algorithm", alg, "--client-sizes", "S,M,L", "--clients-per-round", "3") == 0
    model = torch.load(out / "model.pt", weights_only=True)
    arch = model["arch"]
    assert [arch[f"client_{s}"]["hidden"] for s in "SML"] == [[8], [16], [32]]
    if alg == "pfedhn-pc":
        generated = {k.split("/", 1)[1] for k in _generated_names(arch)}      # e.g. fc1.weight of S/M/L
        for s, width in zip("SML", (8, 16, 32)):
            heads = model["weights"][f"heads_{s}"]
            assert set(heads["values"]) & generated == set()         # the head is private, never generated
            weight = next(v for k, v in heads["values"].items() if k.endswith("weight") and "momentum" not in k)
            assert weight.shape == (12, 10, width)                    # a row per client, its size's head
            trained = heads["has"].nonzero().flatten().numpy()
            assert len(trained) and set(trained % 3) <= {"SML".index(s)}  # only clients of that size own a head
    cfg = small_config(**json.loads((out / "manifest.json").read_text())["config"])
    part, info, _ = load_partition(root / "part")
    ds = load_dataset(info["spec"])
    for clients in ("train", "holdout"):
        run = predict_clients(model, cfg, ds.x, np.asarray(ds.y), ds.num_classes, part, PredictConfig(clients=clients),
                              device="cpu")
        acc = run.evaluation.accuracy(False)
        sizes = np.asarray(["S", "M", "L"])[run.evaluation.clients % 3]
        assert np.isfinite(acc).all() and (clients == "holdout" or set(sizes) == {"S", "M", "L"})
        assert list(run.evaluation.clients) == sorted(run.evaluation.clients)  # reported in partition order
    metrics = json.loads((out / "metrics.json").read_text())
    assert set(metrics["parameters"]) == {"client", "client_S", "client_M", "client_L", "table", "hypernetwork"}
    # each cohort client received its own size: the mean message lies strictly between S and L
    comm = metrics["communication"]
    sizes = [metrics["parameters"][f"client_{s}"] for s in "SML"]
    assert sizes[0] < comm["floats_down_per_client_round"] < sizes[2]
    assert main(["predict", "--model", str(out), "--partition", str(root / "part"), "--out", str(tmp_path / "saved"),
                 "--format", "quiet", "--save-models"]) == 2  # one tensor per parameter cannot hold mixed sizes
    assert not (tmp_path / "saved").exists()


def _generated_names(arch):
    from pfl_cli.models import build

    return build(arch["hypernetwork"]).target_names


def test_client_sizes_bad_input(root, tmp_path, capsys):
    capsys.readouterr()
    assert train(root, tmp_path / "x", "--algorithm", "pfedhn", "--client-sizes", "S,XL") == 2
    assert "client_sizes must be a comma-separated list of S, M, L" in capsys.readouterr().err
    # straight to pflx (train() gives each algorithm only the keys it takes): hyperfl has no client_sizes
    assert _main(["train", "--partition", str(root / "part"), "--out", str(tmp_path / "x"), "--algorithm", "hyperfl",
                  "--client-sizes", "S,M"]) == 2
    assert "unknown flag key 'client_sizes' for algorithm 'hyperfl'" in capsys.readouterr().err
    assert not (tmp_path / "x").exists()
