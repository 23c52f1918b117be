"""Benchmark: every algorithm pflx shares with PFLlib, trained by both on the same clients, side by side.

One pflx partition (pathological, two classes a client, ``--clients`` 20 clients, 75/25 train/test
within each client, as PFLlib's generators split) of ``--dataset`` (default: the ring,
``ring:?train_per_class=90&test_per_class=90``, where one global model is capped near 47 % and a
client that knows its two classes reaches about 89 %: a task FedAvg cannot solve; ``builtin:digits``
works too) is exported into PFLlib's data layout (``dataset/<name>/{train,test}/<i>.npz``, each a
pickled dict ``{'x', 'y'}``); both tools get the same standardized arrays (train-pool mean and std
per feature). Each algorithm then trains in pflx and in PFLlib with matched settings: MLP
(features)-100-10 (the same layers, PyTorch's default initialization), plain SGD (no momentum, no
clipping), lr 0.05, batch 10, one local epoch, ``--rounds`` rounds, every client every round, and
the method's own constants set equal where they mean the same (the table ``_algorithms`` below;
what could not be matched is printed under the table). Every run repeats for each of ``--seeds``
(three or more) and each cohort of ``--participation`` (join ratios: 1, every client every round,
as PFLlib's ``-jr 1``; 0.25, a quarter of the clients drawn each round, PFLlib's ``-jr 0.25``);
the partition is the same for all.

The figure is the pooled test accuracy of the training clients (correct / samples over all
clients' test splits, PFLlib's ``evaluate``) after the last round, each tool's own personalized
model where the method has one. The verdict is paired by seed (:func:`paired_verdict`): the
differences d_s = pflx_s - PFLlib_s, their mean and its 95 % Student-t interval; a row fails when
``|mean| > 2`` points (a gap no seed noise excuses: ``--bound``), or when the interval excludes 0
and ``|mean| > 0.5`` point (``--tolerance``: a systematic same-sign gap, even under 2 points);
exit 1 when any row fails. Without PFLlib (or without the modules it imports) the benchmark says
so and exits 0.

PFLlib is driven as a subprocess on the exported files: this script's ``--child pfllib`` mode,
run by the peer's Python with PFLlib's ``system/`` on its path and the temp folder as working
directory, builds PFLlib's own argument namespace from PFLlib's own parser (its ``main.py``),
puts the MLP in ``args.model`` (split into ``base`` and ``head`` for the methods whose
``main.py`` branch does so), and calls the method's ``Server(args, 0).train()``. Nothing of
PFLlib is copied here. PFLlib seeds torch with 0 at import and at every client's construction;
the driver reseeds torch, numpy and random with the run's seed after the server is built, so its
seeds differ as pflx's do.

The initial model (``--init``): ``shared``, PFLlib starts from pflx's initial model of the same
seed (its ``fc1`` and output layer, written by this script and loaded by the driver before
``main.py``'s split), so that a gap measures the procedures and the batch order, not two initial
draws; FedBABU needs it: its head stays at the initial draw for all of training, and its final
accuracy spans several points over draws (docs/performance/conformance.md). Methods whose pflx
model has more than the MLP's layers cannot share it and are refused under ``shared``; ``own``,
each tool draws its own from its seed; ``auto`` (the default), shared where the method's model is
the MLP alone, each tool's own draw otherwise (the table says which). ``--shared-init`` is
``--init shared``.

    python benchmarks/conformance.py --pfllib /path/to/PFLlib [--algorithms fedavg,ditto] [--rounds 100]
        [--seeds 0,1,2] [--participation 1,0.25] [--jobs 1] [--init auto|shared|own]

``--peer fluke`` runs the same comparison against fluke-fl (``benchmarks/conformance_fluke.py``: its rows,
and the ``--child fluke`` driver run by fluke's own Python, ``--python``, ``$FLUKE_PYTHON`` or
``.venv-fluke/bin/python``), for the algorithms fluke shares; the data, seeds, cohorts, initial models and
verdict are the ones above.

``--peer flbench`` runs pFedLA against FL-bench's own (``benchmarks/conformance_flbench.py``, with that script's
options: its hypernetwork step sizes, FL-bench's checkout and Python) on the same exported clients.

PFLlib is looked for at ``--pfllib``, ``$PFLLIB_DIR``, then ``.venv-bench/PFLlib`` beside this
checkout; its Python at ``--python``, ``$PFLLIB_PYTHON``, ``.venv-bench/bin/python``, else this
interpreter (it needs torch, numpy, scikit-learn, h5py and matplotlib: PFLlib's server module
imports the last two). See docs/performance/conformance.md.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import statistics
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
from concurrent.futures import ThreadPoolExecutor

HERE = pathlib.Path(__file__).resolve().parent
ROOT = HERE.parent
DATASET = "pflxexport"  # PFLlib picks its data reader by name ("News", "Shakespeare"); this one reads arrays
# The ring (pflx's task that needs personalization, pfl_cli/data/ring.py): one global model is capped near 47 %,
# a client that knows its two classes reaches about 89 %. 90 + 90 samples a class: digits' size.
DEFAULT_DATASET = "ring:?train_per_class=90&test_per_class=90"
PEER_MODULES = ("torch", "numpy", "sklearn", "h5py", "matplotlib")
LR, BATCH, HIDDEN = 0.05, 10, 100


def _algorithms(rounds: int) -> dict[str, dict]:
    """pflx algorithm -> its keys, PFLlib's ``-algo`` name and flags, and what stays unmatched.

    ``split``: PFLlib's ``main.py`` wraps the net as ``BaseHeadSplit(base, head)`` for this method.
    ``acc``: the PFLlib server list holding the personalized accuracy (pFedMe keeps its own).
    """
    return {
        "fedavg": dict(peer="FedAvg", split=True, pflx={}, flags=[]),
        "fedprox": dict(peer="FedProx", pflx={"mu": 0.01}, flags=["-mu", "0.01"]),
        "ditto": dict(peer="Ditto", pflx={"lam": 0.1}, flags=["-mu", "0.1", "-pls", "1"]),
        "fedrep": dict(peer="FedRep", split=True, pflx={"head_epochs": 5, "body_epochs": 1, "local_epochs": None},
                       flags=["-pls", "5"]),
        "fedper": dict(peer="FedPer", split=True, pflx={}, flags=[]),
        "lg-fedavg": dict(peer="LG-FedAvg", split=True, pflx={}, flags=[]),
        "apfl": dict(peer="APFL", pflx={"alpha": 0.5}, flags=["-al", "0.5"],
                     unmatched="APFL: PFLlib adds 0.02 * alpha to alpha's gradient, a term APFL's Alg. 1 has not"),
        "pfedme": dict(peer="pFedMe", acc="rs_test_acc_per",
                       pflx={"lam": 15.0, "K": 5, "personal_lr": 0.01, "beta": 1.0},
                       flags=["-lam", "15", "-K", "5", "-lrp", "0.01", "-bt", "1.0"], unalias=True,
                       unmatched="pFedMe: PFLlib's stored personalized parameters alias its model (defect 1 in "
                                 "docs/performance/conformance.md), so the driver keeps copies of them and scores "
                                 "those; PFLlib's inner step adds an L2 term (mu = 0.001) pflx's has not"),
        "perfedavg": dict(peer="PerAvg", pflx={}, flags=[],
                          unmatched="Per-FedAvg: PFLlib's local step takes two batches per update; its evaluation "
                                    "fine-tunes one step on one batch"),
        "local": dict(peer="Local", pflx={"local_epochs": rounds}, flags=[]),
        "fedbabu": dict(peer="FedBABU", split=True, pflx={"finetune_epochs": 5}, flags=["-fte", "5"]),
        "fedrod": dict(peer="FedROD", split=True, pflx={}, flags=[]),
        "fedbn": dict(peer="FedBN", bn=True, pflx={"model_arch": "mlp-bn"}, flags=[],
                      unmatched="FedBN: PFLlib weighs the shared layers by data size, pflx uniformly (Alg. 1)"),
        # ala_every_client: PFLlib (the authors' code) runs ALA on every client each round and scores those models
        "fedala": dict(peer="FedALA", pflx={"ala_eta": 1.0, "ala_sample": 0.8, "ala_layers": 1,
                                            "ala_threshold": 0.1, "ala_num_pre_loss": 10, "ala_every_client": True},
                       flags=["-et", "1.0", "-s", "80", "-p", "2"],
                       unmatched="FedALA: PFLlib's start phase has no cap (pflx: 100 passes) and samples a "
                                 "contiguous slice (pflx: a random subset)"),
        "feddbe": dict(peer="FedDBE", split=True, pflx={"dbe_kappa": 50.0, "dbe_momentum": 1.0},
                       flags=["-klw", "50", "-mo", "1.0"]),
        "gpfl": dict(peer="GPFL", split=True, pflx={"gpfl_lambda": 0.01, "gpfl_mu": 0.1},
                     flags=["-lam", "0.01", "-mu", "0.1"],
                     unmatched="GPFL: PFLlib conditions on the client's previous-round GCE, pflx on the global GCE "
                               "it receives (the paper)"),
        # PFLlib's alignment is MSELoss (the mean over the d = 100 features), the paper's the squared norm:
        # -lam 1 is fedpac_lambda 0.01 (pflx's default 1 / d)
        # full_only: PFLlib's FedPAC indexes the round's uploads by client id (serverpac.py line 162, defect 7
        # in docs/performance/conformance.md): under partial participation it reads another client's head
        "fedpac": dict(peer="FedPAC", split=True, needs=("cvxpy",), full_only=True,  # serverpac.py imports cvxpy
                       pflx={"fedpac_lambda": 1.0 / HIDDEN, "head_epochs": 1, "body_epochs": 1, "head_lr": LR,
                             "lambda_theta": 0.0, "local_epochs": None},
                       flags=["-lam", "1.0"],
                       unmatched="FedPAC: PFLlib averages the clients' class prototypes uniformly (pflx: weighted by "
                                 "class counts, as the paper) and zeroes combination weights below 1e-3 without "
                                 "renormalizing (pflx: the QP's exact minimizer)"),
        "fedcp": dict(peer="FedCP", split=True, pflx={"fedcp_lambda": 5.0, "fedcp_tau": 1.0}, flags=["-lam", "5"],
                      unmatched="FedCP: PFLlib's v_i is random before a client's first round, it draws Gumbel noise "
                                "when testing (pflx: the noise-free policy), and under partial participation it hands "
                                "the new global head and CPN to the cohort only (pflx: every cohort gets the current "
                                "ones)"),
        "fedas": dict(peer="FedAS", split=True,
                      pflx={"fedas_align_lr": 0.01, "fedas_align_epochs": 1, "fedas_align_batch": 16}, flags=[],
                      stub=("avg_generalization_metrics",),
                      unmatched="FedAS: PFLlib averages the whole model (its global head is never read) and computes "
                                "Fisher traces outside the cohort too; its train() calls avg_generalization_metrics, "
                                "which PFLlib lacks (serveras.py line 114): the driver stubs it"),
        # issue 40's personalized methods PFLlib has. FedProto: PFLlib's -lam weighs nn.MSELoss (the mean over the
        # d = 100 features, clientproto.py line 19), pflx's fedproto_lambda the squared norm: -lam 1 is 1 / d. Both
        # classify by the nearest global prototype (pflx's inference: prototype; PFLlib's clientproto.py test_metrics)
        "fedproto": dict(peer="FedProto", split=True, pflx={"fedproto_lambda": 1.0 / HIDDEN, "inference": "prototype"},
                         flags=["-lam", "1"],
                         unmatched="FedProto: PFLlib averages a class's prototypes uniformly over the clients that "
                                   "hold it (serverproto.py proto_aggregation; pflx: weighted by class counts, Eq. 6), "
                                   "takes a client's prototypes from the representations of the epoch's batches as "
                                   "they train (clientproto.py train; pflx: from the trained model, Eq. 3) and, with a "
                                   "cohort, keeps only the round's classes as global prototypes (pflx: a class no "
                                   "cohort client holds keeps its last prototype)"),
        # FedAMP: PFLlib's -alk is alpha_k (the attention's step and the proximal weight's denominator), -sg sigma
        "fedamp": dict(peer="FedAMP", pflx={"alpha_k": 1.0, "sigma": 1.0, "lam": 1.0},
                       flags=["-alk", "1.0", "-sg", "1.0", "-lam", "1.0"],
                       unmatched="FedAMP: PFLlib's proximal term is built from .data copies of both models and is "
                                 "the norm, not its square (clientamp.py train): it has no gradient, so PFLlib's "
                                 "clients train their own models as Local does (docs/performance/conformance.md)"),
        # FedFomo: PFLlib holds out the last 20 % of each client's train split (clientfomo.py val_ratio 0.2) to weigh
        # the models: pflx's val_fraction 0.2; PFLlib sends the top M by affinity, no epsilon-greedy exploration
        "fedfomo": dict(peer="FedFomo", pflx={"fomo_models": 5, "fomo_epsilon": 0.0, "fomo_epsilon_decay": 0.0,
                                              "val_fraction": 0.2},
                        flags=["-M", "5"],
                        unmatched="FedFomo: PFLlib weighs the received models against the client's model before its "
                                  "last local training (clientfomo.py: old_model is copied after the aggregation, "
                                  "before train), pflx against its model as last trained (Eq. 3-7); PFLlib's "
                                  "held-out part is the split's last 20 % unshuffled and its train part drops the "
                                  "last partial batch, pflx's validation carve is its own draw"),
        # issue 40's optimization baselines PFLlib has; both average SCAFFOLD's deltas uniformly (Alg. 1)
        "scaffold": dict(peer="SCAFFOLD", pflx={"server_lr": 1.0}, flags=["-slr", "1.0"]),
        "feddyn": dict(peer="FedDyn", pflx={"alpha": 0.01}, flags=["-al", "0.01"],
                       unmatched="FedDyn: PFLlib's proximal term is alpha / 2 times the norm, not its square "
                                 "(clientdyn.py train), and its server averages the models by data size "
                                 "(serverdyn.py aggregate_parameters; pflx uniformly, Alg. 1)"),
        "moon": dict(peer="MOON", split=True, pflx={"moon_mu": 1.0, "moon_tau": 0.5},
                     flags=["-mu", "1.0", "-tau", "0.5"]),
        # FedLC: tau 1 in both; PFLlib calibrates with the pooled class counts of all clients (serverlc.py __init__)
        "fedlc": dict(peer="FedLC", split=True, pflx={"tau": 1.0}, flags=["-tau", "1.0"],
                      unmatched="FedLC: PFLlib's calibration is tau * n_y^(-1/4) of the class counts summed over all "
                                "clients, one vector for every client (serverlc.py __init__); pflx's (and the "
                                "paper's, Zhang et al. 2022 §4) is each client's own counts n_{i,y}"),
    }


def _table(peer: str, rounds: int) -> dict[str, dict]:
    """The shared algorithms' rows for ``peer``: PFLlib's (:func:`_algorithms`) or fluke's
    (``conformance_fluke.fluke_algorithms``)."""
    if peer == "fluke":
        return _fluke().fluke_algorithms(rounds, LR)
    return _algorithms(rounds)


def _fluke():
    """benchmarks/conformance_fluke.py, the fluke side, imported from beside this file under its own name (fluke's
    child builds its models as ``conformance_fluke.FlukeMLP``)."""
    import importlib.util

    if "conformance_fluke" not in sys.modules:
        spec = importlib.util.spec_from_file_location("conformance_fluke", HERE / "conformance_fluke.py")
        module = importlib.util.module_from_spec(spec)
        sys.modules["conformance_fluke"] = module
        spec.loader.exec_module(module)
    return sys.modules["conformance_fluke"]


COMMON_UNMATCHED = (
    "PFLlib's loop trains rounds + 1 times and scores at the start of round `rounds` (FedBABU after its extra "
    "round and fine-tuning); pflx scores after round `rounds`",
    "model initialization: the same layers and PyTorch's default init, drawn from each tool's own seed",
)


# ----------------------------------------------------------------------------- the verdict

BOUND, TOLERANCE = 2.0, 0.5  # points of pooled test accuracy


def paired_verdict(pflx: list[float], peer: list[float], *, bound: float = BOUND,
                   tolerance: float = TOLERANCE) -> dict:
    """The paired comparison of one row: per-seed accuracies (points) of the two tools, seed s in both lists.

    d_s = pflx_s - peer_s; mean d_bar, its 95 % Student-t interval d_bar +- t(0.975, n - 1) sd / sqrt(n)
    (n >= 3 seeds: with two the interval is d_bar +- 12.7 sd, uninformative). Verdict ``miss`` when
    ``|d_bar| > bound`` (a gap beyond what two tools of one method should show, whatever the seeds say);
    ``gap`` when the interval excludes 0 and ``|d_bar| > tolerance`` (a systematic same-sign difference,
    even under ``bound``: the +1.77 on every seed that ``max(2, spread)`` passed); ``ok`` otherwise.
    ``tolerance`` (0.5 point, about two of the 452 test samples of the default task) keeps a real but
    negligible difference of one of the documented unmatched details from failing the row once many
    seeds shrink the interval; it is no excuse for a gap the interval resolves above it.
    """
    import math

    from scipy import stats

    if len(pflx) != len(peer) or len(pflx) < 3:
        raise ValueError(f"paired_verdict: needs the same three or more seeds in both tools; got {len(pflx)} "
                         f"and {len(peer)}")
    diffs = [a - b for a, b in zip(pflx, peer)]
    n = len(diffs)
    mean = statistics.fmean(diffs)
    half = float(stats.t.ppf(0.975, n - 1)) * statistics.stdev(diffs) / math.sqrt(n)
    low, high = mean - half, mean + half
    excludes_zero = low > 0 or high < 0
    verdict = ("miss" if abs(mean) > bound else
               "gap" if excludes_zero and abs(mean) > tolerance else "ok")
    return {"diffs": diffs, "mean": mean, "low": low, "high": high, "verdict": verdict}


def parse_participation(text: str) -> list[float]:
    """``--participation``: comma-separated join ratios in (0, 1]; ValueError with the rule otherwise."""
    try:
        ratios = [float(v) for v in text.split(",") if v.strip()]
    except ValueError:
        ratios = []
    if not ratios or any(not 0 < r <= 1 for r in ratios) or len(set(ratios)) != len(ratios):
        raise ValueError(f"--participation must list distinct join ratios in (0, 1] (1: every client every "
                         f"round, 0.25: a quarter of the clients a round); got {text!r}")
    return ratios


def cohort_size(join: float, clients: int) -> int | None:
    """The clients a round at join ratio ``join``: PFLlib's ``int(num_clients * join_ratio)``; None for all."""
    return None if join >= 1 else max(1, int(clients * join))


