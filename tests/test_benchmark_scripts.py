"""Benchmark scripts run end to end: the GPU benchmark as a CPU smoke run, the start-up benchmark."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.slow
def test_the_pefll_paper_configuration_benchmark_runs_on_cpu(tmp_path):
    proc = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "pefll_paper_run.py"), "--device", "cpu", "--rounds", "1",
         "--eval-every", "1", "--images", "5000", "--out", str(tmp_path)],
        env={**os.environ, "OMP_NUM_THREADS": "1"}, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr
    assert "1 rounds, evaluation every 1, 5,000 + 1,000 synthetic 3x32x32 images, on CPU" in proc.stdout
    assert "target n/a: only a full 5000-round run on CUDA" in proc.stdout  # no verdict from a short run
    assert (tmp_path / "data" / "cifar-10-batches-py" / "data_batch_5").is_file()
    assert (tmp_path / "train" / "model.pt").is_file() and (tmp_path / "part" / "manifest.json").is_file()


PEERS = [sys.executable, str(ROOT / "benchmarks" / "peers.py")]
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}


def test_the_peer_benchmark_refuses_an_unknown_workload():
    proc = subprocess.run([*PEERS, "--workloads", "fedavg-mlp,fedsgd"], env=ENV, capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 2
    assert proc.stderr.strip() == "peers.py: --workloads must be among fedavg-mlp, fedavg-cnn, fedprox-mlp; got fedsgd"


def test_the_peer_benchmark_skips_with_a_notice_or_runs_without_installing_anything():
    import importlib.util

    proc = subprocess.run([*PEERS, "--workloads", "fedavg-mlp", "--clients", "2", "--samples", "64", "--rounds", "1",
                           "--repeats", "1"], env=ENV, capture_output=True, text=True, timeout=600)
    installed = {"pfl-research": ("pfl",), "Flower": ("flwr", "ray")}
    peers = [p for p, modules in installed.items() if all(importlib.util.find_spec(m) for m in modules)]
    if not peers:
        assert proc.returncode == 0, proc.stderr
        assert proc.stdout.startswith("peers.py: skipped: no peer installed (the `bench` extra: pfl-research, "
                                      "flwr[simulation])")
    for peer in peers:
        assert f"fedavg-mlp vs {peer}: pflx speed-up" in proc.stdout, proc.stderr


def _peers_module():
    """benchmarks/peers.py as a module (the benchmarks folder is not a package on the path)."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        import peers
    finally:
        sys.path.pop(0)
    return peers


def test_the_pflx_side_of_the_peer_benchmark_times_rounds_and_learns(tmp_path):
    """The child that times pflx: one warm-up round, then per-round wall and CPU time, start-up, accuracy."""
    peers = _peers_module()
    data = tmp_path / "data.npz"
    peers._make_data(data, 4, 64)
    proc = subprocess.run([*PEERS, "--child", "pflx", "--workload", "fedavg-mlp", "--data", str(data), "--rounds", "2",
                           "--batch", "16", "--spawned", "0"], env=ENV, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr
    result = __import__("json").loads(proc.stdout.strip().splitlines()[-1])
    assert result["wall_per_round"] > 0 and result["cpu_per_round"] > 0 and result["ru_maxrss_mb"] > 50
    assert result["accuracy"] > 0.5  # 3 rounds of 4 steps on class-mean images: far above chance (0.1)


def test_the_peers_are_handed_the_bytes_and_batches_pflx_trains_on(tmp_path):
    """Item 7 of issue 34: the memory verdict compares like with like only if every framework holds the
    same uint8 pool and standardizes each batch as pflx does (per-channel train-pool statistics)."""
    import numpy as np
    import torch

    from pfl_cli.fl.store import normalization_stats

    peers = _peers_module()
    data = tmp_path / "data.npz"
    peers._make_data(data, 3, 40)
    x, y, clients = peers._load(str(data))
    assert x.dtype == np.uint8 and clients == 3
    stats = peers._pool_stats(x, chunk=7)  # chunks that do not divide the pool
    mean, std = normalization_stats(x, np.arange(len(x)))
    np.testing.assert_allclose(stats[0].ravel(), mean.ravel(), rtol=1e-6)
    np.testing.assert_allclose(stats[1].ravel(), std.ravel(), rtol=1e-6)
    batch = peers._standardize(x[:5], stats)
    reference = (torch.as_tensor(x[:5], dtype=torch.float64) - torch.as_tensor(mean, dtype=torch.float64).reshape(1, -1, 1, 1)) \
        / torch.as_tensor(std, dtype=torch.float64).reshape(1, -1, 1, 1)
    assert batch.dtype == torch.float32
    torch.testing.assert_close(batch.double(), reference, rtol=1e-5, atol=1e-5)
    assert peers._lr("fedavg-cnn") == 0.1 and peers._lr("fedprox-mlp") == peers._lr("fedavg-mlp") == 0.005


@pytest.mark.slow
def test_the_hyperfl_lpm_measurement_runs_on_cpu():
    proc = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "hyperfl_lpm_round.py"), "--device", "cpu", "--rounds", "1",
         "--backbone", "vit-micro", "--images", "2000", "--local-epochs", "1"],
        env={**os.environ, "OMP_NUM_THREADS": "1"}, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr
    assert "backbone vit-micro (random weights), 1 rounds of 20 clients x 1 local epochs" in proc.stdout
    assert "seconds per round" in proc.stdout and "n/a (CPU)" in proc.stdout


