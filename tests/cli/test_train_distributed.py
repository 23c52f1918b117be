"""`pflx train --nproc N` (torch.distributed, gloo on CPU) ends where the 1-process run ends; bad input is refused.

The 2-rank runs split each round's cohort and each evaluation's clients across two gloo
processes; their metrics, selected round and weights must equal the 1-process run's (the
reassembly of per-client results is an exact sum, so on one machine they are identical).
"""

import csv
import json
import os
import signal
import subprocess
import sys
import time

import numpy as np
import pytest
import torch

from pfl_cli.cli.app import main as _main
from pflx_testing import cli_args
from pfl_cli.fl.checkpoint import checkpoint_dir


def main(argv):
    """pflx; a train command gets the shared small settings only where its algorithm takes them."""
    argv = [str(a) for a in argv]
    return _main(cli_args(argv) if argv[:1] == ["train"] else argv)

FAST = ["--rounds", "20", "--eval-every", "10", "--local-steps", "5", "--clients-per-round", "5",
        "--set", "hyper_hidden=16", "--set", "mlp_hidden=[16]", "--format", "quiet"]


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    root = tmp_path_factory.mktemp("dist")
    assert main(["partition", "--dataset", "builtin:digits", "--scheme", "dirichlet", "--alpha", "0.5",
                 "--num-clients", "16", "--holdout-clients", "3", "--test-fraction", "0.25", "--seed", "3",
                 "--out", str(root / "part"), "--format", "quiet"]) == 0
    return root


def _rows(out):
    name = "metrics.csv" if (out / "metrics.csv").is_file() else "nonprivate-metrics.csv"  # --dp
    with open(out / name, newline="") as fh:
        return list(csv.DictReader(fh))


def _same_run(a, b):
    ra, rb = _rows(a), _rows(b)
    assert [r["round"] + r["group"] + r["metric"] for r in ra] == [r["round"] + r["group"] + r["metric"] for r in rb]
    for x, y in zip(ra, rb):
        assert (x["value"] == y["value"]) or abs(float(x["value"]) - float(y["value"])) <= 1e-6 * (
            1 + abs(float(x["value"]))), (x, y)
    wa, wb = (torch.load(d / "model.pt", weights_only=True)["weights"] for d in (a, b))
    flat = lambda w: {f"{k}.{j}": t for k, d in w.items() if isinstance(d, dict) for j, t in d.items()}  # noqa: E731
    fa, fb = flat(wa), flat(wb)
    assert fa.keys() == fb.keys() and fa
    for k in fa:
        torch.testing.assert_close(fa[k], fb[k], rtol=1e-5, atol=1e-6)
    clients = "clients.csv" if (a / "clients.csv").is_file() else "nonprivate-clients.csv"
    assert (a / clients).read_text() == (b / clients).read_text()


def _train(root, out, *extra):
    return main(["train", "--partition", str(root / "part"), "--out", str(out), *FAST, *extra])


# Every algorithm of `train`, each with the options it needs, on a shorter run; the cheap ones in the
# normal tier. The local-DP baselines exist only under --dp; their accuracies are nonprivate files.
DP = ["--dp", "eps=8,clip=1,population=1000,noise=seeded", "--write-nonprivate", "--set", "normalize=false"]  # comparable
LDP = [*DP, "--set", "dp_sampling_rate=0.25"]
SHORT = ["--rounds", "6", "--eval-every", "3", "--local-steps", "3", "--clients-per-round", "4"]
EVERY = {
    "pefll": [], "fedavg": ["--finetune-steps", "3"], "local": ["--local-epochs", "2"], "pfedhn": [],
    "pfedhn-pc": [], "hyperfl": [],
    "hyperfl-lpm": ["--set", "backbone=vit-micro", "--set", "hyper_hidden=8", "--set", "embed_dim=8"],
    "hyperfl-lpm-lora": ["--set", "backbone=vit-micro", "--set", "hyper_hidden=8", "--set", "embed_dim=8"], "fedprox": [], "fedper": [], "fedrep": [], "lg-fedavg": [], "ditto": [],
    "apfl": [], "perfedavg": [], "pfedme": [], "knnper": [], "flowdup": [], "ld-fedavg": [], "fedtta": [],
    "fedbabu": ["--set", "finetune_epochs=1"], "fedrod": [], "fedbn": [], "fedala": ["--set", "ala_max_start_epochs=3"], "feddbe": [],
    "gpfl": [], "pfedla": [], "fedcp": [], "fedas": [], "fedpac": [],
    "fedopt": ["--set", "local_epochs=null"], "fedexp": [],
    "scaffold": [], "feddyn": [],
    "fednova": ["--set", "local_epochs=null"], "centralized": [],
    "fedlc": [], "fedamp": ["--set", "new_client_epochs=1"],
    "fedproto": [], "fednh": [], "fedfomo": [], "apple": [], "moon": [], "fedsam": [], "ifca": [], "qffl": [], "cfl": [], "fedem": [], "afl": [],
    "fedit": [], "ffa-lora": [], "fedsa-lora": [], "flexlora": [], "feddpa": [], "pefll-lora": [], "pfedhn-lora": [], "fedbuff": [], "fedasync": [],
    "ldp-fedavg": LDP, "ppsgd": LDP, "centaur": LDP, "fedavg --dp": DP,
    "pefll --dp": [*DP, "--no-standardize-descriptor", "--embed-dim", "4"],
}
CHEAP = {"fedavg --dp", "knnper"}