# ----------------------------------------------------------------------------- parent: orchestration


_CACHE_LOCK = threading.Lock()


class PeerCache(dict):
    """PFLlib's results by run (``--peer-cache``): the peer's side does not change when pflx's does."""

    def __init__(self, path: str | None, setting: str) -> None:
        super().__init__()
        self.path, self.setting = (pathlib.Path(path) if path else None), setting
        if self.path is not None and self.path.is_file():
            self.update(json.loads(self.path.read_text()))

    def key(self, algorithm: str, join: float, seed: int, init_file: pathlib.Path, row: dict | None = None) -> str:
        """The run's key; ``row``, the algorithm's row of the table: its peer side (flags, fluke's keys, what the
        driver scores) joins the key, so a changed constant is a new run, not the cached one (FedAMP's sigma)."""
        import hashlib

        init = hashlib.sha256(init_file.read_bytes()).hexdigest()[:16] if init_file.is_file() else "own"
        key = f"{self.setting}|{algorithm}|{join!r}|{seed}|{init}"
        if row is not None:
            peer_side = {k: v for k, v in row.items() if k not in ("pflx", "unmatched")}
            key += "|" + hashlib.sha256(json.dumps(peer_side, sort_keys=True, default=str).encode()).hexdigest()[:16]
        return key

    def add(self, key: str, result: dict) -> dict:
        with _CACHE_LOCK:  # runs finish on the pool's threads
            self[key] = result
            if self.path is not None:
                self.path.write_text(json.dumps(dict(self), indent=1, sort_keys=True))
        return result