@pytest.mark.slow
def test_startup_benchmark_prints_every_figure_beside_its_target():
    """Timing verdicts depend on the machine; the script must run and report all four figures."""
    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "run.py"), "startup"],
                          env={**os.environ, "PYTHONPATH": str(ROOT)}, capture_output=True, text=True, timeout=600)
    assert proc.returncode in (0, 1), proc.stderr
    for label, target in (("pflx --help", "<= 3x numpy"), ("pflx show PART", "<= 3x numpy"),
                          ("privacy-account query (RDP)", "<= 1.3x dp_accounting"),
                          ("predict, 10 digits clients (pefll)", "< 3 s")):
        line = next(ln for ln in proc.stdout.splitlines() if ln.strip().startswith(label))
        assert f"target {target}" in line and (line.rstrip().endswith(" ok") or line.rstrip().endswith("MISSED"))
    assert ("startup.py: ok" in proc.stdout) == (proc.returncode == 0)


@pytest.mark.slow
def test_the_tune_benchmark_prints_its_ratio_beside_the_target():
    """A smoke size (4 rounds a trial): the figures and the verdict line are there whatever the ratio."""
    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "tune_bench.py"), "--rounds", "4"],
                          cwd=ROOT / "benchmarks", capture_output=True, text=True, timeout=900)
    assert proc.returncode in (0, 1), proc.stderr
    assert "grid: best validation accuracy" in proc.stdout
    assert "target <= 0.40" in proc.stdout or "pruned TPE reaches the grid's best" in proc.stdout


CONFORMANCE = [sys.executable, str(ROOT / "benchmarks" / "conformance.py")]
NO_PEER_ENV = {k: v for k, v in ENV.items() if k not in ("PFLLIB_DIR", "PFLLIB_PYTHON")}