def test_every_algorithm_of_train_is_covered():
    from pfl_cli.registry import entries
    REGISTRY = {n: e.algorithm for n, e in entries().items()}

    assert {a.split()[0] for a in EVERY} == set(REGISTRY)


@pytest.mark.parametrize("algorithm", [a if a in CHEAP else pytest.param(a, marks=pytest.mark.slow) for a in EVERY])
def test_every_algorithm_on_two_gloo_ranks_equals_one_process(root, tmp_path, algorithm):
    from pfl_cli.registry import entries
    REGISTRY = {n: e.algorithm for n, e in entries().items()}

    name = algorithm.split()[0]
    if REGISTRY[name].not_distributed:  # refused up front instead (test below)
        assert _train(root, tmp_path / "x", "--algorithm", name, *SHORT, *EVERY[algorithm], "--nproc", "2") == 2
        return
    assert _train(root, tmp_path / "one", "--algorithm", name, *SHORT, *EVERY[algorithm]) == 0
    assert _train(root, tmp_path / "two", "--algorithm", name, *SHORT, *EVERY[algorithm], "--nproc", "2") == 0
    _same_run(tmp_path / "one", tmp_path / "two")
    one, two = (json.loads((tmp_path / d / "metrics.json").read_text()) for d in ("one", "two"))
    assert one.get("best_round") == two.get("best_round") and one.get("rounds") == two.get("rounds")


def test_an_algorithm_that_cannot_be_split_is_refused_up_front(root, tmp_path, capsys, monkeypatch):
    from pfl_cli.registry import entries
    REGISTRY = {n: e.algorithm for n, e in entries().items()}

    monkeypatch.setattr(REGISTRY["fedavg"], "not_distributed", "its server step reads every client's data")
    assert _train(root, tmp_path / "x", "--algorithm", "fedavg", "--nproc", "2") == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and ("--algorithm fedavg runs in one process only: its server step reads every "
                                     "client's data; drop --nproc") in err
    assert not (tmp_path / "x").exists()
    monkeypatch.setenv("WORLD_SIZE", "2")  # under torchrun: refused before joining the process group
    assert _train(root, tmp_path / "x", "--algorithm", "fedavg") == 2
    assert "runs in one process only" in capsys.readouterr().err and not (tmp_path / "x").exists()
    # In one process it runs.
    monkeypatch.delenv("WORLD_SIZE")
    assert _train(root, tmp_path / "x", "--algorithm", "fedavg", *SHORT) == 0


@pytest.mark.parametrize("algorithm", [
    ["pefll"],
    pytest.param(["fedavg", "--finetune-steps", "3"], marks=pytest.mark.slow),
    pytest.param(["local", "--local-epochs", "2"], marks=pytest.mark.slow),
])
def test_two_gloo_ranks_equal_one_process(root, tmp_path, algorithm):
    assert _train(root, tmp_path / "one", "--algorithm", *algorithm) == 0
    assert _train(root, tmp_path / "two", "--algorithm", *algorithm, "--nproc", "2") == 0
    _same_run(tmp_path / "one", tmp_path / "two")
    assert (tmp_path / "two" / "config.yaml").read_text() == (tmp_path / "one" / "config.yaml").read_text()


