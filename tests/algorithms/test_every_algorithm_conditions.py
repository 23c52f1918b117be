"""Every registered algorithm runs under federation conditions, or refuses them in one line (issue 47, item 1).

Generated from the registry like tests/algorithms/test_every_algorithm.py (DESIGN.md §7): each algorithm's smoke
run (three rounds on builtin:digits through the real CLI) is trained under dropout (30 % of the selected clients
leave mid-round), stragglers (client speeds drawn from uniform:1:4 steps a second and a 2-second deadline, so a
client with fewer steps than its work needs is late: dropped, or its partial work kept where the algorithm
declares ``partial_work``) and top-k compression with error feedback where it declares ``compressible_upload``.
An algorithm that cannot run them says so in one line on stderr, exit 2, nothing written: what it declares
(``conditions_refused``, no rounds, no compressible upload, --dp's rules) decides, never its name.

Each runnable case: trains (exit 0, finite accuracies, the simulated clock in metrics.csv), resumes byte-identically
after a kill right after its first checkpoint, and serves the partition's new clients through ``pflx predict``.

The default tier runs one algorithm per step (:data:`DEFAULT_TIER`: each rule of late work, and per-client state
across a kill); the whole registry is ``slow``.
"""

from __future__ import annotations

import csv
import json
import math

import pytest

from pflx_testing import backbone_sets, cli_args, dp_sets, smoke_sets

from pfl_cli import formats, registry
from pfl_cli.cli.app import main
from pfl_cli.fl.conditions.settings import refusal

PARTITION = ["--dataset", "builtin:digits", "--classes-per-client", "2", "--num-clients", "8", "--holdout-clients",
             "2", "--test-fraction", "0.3"]
SMOKE = ["--rounds", "3", "--eval-every", "1", "--clients-per-round", "4", "--local-steps", "4", "--seed", "0",
         "--device", "cpu", "--set", "mlp_hidden=[8]"]
DROPOUT = ["--set", "dropout=0.3"]
STRAGGLERS = ["--set", "compute_speed=uniform:1:4", "--set", "round_deadline=2"]
COMPRESSION = ["--set", "compression=topk", "--set", "compression_density=0.1"]
DEFAULT_TIER = {"train": "fednova", "resume": "fedprox", "predict": "fedrep", "refuse": "local"}


def conditions_for(name: str) -> list[str]:
    """The conditions ``name`` runs under: dropout, stragglers and compression, less what it declares it cannot."""
    cls = registry.get(name).algorithm
    args = list(DROPOUT)
    if not cls.dp_required:  # under --dp the clock and the deadline are refused (pfl_cli.fl.conditions.settings)
        args += STRAGGLERS
    if cls.compressible_upload and not cls.dp_required:
        args += COMPRESSION
    return args


def runs(name: str) -> bool:
    return not refusal(registry.get(name).algorithm)


def cases(step: str) -> list:
    names = [n for n in registry.names() if (runs(n) if step != "refuse" else True)]
    return [pytest.param(n, id=n, marks=() if DEFAULT_TIER[step] == n else pytest.mark.slow) for n in names]


@pytest.fixture(scope="module")
def part(tmp_path_factory):
    root = tmp_path_factory.mktemp("conditions")
    assert main(["partition", *PARTITION, "--out", str(root / "part"), "--format", "quiet"]) == 0
    return root / "part"


def train(part, name: str, out, *extra) -> int:
    args = ["train", "--partition", part, "--algorithm", name, "--out", out, "--format", "quiet", *SMOKE,
            *smoke_sets(name), *dp_sets(name), *backbone_sets(name), *conditions_for(name), *extra]
    return main(cli_args(args, name))


_TRAINED: dict = {}


def trained(part, name: str):
    out = part.parent / f"run-{name}"
    if name not in _TRAINED:
        _TRAINED[name] = train(part, name, out)
    assert _TRAINED[name] == 0, f"pflx train --algorithm {name} under {conditions_for(name)} exited {_TRAINED[name]}"
    return out