def _find_pfllib(arg: str | None) -> tuple[pathlib.Path | None, str]:
    """The PFLlib checkout: the first of --pfllib, $PFLLIB_DIR, .venv-bench/PFLlib that is given (or exists)."""
    given = arg or os.environ.get("PFLLIB_DIR")
    cand = pathlib.Path(given) if given else ROOT / ".venv-bench" / "PFLlib"
    if (cand / "system" / "flcore" / "servers" / "serveravg.py").is_file():
        return cand.resolve(), ""
    return None, (f"{cand} is not a PFLlib checkout (no system/flcore/servers/serveravg.py)" if given else
                  "PFLlib not found (give --pfllib DIR or PFLLIB_DIR, or put a checkout at .venv-bench/PFLlib)")


def _find_python(arg: str | None) -> str:
    for cand in (arg, os.environ.get("PFLLIB_PYTHON"), str(ROOT / ".venv-bench" / "bin" / "python")):
        if cand and pathlib.Path(cand).exists():
            return os.path.abspath(cand)  # PFLlib runs in the temp folder; not resolve(): a venv's python is a link
    return sys.executable


def _missing_modules(python: str, extra: tuple = ()) -> list[str]:
    """PFLlib's imports (and ``extra``: the modules one method's server imports, its ``needs``) the peer's
    Python lacks."""
    wanted = (*PEER_MODULES, *extra)
    code = ("import importlib.util, sys; print(','.join(m for m in sys.argv[1:] "
            "if importlib.util.find_spec(m) is None))")
    out = subprocess.run([python, "-c", code, *wanted], capture_output=True, text=True)
    return [m for m in out.stdout.strip().split(",") if m] if out.returncode == 0 else list(wanted)