def test_the_conformance_benchmark_refuses_an_unknown_algorithm_and_a_single_seed():
    proc = subprocess.run([*CONFORMANCE, "--algorithms", "fedavg,fednh"], env=NO_PEER_ENV, capture_output=True,
                          text=True, timeout=120)  # PFLlib has no FedNH
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr.strip().startswith("conformance.py: --algorithms must be among fedavg, fedprox, ditto,")
    assert proc.stderr.strip().endswith("; got fednh")
    proc = subprocess.run([*CONFORMANCE, "--seeds", "0"], env=NO_PEER_ENV, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2
    assert proc.stderr.strip() == ("conformance.py: --seeds must list three or more distinct integers (the paired "
                                   "verdict's 95 % interval needs them); got '0'")


def test_the_conformance_benchmark_skips_with_a_notice_without_pfllib_or_its_modules(tmp_path):
    proc = subprocess.run([*CONFORMANCE, "--pfllib", str(tmp_path), "--rounds", "2"], env=NO_PEER_ENV,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == (f"conformance.py: skipped: {tmp_path} is not a PFLlib checkout (no "
                                   "system/flcore/servers/serveravg.py); see docs/performance/conformance.md")
    servers = tmp_path / "system" / "flcore" / "servers"
    servers.mkdir(parents=True)
    (servers / "serveravg.py").write_text("")
    proc = subprocess.run([*CONFORMANCE, "--pfllib", str(tmp_path), "--python", "/bin/false", "--rounds", "2"],
                          env=NO_PEER_ENV, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == ("conformance.py: skipped: /bin/false lacks torch, numpy, sklearn, h5py, "
                                   "matplotlib, cvxpy, which PFLlib imports; see docs/performance/conformance.md "
                                   "for its virtual environment")  # cvxpy: FedPAC's server module imports it
    proc = subprocess.run([*CONFORMANCE, "--pfllib", str(tmp_path), "--python", "/bin/false", "--rounds", "2",
                           "--algorithms", "fedavg,ditto"], env=NO_PEER_ENV, capture_output=True, text=True, timeout=120)
    assert "lacks torch, numpy, sklearn, h5py, matplotlib, which PFLlib imports" in proc.stdout  # no cvxpy asked


@pytest.mark.slow
def test_the_conformance_benchmark_prints_its_table_at_two_rounds(tmp_path):
    """With a PFLlib checkout (PFLLIB_DIR or .venv-bench/PFLlib) the table's format; without one, the notice."""
    proc = subprocess.run([*CONFORMANCE, "--algorithms", "fedavg,fedper", "--rounds", "2", "--seeds", "0,1,2",
                           "--participation", "1", "--json", str(tmp_path / "rows.json")], env=ENV,
                          capture_output=True, text=True, timeout=1200)
    pfllib = os.environ.get("PFLLIB_DIR") or str(ROOT / ".venv-bench" / "PFLlib")
    if not (Path(pfllib) / "system" / "flcore" / "servers" / "serveravg.py").is_file():
        assert proc.returncode == 0 and proc.stdout.startswith("conformance.py: skipped: "), proc.stderr
        return
    if "lacks" in proc.stdout:  # a checkout, but no Python with PFLlib's imports
        assert proc.returncode == 0 and proc.stdout.startswith("conformance.py: skipped: "), proc.stderr
        return
    assert proc.returncode in (0, 1), proc.stderr  # two rounds decide nothing; the format is what is tested
    lines = proc.stdout.splitlines()
    assert "pathological 2 classes a client, 20 clients" in lines[0] and "2 rounds" in lines[0]
    assert lines[1].split()[:7] == ["algorithm", "cohort", "pflx", "%", "PFLlib", "%", "diff"]
    rows = __import__("json").loads((tmp_path / "rows.json").read_text())["rows"]
    assert [r["algorithm"] for r in rows] == ["fedavg", "fedper"]
    for row, line in zip(rows, lines[2:4]):
        assert line.split()[0] == row["algorithm"] and row["verdict"] in line.split()
        assert all(0 <= a <= 100 for a in row["pflx"] + row["PFLlib"]) and len(row["pflx"]) == 3
        assert row["diffs"] == [p - q for p, q in zip(row["pflx"], row["PFLlib"])]
    assert any(line.startswith("not matched:") for line in lines)
    assert lines[-1].startswith("every shared algorithm agrees") or "outside the bound" in lines[-1]


@pytest.mark.slow
def test_the_stack_benchmark_prints_its_curve_and_ratios_beside_the_targets():
    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "stack_bench.py"), "--rounds", "2", "--ks", "1,8",
                           "--part", "runs"], env={**os.environ, "OMP_NUM_THREADS": "1"}, capture_output=True,
                          text=True, timeout=900, cwd=ROOT / "benchmarks")
    assert proc.returncode in (0, 1), proc.stderr  # 1: a target missed at a smoke size, printed as such
    assert "stacked K=8 / 8 separate processes (CPU)" in proc.stdout and "target <= 0.33" in proc.stdout


@pytest.mark.slow
def test_the_stack_benchmark_prints_pefll_on_the_ring_beside_its_target():
    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "stack_bench.py"), "--part", "pefll",
                           "--pefll-rounds", "2", "--pefll-ks", "1,8"], env={**os.environ, "OMP_NUM_THREADS": "1"},
                          capture_output=True, text=True, timeout=900, cwd=ROOT / "benchmarks")
    assert proc.returncode in (0, 1), proc.stderr  # 1: a target missed at a smoke size, printed as such
    assert "PeFLL, ring" in proc.stdout and "target <= 0.50" in proc.stdout
    assert "stacked K=8 / 8 separate processes (CPU) PeFLL" in proc.stdout