@pytest.mark.parametrize("name", cases("train"))
def test_trains_under_conditions(part, name):
    out = trained(part, name)
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["conditions"]["settings"]["dropout"] == 0.3
    if registry.get(name).algorithm.dp_required:  # --dp: no accuracy on private clients, no clock
        assert "train" not in metrics and "simulated_seconds" not in metrics["conditions"]
        return
    accuracies = [metrics["train"][k] for k in ("mean_accuracy", "pooled_accuracy")]
    assert all(math.isfinite(a) and 0 <= a <= 1 for a in accuracies), metrics["train"]
    rows = list(csv.DictReader((out / "metrics.csv").open()))
    clock = [float(r["value"]) for r in rows if r["metric"] == "sim_seconds"]
    rounds = [float(r["value"]) for r in rows if r["metric"] == "round_sim_seconds"]
    assert len(clock) == 3 and len(rounds) == 3 and clock == sorted(clock)
    assert clock[-1] == pytest.approx(sum(rounds)) and all(0 < d <= 2.0 for d in rounds), rounds
    c = metrics["conditions"]
    assert c["clients_answered"] + c["clients_left"] + c["clients_late_dropped"] <= c["clients_selected"]
    assert c["clients_left"] > 0, c  # 30 % of the selections left
    if "compression" in c:
        up = metrics["communication"]["bytes_up_per_client_round"]
        # the compressed delta (and FedNova's one float ||a_i||_1 beside it): bytes as sent, not floats x 4
        assert c["compression"]["bytes_up_per_client"] <= up <= c["compression"]["bytes_up_per_client"] + 4
        assert up < c["compression"]["bytes_up_uncompressed"] / 4


@pytest.mark.parametrize("name", cases("resume"))
def test_resumes_byte_identically_under_conditions(part, name, monkeypatch, tmp_path):
    whole = trained(part, name)
    killed = tmp_path / "killed"
    real, rounds = formats.write_atomic, []

    def write_then_die(path, data_):
        real(path, data_)
        if "checkpoint" in str(path):
            import torch

            rounds.append(int(torch.load(path, weights_only=True)["round"]))
            raise KeyboardInterrupt

    monkeypatch.setattr(formats, "write_atomic", write_then_die)
    code = train(part, name, killed)
    monkeypatch.setattr(formats, "write_atomic", real)
    assert code == 130 and rounds == [1] and not killed.exists(), (code, rounds)
    assert train(part, name, killed, "--resume") == 0
    for file in ("model.pt", "metrics.json", "metrics.csv", "clients.csv"):
        if (whole / file).is_file():
            assert (killed / file).read_bytes() == (whole / file).read_bytes(), file


@pytest.mark.parametrize("name", cases("predict"))
def test_predicts_after_training_under_conditions(part, name, cli):
    model = trained(part, name)
    out = part.parent / f"pred-{name}"
    run = cli("predict", "--model", model, "--partition", part, "--clients", "holdout", "--seed", "0", "--out", out,
              "--format", "quiet")
    assert run.code == 0, run.err
    metrics = json.loads((out / "metrics.json").read_text())
    accuracy = metrics.get("mean_accuracy_nolm", metrics.get("mean_accuracy"))
    assert isinstance(accuracy, float) and 0.0 <= accuracy <= 1.0, metrics


@pytest.mark.parametrize("name", cases("refuse"))
def test_what_an_algorithm_cannot_run_is_refused_in_one_line(part, name, cli, tmp_path):
    """Conditions it cannot run (no rounds, a declared reason), and compression where its upload is not a model
    delta: exit 2, one line naming the keys, nothing written."""
    cls = registry.get(name).algorithm
    asks = []
    if refusal(cls):
        asks.append((DROPOUT, "cannot run under federation conditions"))
    if not cls.compressible_upload:
        asks.append((COMPRESSION, "does not upload a model delta" if not refusal(cls) else
                     "cannot run under federation conditions"))
    for extra, words in asks:
        out = tmp_path / "refused"
        run = cli(*cli_args(["train", "--partition", part, "--algorithm", name, "--out", out, *SMOKE,
                             *smoke_sets(name), *dp_sets(name), *backbone_sets(name), *extra], name))
        assert run.code == 2 and words in run.err and len(run.err.strip().splitlines()) == 1, (run.code, run.err)
        assert not out.exists()