@pytest.mark.slow
def test_a_killed_run_resumes_with_another_number_of_processes(root, tmp_path):
    args = ["train", "--partition", str(root / "part"), "--rounds", "60", "--eval-every", "10", "--local-steps", "25",
            "--clients-per-round", "4", "--set", "hyper_hidden=16", "--set", "mlp_hidden=[16]", "--format", "quiet"]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, "-m", "pfl_cli", *args]
    killed = tmp_path / "killed"
    proc = subprocess.Popen([*cmd, "--out", str(killed)], env=env)
    ck = checkpoint_dir(killed) / "state.pt"
    deadline = time.monotonic() + 120
    try:
        while not (ck.is_file() and torch.load(ck, weights_only=True)["round"] >= 20):
            assert proc.poll() is None and time.monotonic() < deadline
            time.sleep(0.02)
        proc.send_signal(signal.SIGKILL)
    finally:
        proc.kill()
        proc.wait()
    assert main([*args, "--out", str(killed), "--resume", "--nproc", "2"]) == 0
    assert main([*args, "--out", str(tmp_path / "whole")]) == 0
    _same_run(killed, tmp_path / "whole")


def test_more_processes_than_the_cohort_are_refused(root, tmp_path, capsys):
    assert _train(root, tmp_path / "x", "--clients-per-round", "2", "--nproc", "3") == 2
    err = capsys.readouterr().err
    assert "3 processes for a cohort of 2 clients would leave ranks idle" in err and err.count("\n") == 1
    assert not (tmp_path / "x").exists()


def test_nccl_without_gpus_is_refused(root, tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)  # this machine, seen as GPU-less
    assert _train(root, tmp_path / "x", "--device", "cuda", "--nproc", "2") == 2
    assert "no CUDA device is available" in capsys.readouterr().err


def test_nproc_inside_torchrun_is_refused(root, tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("WORLD_SIZE", "2")
    assert _train(root, tmp_path / "x", "--nproc", "2") == 2
    assert "already runs under torchrun" in capsys.readouterr().err


RANK_SCRIPT = """
import json, sys
from pathlib import Path
import torch
from pfl_cli.cli.common import load_partition_dataset
from pfl_cli.fl import distributed
from pfl_cli.fl.api import train_federated
from pfl_cli.registry import train_config

device = distributed.start(torch.device("cpu"))
part, _, _, ds = load_partition_dataset(Path(sys.argv[1]))
cfg = train_config(algorithm="fedavg", rounds=2, eval_every=1, local_steps=2, clients_per_round=4, mlp_hidden=[16])
run = train_federated(ds.x, ds.y, ds.num_classes, part, cfg, device=device)
rank = distributed.world()[0]
(Path(sys.argv[2]) / f"rank{rank}.json").write_text(json.dumps({
    "samples": int(run.store.x.shape[0]), "bytes": run.store.x.numel() * run.store.x.element_size(),
    "held": [int(i) for i in run.store.held.nonzero()[0]], "total": int(ds.x.shape[0])}))
distributed.stop(finished=True)
"""


@pytest.mark.slow  # default-tier budget (2026-11-29): minutes-long or a learning run
def test_each_rank_holds_only_the_data_of_its_own_clients(root, tmp_path):
    """Two real gloo ranks (torchrun): each loads only its clients' samples, together every client once."""
    from pfl_cli.artifacts import load_partition

    script = tmp_path / "rank.py"
    script.write_text(RANK_SCRIPT)
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
                    str(script), str(root / "part"), str(tmp_path)], env=env, check=True, timeout=300)
    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1)]
    part, _, _ = load_partition(root / "part")
    assert sorted(ranks[0]["held"] + ranks[1]["held"]) == list(range(part.num_clients))   # every client once
    assert ranks[0]["held"] == list(range(0, part.num_clients, 2))                         # client i on rank i mod 2
    for r in ranks:
        clients = r["held"]
        own = np.unique(np.concatenate([np.asarray(part.train_indices)[np.isin(part.train_owner(), clients)],
                                        np.asarray(part.test_indices)[np.isin(part.test_owner(), clients)]]))
        assert r["samples"] == len(own) < 0.75 * r["total"]                                  # memory falls with N


def test_secagg_with_nproc_is_refused_up_front(root, tmp_path, capsys):
    """--secagg's simulated secure sum runs in one process: refused in one line before anything is launched."""
    assert _train(root, tmp_path / "x", "--algorithm", "fedavg", "--secagg", "--nproc", "2") == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--algorithm fedavg runs in one process only: --secagg sums the cohort's rows" in err
    assert not (tmp_path / "x").exists()