def _tutorial_bench():
    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        import tutorial_bench
    finally:
        sys.path.pop(0)
    return tutorial_bench


def test_the_tutorial_benchmark_runs_the_pages_blocks_in_order_and_its_fresh_shell_has_no_thread_variable():
    bench = _tutorial_bench()
    script = bench.page_script(ROOT / "docs" / "tutorials" / "tune-then-compare.md", smoke=True)
    assert script.startswith("set -euo pipefail\npflx partition --dataset builtin:digits")
    assert script.index("pflx tune --partition runs/tc/part --algorithm fedavg --trials 1 --rounds 2") < \
        script.index("pflx compare --spec runs/tc/protocol.yaml")
    assert "--trials 12" not in script and "trials: 12" not in script
    env = bench.fresh_env(None)
    assert not {"OMP_NUM_THREADS", "MKL_NUM_THREADS", "PFLX_THREADS"} & set(env)
    assert bench.fresh_env("1")["OMP_NUM_THREADS"] == "1"


@pytest.mark.slow
def test_the_tutorial_benchmark_runs_the_tutorial_both_ways_at_smoke_size():
    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "tutorial_bench.py"), "--smoke"],
                          capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr + proc.stdout
    assert "OMP_NUM_THREADS unset: wall" in proc.stdout and "OMP_NUM_THREADS=1  : wall" in proc.stdout
    assert "(target <= 1.2x): no verdict (--smoke)" in proc.stdout


@pytest.mark.slow
def test_the_conditions_benchmark_prints_its_ratios_beside_the_targets():
    """A smoke size (3 rounds of 4 clients): the figures and the verdicts are there whatever the ratios."""
    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "conditions_bench.py"), "--rounds", "3",
                           "--cohort", "4", "--local-steps", "2", "--hidden", "16"], env=ENV, capture_output=True,
                          text=True, timeout=600, cwd=ROOT / "benchmarks")
    assert proc.returncode in (0, 1), proc.stderr  # 1: a target missed at a smoke size, printed as such
    for label in ("conditions / plain (same selection)", "conditions / plain (the answering clients)",
                  "partial work / plain (fedprox)"):
        line = next(ln for ln in proc.stdout.splitlines() if ln.strip().startswith(label))
        assert "target <= 1.20x" in line and line.rstrip().endswith(("ok", "MISSED"))


@pytest.mark.slow
def test_the_async_benchmark_prints_its_ratio_beside_the_target():
    """A smoke size (3 steps of K = 4): the figure and the verdict are there whatever the ratio."""
    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "async_bench.py"), "--rounds", "3",
                           "--cohort", "4", "--local-steps", "2", "--hidden", "16"], env=ENV, capture_output=True,
                          text=True, timeout=600, cwd=ROOT / "benchmarks")
    assert proc.returncode in (0, 1), proc.stderr
    line = next(ln for ln in proc.stdout.splitlines() if ln.strip().startswith("fedbuff server step / fedavg round"))
    assert "target <= 1.30x" in line and line.rstrip().endswith(("ok", "MISSED"))


@pytest.mark.slow
def test_the_async_claim_prints_its_ratio_beside_the_target():
    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "async_claims.py"), "--rounds", "3",
                           "--eval-every", "3", "--local-steps", "2", "--seeds", "0"], env=ENV, capture_output=True,
                          text=True, timeout=600, cwd=ROOT / "benchmarks")
    assert proc.returncode in (0, 1), proc.stderr
    assert any(ln.strip().startswith("fedavg / fedbuff simulated time to target") and "target >= 2.0x" in ln
               for ln in proc.stdout.splitlines()), proc.stdout


@pytest.mark.slow
def test_the_conditions_claims_print_each_claim_beside_its_target():
    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "conditions_claims.py"), "--rounds", "2",
                           "--local-steps", "2", "--seeds", "0"], env=ENV, capture_output=True, text=True,
                          timeout=600, cwd=ROOT / "benchmarks")
    assert proc.returncode in (0, 1), proc.stderr
    for label in ("90 % stragglers: fedprox (partial) - fedavg (drop)", "top-k 1 % with error feedback - uncompressed",
                  "top-k 1 %: with - without error feedback"):
        assert any(ln.strip().startswith(label) and "target" in ln for ln in proc.stdout.splitlines()), proc.stdout