def _peer_version(pfllib: pathlib.Path) -> str:
    out = subprocess.run(["git", "-C", str(pfllib), "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
    return out.stdout.strip() if out.returncode == 0 and out.stdout.strip() else "a snapshot (no git metadata)"


def _export(work: pathlib.Path, dataset: str, clients: int, partition_seed: int) -> dict:
    """The partition, standardized, as pflx's arrays (``pflx.npz``) and PFLlib's per-client files."""
    import numpy as np

    from pfl_cli.data import load_dataset
    from pfl_cli.partition import PartitionConfig, partition_labels
    from pfl_cli.rng import make_rng

    ds = load_dataset(dataset)
    part = partition_labels(ds.y, PartitionConfig(scheme="pathological", classes_per_client=2, num_clients=clients,
                                                  holdout_clients=0, test_fraction=0.25),
                            num_classes=10, rng=make_rng(partition_seed, "partition"))
    part = _whole_batches(part)
    x = ds.x.reshape(len(ds.x), -1).astype(np.float32)
    pool = x[part.train_indices]
    std = pool.std(0)
    x = (x - pool.mean(0)) / np.where(std > 0, std, 1.0)  # train-pool statistics, what pflx's normalize does
    np.savez(work / "pflx.npz", x=x, y=ds.y.astype(np.int64))
    with open(work / "partition.pkl", "wb") as f:
        import pickle

        pickle.dump(part, f)
    for split, offsets, indices in (("train", part.train_offsets, part.train_indices),
                                    ("test", part.test_offsets, part.test_indices)):
        folder = work / "dataset" / DATASET / split
        folder.mkdir(parents=True)
        for i in range(part.num_clients):
            rows = indices[offsets[i]:offsets[i + 1]]
            with open(folder / f"{i}.npz", "wb") as f:  # PFLlib's layout: np.savez_compressed(f, data={...})
                np.savez_compressed(f, data={"x": x[rows], "y": ds.y[rows].astype(np.int64)})
    (work / "cwd").mkdir()  # PFLlib reads ../dataset and writes ../results relative to its working directory
    sizes = part.train_sizes
    return {"features": x.shape[1], "clients": part.num_clients, "train": int(sizes.sum()), "test": int(len(part.test_indices)),
            "train_per_client": f"{sizes.min()}-{sizes.max()}"}


def _whole_batches(part):
    """The partition with every train split cut to a multiple of the batch: PFLlib's loaders drop the last
    partial batch (``drop_last=True``) and pflx's keep it, so only whole batches give both the same steps."""
    import dataclasses

    import numpy as np

    sizes = part.train_sizes // BATCH * BATCH
    keep = [part.train_indices[part.train_offsets[i]:part.train_offsets[i] + n] for i, n in enumerate(sizes)]
    return dataclasses.replace(part, train_indices=np.concatenate(keep).astype(np.int64),
                               train_offsets=np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64))


def _run(framework: str, alg: str, join: float, seed: int, args, work: pathlib.Path, pfllib: pathlib.Path,
         python: str) -> dict:
    cmd = ["--child", framework, "--algorithm", alg, "--seed", str(seed), "--rounds", str(args.rounds),
           "--work", str(work), "--join", repr(join), "--peer", args.peer]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
    if framework == "pflx":
        env["PYTHONPATH"] = str(ROOT)
        proc = subprocess.run([sys.executable, str(pathlib.Path(__file__).resolve()), *cmd], capture_output=True,
                              text=True, env=env)
    else:  # the peer's Python; PFLlib's system/ on its path (fluke's child imports conformance_fluke beside this)
        env["PYTHONPATH"] = str(pfllib / "system") if framework == "PFLlib" else str(HERE)
        proc = subprocess.run([python, str(pathlib.Path(__file__).resolve()), *cmd], capture_output=True, text=True,
                              env=env, cwd=work / "cwd")
    if proc.returncode != 0:
        raise RuntimeError(f"{framework} {alg} join {join} seed {seed} exited {proc.returncode}: "
                           f"{' | '.join(proc.stderr.strip().splitlines()[-4:])}")
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    print(f"  {framework} {alg} join {join} seed {seed}: {100 * result['accuracy']:.2f} % in "
          f"{result['seconds']:.0f} s",
          file=sys.stderr, flush=True)
    return result


def _peer_flbench(argv: list[str]) -> list[str] | None:
    """``argv`` without its ``--peer flbench`` when it names FL-bench (pFedLA, the one method pflx compares with
    FL-bench: benchmarks/conformance_flbench.py, whose options are its own), else None."""
    for i, a in enumerate(argv):
        if a == "--peer=flbench":
            return argv[:i] + argv[i + 1:]
        if a == "--peer" and argv[i + 1:i + 2] == ["flbench"]:
            return argv[:i] + argv[i + 2:]
    return None


def main(argv=None) -> int:
    rest = _peer_flbench(sys.argv[1:] if argv is None else list(argv))
    if rest is not None:
        sys.path.insert(0, str(HERE))
        import conformance_flbench

        return conformance_flbench.main(rest)
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--peer", choices=("pfllib", "fluke", "flbench"), default="pfllib",
                    help="the peer: PFLlib (default) or fluke-fl (its own Python: --python, $FLUKE_PYTHON or "
                    ".venv-fluke/bin/python; see docs/performance/conformance.md); flbench: pFedLA against "
                    "FL-bench's own, benchmarks/conformance_flbench.py with its options")
    ap.add_argument("--pfllib", help="a PFLlib checkout (default: $PFLLIB_DIR, then .venv-bench/PFLlib)")
    ap.add_argument("--python", help="the Python that runs the peer (PFLlib's default: $PFLLIB_PYTHON, "
                                     ".venv-bench/bin/python, else this one)")
    ap.add_argument("--algorithms", default="", help="comma-separated pflx names (default: every shared one)")
    ap.add_argument("--rounds", type=int, default=100)
    ap.add_argument("--seeds", default="0,1,2", help="three or more: the paired verdict's t-interval needs them")
    ap.add_argument("--participation", default="1,0.25",
                    help="join ratios, each a run of every algorithm: 1 every client every round (PFLlib -jr 1), "
                    "0.25 a quarter of the clients drawn each round (default: both)")
    ap.add_argument("--bound", type=float, default=BOUND, help="fail a row whose mean gap exceeds this (points)")
    ap.add_argument("--tolerance", type=float, default=TOLERANCE,
                    help="fail a row whose gap's 95 %% interval excludes 0 and whose mean gap exceeds this (points)")
    ap.add_argument("--clients", type=int, default=20)
    ap.add_argument("--dataset", default=DEFAULT_DATASET, help="a pflx dataset spec of flat features (default: the "
                    "ring; builtin:digits works too)")
    ap.add_argument("--jobs", type=int, default=1, help="runs at once (each one thread)")
    ap.add_argument("--json", help="also write the rows here")
    ap.add_argument("--peer-cache", help="a JSON file of the peer's results: runs found there (same PFLlib version, "
                    "data, rounds, cohort, seed, initial model and the row's peer constants) are read, not rerun; "
                    "new ones are added. For rerunning pflx's side after a change to pflx")
    ap.add_argument("--init", choices=("auto", "shared", "own"), default="auto",
                    help="shared: PFLlib starts from pflx's initial model of the same seed; own: each tool draws "
                    "its own; auto (default): shared where the method's model is the MLP alone, else own")
    ap.add_argument("--shared-init", action="store_const", const="shared", dest="init", help="--init shared")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    ap.add_argument("--algorithm", help=argparse.SUPPRESS)
    ap.add_argument("--seed", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--work", help=argparse.SUPPRESS)
    ap.add_argument("--join", type=float, default=1.0, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child:
        t = time.perf_counter()
        if args.child == "fluke":
            acc = _fluke().child(args, pathlib.Path(args.work) / "dataset" / DATASET, BATCH, LR)
            if isinstance(acc, tuple):  # (the score, fluke's own figures where the row scores another model)
                acc, own = acc
                EXTRA.update(own)
        else:
            acc = (_child_pflx if args.child == "pflx" else _child_pfllib)(args)
        print(json.dumps({"accuracy": acc, "seconds": time.perf_counter() - t, **EXTRA}))
        return 0
    table = _table(args.peer, args.rounds)
    algorithms = [a for a in args.algorithms.split(",") if a] or list(table)
    unknown = [a for a in algorithms if a not in table]
    try:
        seeds = [int(s) for s in args.seeds.split(",") if s]
    except ValueError:
        seeds = []
    try:
        joins = parse_participation(args.participation)
        bad_join = ""
    except ValueError as e:
        joins, bad_join = [], str(e)
    if (unknown or len(set(seeds)) < 3 or len(set(seeds)) != len(seeds) or bad_join or args.rounds < 1
            or args.clients < 2 or args.jobs < 1 or not 0 <= args.tolerance <= args.bound):
        why = (f"--algorithms must be among {', '.join(table)}; got {', '.join(unknown)}" if unknown else
               f"--seeds must list three or more distinct integers (the paired verdict's 95 % interval needs "
               f"them); got {args.seeds!r}" if len(set(seeds)) < 3 or len(set(seeds)) != len(seeds) else
               bad_join if bad_join else
               f"--tolerance must be >= 0 and <= --bound; got {args.tolerance} and {args.bound}"
               if not 0 <= args.tolerance <= args.bound else
               "--rounds, --clients (>= 2) and --jobs must be positive")
        print(f"conformance.py: {why}", file=sys.stderr)
        return 2
    if args.peer == "fluke":
        conformance_fluke = _fluke()
        pfllib, peer = None, "fluke"
        python, why = conformance_fluke.find_python(args.python, ROOT)
        if python is None:
            print(f"conformance.py: skipped: {why}; see docs/performance/conformance.md")
            return 0
        version = f"fluke-fl {conformance_fluke.version(python)}"
        location, common_unmatched = python, conformance_fluke.COMMON_UNMATCHED
    else:
        pfllib, why = _find_pfllib(args.pfllib)
        if pfllib is None:
            print(f"conformance.py: skipped: {why}; see docs/performance/conformance.md")
            return 0
        python = _find_python(args.python)
        missing = _missing_modules(python, tuple(m for a in algorithms for m in table[a].get("needs", ())))
        if missing:
            print(f"conformance.py: skipped: {python} lacks {', '.join(missing)}, which PFLlib imports; "
                  "see docs/performance/conformance.md for its virtual environment")
            return 0
        peer, version, location, common_unmatched = "PFLlib", f"PFLlib {_peer_version(pfllib)}", pfllib, \
            COMMON_UNMATCHED
    with tempfile.TemporaryDirectory(prefix="pflx-conformance-") as tmp:
        work = pathlib.Path(tmp)
        data = _export(work, args.dataset, args.clients, 0)
        try:
            shared = _share_initial_models(work, algorithms, args.rounds, seeds, args.init, args.peer)
        except ValueError as e:
            print(f"conformance.py: {e}", file=sys.stderr)
            return 2
        print(f"{version} at {location}; {args.dataset}, pathological 2 classes a client, "
              f"{data['clients']} clients ({data['train']} train / {data['test']} test samples, "
              f"{data['train_per_client']} train a client), standardized; MLP {data['features']}-{HIDDEN}-10, SGD lr {LR}, batch "
              f"{BATCH}, 1 local epoch, {args.rounds} rounds, cohorts {_cohort_words(joins, data['clients'])}; "
              f"seeds {args.seeds}; initial "
              f"model: {_init_words(args.init, shared, algorithms)}",
              flush=True)
        cases = [(a, j) for j in joins for a in algorithms if j >= 1 or not table[a].get("full_only")]
        skipped = [(a, j) for j in joins for a in algorithms if (a, j) not in cases]
        jobs = [(f, a, j, s) for a, j in cases for s in seeds for f in ("pflx", peer)]
        cache = PeerCache(args.peer_cache, f"{version}|{args.dataset}|{args.clients}|{args.rounds}")

        def run(job):
            f, a, j, s = job
            if f == peer:
                key = cache.key(a, j, s, work / _initial_model_file(a, s), table[a])
                if key in cache:
                    return cache[key]
                return cache.add(key, _run(*job, args, work, pfllib, python))
            return _run(*job, args, work, pfllib, python)

        with ThreadPoolExecutor(args.jobs) as pool:
            results = list(pool.map(run, jobs))
    runs = {job: r for job, r in zip(jobs, results)}
    print(f"{'algorithm':<10} {'cohort':>6} {'pflx %':>7} {peer + ' %':>8} {'diff':>6} {'95 % interval':>15} "
          f"{'pflx s':>6} {peer + ' s':>8}  verdict   per seed pflx / {peer}")
    misses, rows = [], []
    for a, j in cases:
        acc = {f: [100 * runs[(f, a, j, s)]["accuracy"] for s in seeds] for f in ("pflx", peer)}
        secs = {f: statistics.mean(runs[(f, a, j, s)]["seconds"] for s in seeds) for f in ("pflx", peer)}
        mean = {f: statistics.mean(v) for f, v in acc.items()}
        v = paired_verdict(acc["pflx"], acc[peer], bound=args.bound, tolerance=args.tolerance)
        misses += [] if v["verdict"] == "ok" else [f"{a} (cohort {j:g}: {v['verdict']})"]
        rows.append({"algorithm": a, "peer": table[a]["peer"], "join": j, "seeds": seeds, "pflx": acc["pflx"],
                     peer: acc[peer], **v, "initial_model": "shared" if a in shared else "own"})
        if all("peer_own" in runs[(peer, a, j, s)] for s in seeds):  # the peer's own figure of another model
            rows[-1][f"{peer}_own"] = [100 * runs[(peer, a, j, s)]["peer_own"] for s in seeds]
            if all("peer_own_clients" in runs[(peer, a, j, s)] for s in seeds):  # of the clients it scores
                rows[-1][f"{peer}_own_clients"] = [runs[(peer, a, j, s)]["peer_own_clients"] for s in seeds]
        per_seed = ", ".join(f"{p:.2f}/{q:.2f}" for p, q in zip(acc["pflx"], acc[peer]))
        interval = f"[{v['low']:+.2f}, {v['high']:+.2f}]"
        print(f"{a:<10} {j:>6g} {mean['pflx']:>7.2f} {mean[peer]:>8.2f} {v['mean']:>+6.2f} "
              f"{interval:>15} "
              f"{secs['pflx']:>6.1f} {secs[peer]:>8.1f}  {v['verdict']:<8}  {per_seed}"
              f"{'' if a in shared else ' (own draws)'}", flush=True)
    for a, j in skipped:
        print(f"{a:<10} {j:>6g}  not run: {table[a]['peer']} is full participation only here "
              "(PFLlib defect 7: serverpac.py indexes the round's uploads by client id)")
    print("settings matched: data, partition, standardization, model layers" + (
          ", initial model" if shared == set(algorithms) else "") + ", plain SGD lr, batch, epochs, rounds, "
          "cohort size (each tool draws its own cohorts); method constants: " + "; ".join(
              f"{a} {_constants(table[a])}" for a in algorithms))
    print("not matched:")
    own = [a for a in algorithms if a not in shared]
    common = common_unmatched[:1] + ((f"{common_unmatched[1]} ({', '.join(own)})",) if own else ())
    for line in common + tuple(table[a]["unmatched"] for a in algorithms if "unmatched" in table[a]):
        print(f"  - {line}")
    if args.json:
        pathlib.Path(args.json).write_text(json.dumps({"peer": version, "rounds": args.rounds, "seeds": seeds,
                                                       "participation": joins,
                                                       "bound": args.bound, "tolerance": args.tolerance,
                                                       "rows": rows}, indent=1))
    print("every row agrees: no mean gap above the bound, no systematic gap above the tolerance" if not misses else
          f"{len(misses)} row(s) fail the paired verdict (miss: |mean gap| > {args.bound:g} points; gap: its 95 % "
          f"interval excludes 0 and |mean gap| > {args.tolerance:g}): {', '.join(misses)}")
    return 1 if misses else 0


# ----------------------------------------------------------------------------- children: one framework each


def load_export(work) -> tuple:
    """(x, y, partition) that :func:`_export` wrote to ``work``, for a child process (one torch thread)."""
    import pickle

    import numpy as np
    import torch

    torch.set_num_threads(1)
    work = pathlib.Path(work)
    with np.load(work / "pflx.npz") as f:
        x, y = f["x"], f["y"]
    with open(work / "partition.pkl", "rb") as f:
        part = pickle.load(f)
    return x, y, part


def _child_pflx(args) -> float:
    from pfl_cli.fl.api import train_federated

    x, y, part = load_export(args.work)
    run = train_federated(x, y, 10, part, _pflx_config(args.algorithm, args.rounds, args.seed,
                                                        cohort_size(args.join, part.num_clients), args.peer))
    return run.outcome.best.summaries()["train"]["pooled_accuracy"]


def _pflx_config(algorithm: str, rounds: int, seed: int, cohort: int | None = None, peer: str = "pfllib"):
    """pflx's TrainConfig for one run: the matched settings, then the method's row of ``peer``'s table
    (:func:`_table`); ``cohort`` clients a round (None: every client, PFLlib's ``-jr 1``)."""
    from pfl_cli.registry import train_config

    spec = _table(peer, rounds)[algorithm]
    keys = dict(rounds=rounds, clients_per_round=cohort, local_epochs=1, batch_size=BATCH, lr=LR, momentum=0.0,
                client_clip=0.0, model_arch="mlp", mlp_hidden=(HIDDEN,), eval_every=rounds, val_fraction=0.0,
                normalize=False, seed=seed, device="cpu")
    keys.update(spec["pflx"])
    # a key the method declares inert (it has no effect there, and pflx refuses it: Per-FedAvg's and pFedMe's
    # momentum and clipping) is left out; the method then runs as the row says
    from pfl_cli.registry import entries

    for k in getattr(entries()[algorithm].algorithm, "inert_keys", {}):
        keys.pop(k, None)
    # None in a method's row means "leave this key at the method's default" (FedRep's local_epochs); the
    # benchmark's own None (clients_per_round: every client every round, as PFLlib's -jr 1) must stay.
    return train_config(algorithm, **{k: v for k, v in keys.items() if v is not None or k not in spec["pflx"]})


def _initial_model_file(algorithm: str, seed: int) -> str:
    return f"init-{algorithm}-{seed}.pt"


def _write_initial_model(work: pathlib.Path, algorithm: str, rounds: int, seed: int,
                         peer: str = "pfllib") -> dict:
    """pflx's initial model for this run (its global model before round 1) under the peer MLP's names,
    written where the PFLlib child loads it. ValueError for a method whose model is more than the MLP."""
    import pickle

    import numpy as np
    import torch

    from pfl_cli.fl.api import make_algorithm
    from pfl_cli.fl.store import build_store
    from pfl_cli.rng import make_rng

    cfg = _pflx_config(algorithm, rounds, seed, peer=peer)
    with np.load(work / "pflx.npz") as f:
        x, y = f["x"], f["y"]
    with open(work / "partition.pkl", "rb") as f:
        part = pickle.load(f)
    store = build_store(x, y, 10, part, val_fraction=cfg.val_fraction, rng=make_rng(seed, "validation-split"),
                        device=torch.device("cpu"), normalize=cfg.normalize)
    alg = make_algorithm(cfg, store)
    start = getattr(alg, "global_params", None)
    if start is not None and start and all(k.startswith("net.") for k in start):
        # the MLP inside a method's wrapper (FedRoD's generic predictor beside its personalized head, FedDBE's and
        # FedPAC's nets): the global model is still the MLP, so PFLlib can start from it; what the wrapper adds
        # per client is each tool's own (FedRoD's head starts as the classifier's copy in both: clientrod.py:15)
        start = {k[len("net."):]: v for k, v in start.items()}
    names = {"fc1.weight": "fc1.weight", "fc1.bias": "fc1.bias", "fc2.weight": "fc.weight", "fc2.bias": "fc.bias",
             "bn1.weight": "bn1.weight", "bn1.bias": "bn1.bias"}
    if start is None or not set(start) <= set(names) or not {"fc1.weight", "fc2.weight"} <= set(start):
        raise ValueError(f"--shared-init: {algorithm}'s pflx model is not the benchmark's MLP alone "
                         f"(parameters {sorted(start) if start is not None else 'not one global model'}); "
                         "run it without --shared-init")
    peer = {names[k]: v.detach().cpu().clone() for k, v in start.items()}
    torch.save(peer, work / _initial_model_file(algorithm, seed))
    return peer


def _share_initial_models(work: pathlib.Path, algorithms: list, rounds: int, seeds: list, init: str,
                          peer: str = "pfllib") -> set:
    """Write pflx's initial model of every seed for the methods that start PFLlib from it; their names.

    ``shared``: every method or a ValueError naming the first that cannot; ``auto``: those that can;
    ``own``: none."""
    shared = set()
    for a in algorithms if init != "own" else ():
        try:
            for s in seeds:
                _write_initial_model(work, a, rounds, s, peer)
            shared.add(a)
        except ValueError:
            if init == "shared":
                raise
    return shared


def _constants(row: dict) -> str:
    """A row's method constants as the peer is given them: PFLlib's flags, fluke's client and server keys."""
    if "flags" in row:
        return " ".join(row["flags"]) or "(none)"
    keys = [f"client.{k}={v}" for k, v in row["client"].items()] + [f"server.{k}={v}" for k, v in row["server"].items()]
    return " ".join(keys) or "(none)"


def _cohort_words(joins: list, clients: int) -> str:
    return ", ".join("every client every round" if cohort_size(j, clients) is None else
                     f"{cohort_size(j, clients)} of {clients} drawn each round (join {j:g})" for j in joins)


def _init_words(init: str, shared: set, algorithms: list) -> str:
    if init == "own" or not shared:
        return "each tool its own draw"
    own = [a for a in algorithms if a not in shared]
    return "shared (pflx draws it)" + (f"; each tool its own draw for {', '.join(own)} (more than the MLP)"
                                       if own else "")


def _peer_args(pfllib_main: pathlib.Path, argv: list[str]):
    """PFLlib's own argument namespace: the parser its ``main.py`` builds, read from that file."""
    source = pfllib_main.read_text()
    start = source.rindex("\n", 0, source.index("parser = argparse.ArgumentParser()")) + 1
    end = source.index("args = parser.parse_args()")
    scope = {"argparse": argparse}
    exec(compile(textwrap.dedent(source[start:end]), str(pfllib_main), "exec"), scope)  # the parser's add_argument calls only
    return scope["parser"].parse_args(argv)


def _child_pfllib(args) -> float:
    import contextlib
    import importlib
    import random

    import numpy as np
    import torch
    from torch import nn

    torch.set_num_threads(1)
    spec = _algorithms(args.rounds)[args.algorithm]
    system = next(pathlib.Path(p) for p in sys.path if (pathlib.Path(p) / "flcore").is_dir())
    peer = _peer_args(system / "main.py", [
        "-data", DATASET, "-ncl", "10", "-m", "MLP", "-algo", spec["peer"], "-gr", str(args.rounds),
        "-eg", str(args.rounds), "-lbs", str(BATCH), "-lr", str(LR), "-ls", "1", "-nc", str(_clients(args.work)),
        "-jr", repr(args.join), "-dev", "cpu", "-fd", str(HIDDEN), *spec["flags"]])

    torch.manual_seed(args.seed)
    with np.load(pathlib.Path(args.work) / "pflx.npz") as f:
        features = int(np.prod(f["x"].shape[1:]))
    model = _peer_mlp_class()(features, spec.get("bn", False))
    shared = pathlib.Path(args.work) / _initial_model_file(args.algorithm, args.seed)
    if shared.exists():  # --shared-init: pflx's initial model of this seed, under the peer's names
        missing, unexpected = model.load_state_dict(torch.load(shared), strict=False)
        if unexpected or any(not k.startswith("bn1.") for k in missing):  # only BatchNorm's buffers keep theirs
            raise RuntimeError(f"--shared-init: {shared.name} does not fit the peer's MLP: missing {missing}, "
                               f"unexpected {unexpected}")
    if spec.get("split"):  # what PFLlib's main.py does for this method
        models = importlib.import_module("flcore.trainmodel.models")
        head = model.fc
        model.fc = nn.Identity()
        model = models.BaseHeadSplit(model, head)
    peer.model = model
    if spec.get("unalias"):
        _score_pfedme_personalized()
    module = importlib.import_module(f"flcore.servers.server{_SERVER_FILE.get(spec['peer'], spec['peer'].lower())}")
    cls = getattr(module, _SERVER_CLASS.get(spec["peer"], spec["peer"]))
    for name in spec.get("stub", ()):  # a method the peer's server calls but PFLlib does not define (FedAS)
        if not hasattr(cls, name):
            setattr(cls, name, lambda self: None)
    with contextlib.redirect_stdout(sys.stderr):  # PFLlib prints every evaluation; the result line is ours
        server = cls(peer, 0)
        torch.manual_seed(args.seed)  # every PFLlib client's constructor seeded torch with 0
        np.random.seed(args.seed)
        random.seed(args.seed)
        server.train()
    return float(getattr(server, spec.get("acc", "rs_test_acc"))[-1])


EXTRA = {}  # a child's further figures, printed beside its accuracy (fluke's own, where its row scores another model)


def _score_pfedme_personalized():
    """Make PFLlib's pFedMe score its personalized models, not its global one (defect 1 in the docs).

    PFLlib's inner optimizer returns the model's own parameter objects, which the client stores as
    its personalized parameters; the client then writes its local model, and the next round the
    global model, into those same tensors, so its "personalized" evaluation scores the global model.
    Here the inner step returns copies (the last theta~ of the round survives, pFedMe's personalized
    model), and the personalized evaluations, which load theta~ into the model, put the model's
    own parameters back afterwards: training then starts from the global model, as it does unpatched.
    Nothing else of the method changes.
    """
    from flcore.clients.clientpFedMe import clientpFedMe
    from flcore.optimizers.fedoptimizer import pFedMeOptimizer

    step = pFedMeOptimizer.step
    pFedMeOptimizer.step = lambda self, *a, **k: [p.detach().clone() for p in step(self, *a, **k)]
    for name in ("test_metrics_personalized", "train_metrics_personalized"):
        def kept(self, _score=getattr(clientpFedMe, name)):
            own = [p.data for p in self.model.parameters()]
            try:
                return _score(self)
            finally:
                for p, data in zip(self.model.parameters(), own):
                    p.data = data
        setattr(clientpFedMe, name, kept)


def _peer_mlp_class():
    """pflx's ``mlp`` (and ``mlp-bn``) for PFLlib: fc1 (-> bn1) -> relu -> fc, logits out. A module-level name
    (``__main__.MLP``), since PFLlib pickles the whole global model at the end of a run."""
    import torch
    from torch import nn
    import torch.nn.functional as F

    class MLP(nn.Module):
        def __init__(self, features: int, bn: bool):
            super().__init__()
            self.fc1 = nn.Linear(features, HIDDEN)
            self.bn1 = nn.BatchNorm1d(HIDDEN) if bn else nn.Identity()
            self.fc = nn.Linear(HIDDEN, 10)

        def forward(self, x):
            return self.fc(F.relu(self.bn1(self.fc1(torch.flatten(x, 1)))))

    MLP.__qualname__ = "MLP"
    globals()["MLP"] = MLP
    return MLP


_SERVER_FILE = {"PerAvg": "peravg", "pFedMe": "pFedMe", "LG-FedAvg": "lg", "FedROD": "rod", "FedBABU": "babu",
                "FedBN": "bn", "FedALA": "ala", "FedDBE": "dbe", "FedRep": "rep", "FedPer": "per", "FedProx": "prox",
                "FedAvg": "avg", "FedPAC": "pac", "FedCP": "cp", "FedAS": "as", "FedProto": "proto", "FedAMP": "amp",
                "FedFomo": "fomo", "FedLC": "lc", "SCAFFOLD": "scaffold", "FedDyn": "dyn", "MOON": "moon"}
_SERVER_CLASS = {"LG-FedAvg": "LG_FedAvg"}


def _clients(work: str) -> int:
    return len(list((pathlib.Path(work) / "dataset" / DATASET / "train").glob("*.npz")))


if __name__ == "__main__":
    sys.exit(main())