@pytest.mark.slow
def test_refusal_benchmark_prints_every_commands_figure_beside_its_target():
    """Every command's refusal or "up to date" answer, each in a fresh process, against 0.5 CPU s (issue 49,
    finding 20); the verdicts depend on the machine, the lines must be there."""
    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "refusal_bench.py"), "--repeats", "1"],
                          cwd=ROOT / "benchmarks", env={**os.environ, "PYTHONPATH": str(ROOT)}, capture_output=True,
                          text=True, timeout=1200)
    assert proc.returncode in (0, 1), proc.stderr
    lines = [ln for ln in proc.stdout.splitlines() if "target cpu <= 0.5 s" in ln]
    commands = {ln.split(":")[0].strip().split()[0] for ln in lines}
    assert commands == {"partition", "mdm-fit", "simulate", "train", "tune", "predict", "attack", "cluster", "show",
                        "compare", "privacy-account", "algorithms"}
    assert all(ln.rstrip().endswith((" ok", "MISSED")) for ln in lines)
    assert ("MISSED" in proc.stdout) == (proc.returncode == 1)


def _tuned():
    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        import tuned
    finally:
        sys.path.pop(0)
    return tuned


def test_the_tuned_benchmarks_pick_the_best_validation_score_first_on_ties_and_nan_as_worst():
    tuned = _tuned()
    scores = {0.1: 0.5, 0.3: float("nan"), 0.03: 0.5, 0.01: 0.2}
    choice = tuned.select(tuned.grid(lr=[0.1, 0.3, 0.03, 0.01]), lambda p: scores[p["lr"]])
    assert choice.point == {"lr": 0.1} and choice.score == 0.5
    assert [s for _p, s in choice.scores] == [0.5, float("-inf"), 0.5, 0.2]
    assert tuned.grid(lr=[1, 2], k=[3]) == [{"lr": 1, "k": 3}, {"lr": 2, "k": 3}]
    with pytest.raises(RuntimeError, match="no point"):
        tuned.select([{"lr": 1}], lambda p: float("nan"))


def test_the_tuned_benchmarks_train_their_grid_on_validation_data_only():
    """Every selection run sees a carve of the train clients' train samples: no test sample, no holdout client."""
    from types import SimpleNamespace

    import numpy as np

    from pfl_cli.partition import PartitionConfig, partition_labels
    from pfl_cli.registry import train_config
    from pfl_cli.rng import make_rng

    tuned = _tuned()
    y = np.repeat(np.arange(3), 40)
    x = np.random.default_rng(0).normal(size=(len(y), 4)).astype(np.float32)
    part = partition_labels(y, PartitionConfig(scheme="dirichlet", alpha=1.0, num_clients=10, holdout_clients=2,
                                               seed=0, test_fraction=0.3), num_classes=3, rng=make_rng(0, "partition"))
    train_ids = set(np.asarray(part.client_id)[np.asarray(part.role) == 0].tolist())
    allowed = set(np.concatenate([part.train_of(j) for j in range(part.num_clients) if part.role[j] == 0]).tolist())
    seen = []

    def fake_train(x_, y_, k, vpart, cfg, device=None):
        seen.append((vpart, cfg))
        score = {"train": {"mean_accuracy": cfg.lr}, "holdout": {"mean_accuracy": -cfg.lr}}
        return SimpleNamespace(outcome=SimpleNamespace(best=SimpleNamespace(summaries=lambda: score)))

    base = train_config("fedavg", rounds=8, seed=3)
    got = tuned.tune(x, y, 3, part, base, tuned.grid(lr=[0.1, 0.3, 0.03]), train=fake_train, rounds=2)
    assert got.point == {"lr": 0.3}
    got = tuned.tune(x, y, 3, part, base, tuned.grid(lr=[0.1, 0.3, 0.03]), group="holdout", val_clients=0.25,
                     train=fake_train)
    assert got.point == {"lr": 0.03}
    for vpart, cfg in seen:
        assert set(np.asarray(vpart.client_id).tolist()) <= train_ids
        used = set(np.asarray(vpart.train_indices).tolist()) | set(np.asarray(vpart.test_indices).tolist())
        assert used <= allowed and len(vpart.test_indices) > 0
    assert [c.rounds for _v, c in seen] == [2, 2, 2, 8, 8, 8]
    assert (np.asarray(seen[-1][0].role) == 1).sum() == 2  # validation clients carved from the 8 train clients
