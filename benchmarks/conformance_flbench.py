"""Benchmark: pFedLA trained by pflx and by FL-bench itself on conformance.py's clients, side by side (issue 39).

pFedLA (Ma et al., CVPR 2022) is in neither PFLlib nor fluke; its peer is FL-bench
(KarhouTam/FL-bench, ``src/server/pfedla.py``). The clients are ``benchmarks/conformance.py``'s
(``_export``: the ring, ``--clients`` 20 clients, pathological two classes a client, 75/25
train/test within each client, every train split cut to whole batches, standardized with the
train pool's statistics). :func:`write_flbench_layout` writes them in FL-bench's own data layout,
the one its ``generate_data.py`` writes and its ``FedAvgServer.__init__`` reads: a folder
``data/<name>/`` beside FL-bench's ``src/`` holding ``partition.pkl`` (``{"separation": {"train",
"val", "test", "total"}, "data_indices": [{"train", "val", "test"}, ...]}``, indices into one pooled
array, the ``split == "sample"`` separation: every client trains and tests), ``args.json`` (what
``prune_args`` writes) and the pooled arrays (``data.npy``, ``targets.npy``, as its ``Synthetic``
dataset reads them). FL-bench finds ``data/`` from the location of its ``src/utils/constants.py``,
so the layout is a folder of links to FL-bench's ``main.py``, ``config/``, ``src/`` and
``data/utils/`` with the exported ``data/<name>/`` beside them; nothing of FL-bench is copied.

The FL-bench run (``--child flbench``, run by FL-bench's Python, ``--python``, ``$FLBENCH_PYTHON``
or ``.venv-flbench/bin/python``, in that folder) registers two things where FL-bench registers
its own: the benchmark's MLP (features-100-10, ReLU, PyTorch's default initialization drawn from
FL-bench's seed; FL-bench's ``DecoupledModel`` with ``base`` = the hidden layer and ``classifier``
= the output layer) in ``src.utils.models.MODELS``, and the exported arrays as a dataset in
``data.utils.datasets.DATASETS`` (a ``BaseDataset`` that leaves the arrays as they are:
FL-bench's ``BaseDataset._rescale_data`` divides any data whose maximum exceeds 1 by 255, which
would shrink standardized features 255-fold). It then calls FL-bench's own entry point,
``main.main`` (Hydra, ``config/defaults.yaml``), with the matched settings as Hydra overrides
(:func:`flbench_overrides`: method pfedla, SGD lr 0.05 without momentum or weight decay, batch 10,
one local epoch, ``--rounds`` global epochs, join ratio 1, serial mode on the CPU, the client test
at the last round only) and ``pfedla.hn_lr``; the figure is FL-bench's own client test at the
last round (``test_results[rounds]["all_clients"]["before"]["test"]``: the pooled accuracy of the
20 clients' test splits, what pflx's figure is).

pflx's run (``--child pflx``) is ``benchmarks/pfedla_hn_lr.py``'s config: the conformance
settings with ``pfedla_hn_lr``. Both tools run each hypernetwork step size of ``--hn-lrs``
(default FL-bench's 5e-3 and pflx's 100), each in its own direction (pflx's descent on
1/2 ||theta' - theta_bar||^2; FL-bench's ``grad_outputs = -diff``, the opposite; see
docs/performance/conformance.md), for each of ``--seeds``; each tool draws its own initial model
(FL-bench gives every client its own full copy of the model, ``all_model_params_personalized``,
and its ``external_model_weights_path`` does not apply there). Rows: each step size matched, and
the defaults (pflx at 100 against FL-bench at 5e-3), each with conformance.py's paired verdict
(mean gap over seeds, its 95 % interval, ``miss`` / ``gap`` / ``ok``). Exit 1 when a row fails,
0 when all agree, 0 with a line saying why when FL-bench or its Python is not found.

    python benchmarks/conformance_flbench.py --flbench /path/to/FL-bench --python /path/to/venv/bin/python
        [--rounds 50] [--seeds 0,1,2] [--hn-lrs 0.005,100] [--jobs 1] [--peer-cache FILE] [--json FILE]
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
import time
from concurrent.futures import ThreadPoolExecutor

HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import conformance  # noqa: E402  (the same export, matched settings and verdict)

NAME = "pflxexport"  # the dataset's name in FL-bench's registry and its data/ folder
FLBENCH_HN_LR, PFLX_HN_LR = 5e-3, 100.0  # FL-bench's pfedla.hn_lr default (src/server/pfedla.py), pflx's
PEER_MODULES = ("torch", "torchvision", "hydra", "omegaconf", "ray", "rich", "sklearn", "pandas", "pynvml", "PIL")


# ----------------------------------------------------------------------------- peer-free parts (tested)


def flbench_partition(part) -> dict:
    """pflx's partition as FL-bench's ``partition.pkl``: ``separation`` (every client trains and tests, FL-bench's
    ``split == "sample"``) and each client's ``data_indices`` into the pooled arrays (its ``val`` empty, as pflx's
    conformance runs hold none out)."""
    clients = list(range(part.num_clients))
    indices = []
    for i in clients:
        train = part.train_indices[part.train_offsets[i]:part.train_offsets[i + 1]]
        test = part.test_indices[part.test_offsets[i]:part.test_offsets[i + 1]]
        indices.append({"train": [int(j) for j in train], "val": [], "test": [int(j) for j in test]})
    return {"separation": {"train": clients, "val": clients, "test": clients, "total": part.num_clients},
            "data_indices": indices}


def write_flbench_layout(work: pathlib.Path, flbench: pathlib.Path) -> pathlib.Path:
    """FL-bench's root for this run, ``work/flbench``: links to the checkout's ``main.py``, ``config/``, ``src/`` and
    ``data/utils/``, and ``data/<NAME>/`` holding the export of :func:`conformance._export` (already in ``work``) in
    FL-bench's layout."""
    import pickle

    import numpy as np

    root = work / "flbench"
    (root / "data" / NAME).mkdir(parents=True)
    for name in ("main.py", "config", "src"):
        (root / name).symlink_to(flbench.resolve() / name)
    (root / "data" / "utils").symlink_to(flbench.resolve() / "data" / "utils")
    x, y, part = conformance.load_export(work)
    np.save(root / "data" / NAME / "data.npy", x.astype(np.float32))
    np.save(root / "data" / NAME / "targets.npy", y.astype(np.int64))
    with open(root / "data" / NAME / "partition.pkl", "wb") as f:
        pickle.dump(flbench_partition(part), f)
    (root / "data" / NAME / "args.json").write_text(json.dumps({
        "client_num": part.num_clients, "test_ratio": 0.0, "val_ratio": 0.0, "seed": 0, "split": "sample",
        "IID_ratio": 0.0, "monitor_window_name_suffix": f"{NAME}-{part.num_clients}clients"}, indent=1))
    return root


def flbench_overrides(seed: int, rounds: int, hn_lr: float) -> list[str]:
    """FL-bench's Hydra overrides for one run at the conformance settings (config/defaults.yaml's keys; its
    ``main.py`` adds the run's output folder, ``./out/...`` under the layout)."""
    return ["method=pfedla", f"dataset.name={NAME}", "model.name=pflx_mlp",
            "model.use_torchvision_pretrained_weights=false",
            "optimizer.name=sgd", f"optimizer.lr={conformance.LR}", "optimizer.momentum=0",
            "optimizer.weight_decay=0", "mode=serial", f"common.seed={seed}", "common.join_ratio=1",
            f"common.global_epoch={rounds}", "common.local_epoch=1", f"common.batch_size={conformance.BATCH}",
            "common.use_cuda=false", "common.client_side_evaluation=false",
            f"common.test.client.interval={rounds}", "common.test.server.interval=-1",
            f"common.verbose_gap={rounds}", "common.save_log=false", "common.save_model=false",
            "common.save_learning_curve_plot=false", "common.save_metrics=false", "common.monitor=null",
            f"+pfedla.hn_lr={hn_lr!r}"]


def rows(results: dict, seeds: list, hn_lrs: list, *, bound: float, tolerance: float) -> list[dict]:
    """The compared rows from ``results[(tool, hn_lr, seed)]`` (accuracy in points): each step size matched, then
    the defaults (pflx's ``PFLX_HN_LR`` against FL-bench's ``FLBENCH_HN_LR``) when both were run."""
    pairs = [(f"hn_lr {lr:g} both", lr, lr) for lr in hn_lrs]
    if PFLX_HN_LR in hn_lrs and FLBENCH_HN_LR in hn_lrs:
        pairs.append((f"defaults (pflx {PFLX_HN_LR:g}, FL-bench {FLBENCH_HN_LR:g})", PFLX_HN_LR, FLBENCH_HN_LR))
    out = []
    for label, mine, theirs in pairs:
        pflx = [results[("pflx", mine, s)] for s in seeds]
        peer = [results[("flbench", theirs, s)] for s in seeds]
        out.append({"row": label, "pflx_hn_lr": mine, "flbench_hn_lr": theirs, "pflx": pflx, "flbench": peer,
                    **conformance.paired_verdict(pflx, peer, bound=bound, tolerance=tolerance)})
    return out


# ----------------------------------------------------------------------------- locating the peer


def find_flbench(arg: str | None) -> tuple[pathlib.Path | None, str]:
    given = arg or os.environ.get("FLBENCH_DIR")
    cand = pathlib.Path(given) if given else conformance.ROOT / ".venv-flbench" / "FL-bench"
    if (cand / "src" / "server" / "pfedla.py").is_file() and (cand / "data" / "utils" / "datasets.py").is_file():
        return cand.resolve(), ""
    return None, (f"{cand} is not an FL-bench checkout (no src/server/pfedla.py and data/utils/datasets.py)"
                  if given else "FL-bench not found (give --flbench DIR or FLBENCH_DIR, or put a checkout at "
                  ".venv-flbench/FL-bench)")


def find_python(arg: str | None) -> tuple[str | None, str]:
    for cand in (arg, os.environ.get("FLBENCH_PYTHON"), str(conformance.ROOT / ".venv-flbench" / "bin" / "python")):
        if cand and pathlib.Path(cand).exists():
            missing = [m for m in _missing(os.path.abspath(cand)) if m]
            if missing:
                return None, f"{cand} lacks {', '.join(missing)}, which FL-bench imports"
            return os.path.abspath(cand), ""
    return None, "FL-bench's Python not found (give --python, FLBENCH_PYTHON, or .venv-flbench/bin/python)"


def _missing(python: str) -> list[str]:
    code = ("import importlib.util, sys; print(','.join(m for m in sys.argv[1:] "
            "if importlib.util.find_spec(m) is None))")
    out = subprocess.run([python, "-c", code, *PEER_MODULES], capture_output=True, text=True)
    return out.stdout.strip().split(",") if out.returncode == 0 else list(PEER_MODULES)


def _version(flbench: pathlib.Path) -> str:
    out = subprocess.run(["git", "-C", str(flbench), "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
    return out.stdout.strip() if out.returncode == 0 and out.stdout.strip() else "a snapshot (no git metadata)"


# ----------------------------------------------------------------------------- children: one tool each


def _child_pflx(args) -> float:
    import pfedla_hn_lr
    from pfl_cli.fl.api import train_federated

    x, y, part = conformance.load_export(args.work)
    run = train_federated(x, y, 10, part, pfedla_hn_lr.signed_config(args.rounds, args.seed, args.hn_lr))
    return run.outcome.best.summaries()["train"]["pooled_accuracy"]


def _without_torchvision_ops() -> None:
    """The registry's torchvision wheels are CUDA builds whose ``_C.so`` does not load beside the CPU torch
    (conformance_fluke.py says the same), and ``import torchvision`` then fails in ``_meta_registrations`` (fake
    kernels for its detection operators, ``torchvision::nms`` and the like). FL-bench imports torchvision's
    ``transforms``, ``models`` and ``io`` (pure Python; the benchmark's MLP calls none of its compiled operators),
    so that one module is left out: an empty stand-in in ``sys.modules``."""
    import types

    sys.modules.setdefault("torchvision._meta_registrations", types.ModuleType("torchvision._meta_registrations"))


def _child_flbench(args) -> float:
    """FL-bench's pFedLA through its own ``main.main``, in the layout's folder (the working directory)."""
    import numpy as np
    import torch
    from torch import nn

    torch.set_num_threads(1)
    _without_torchvision_ops()
    root = pathlib.Path.cwd()
    sys.path.insert(0, str(root))
    from data.utils.datasets import DATASETS, BaseDataset
    from src.server.pfedla import pFedLAServer
    from src.utils.models import MODELS, DecoupledModel

    data = np.load(root / "data" / NAME / "data.npy")
    targets = np.load(root / "data" / NAME / "targets.npy")
    features = int(np.prod(data.shape[1:]))

    class Export(BaseDataset):
        def __init__(self, root, args=None, **transforms):
            super().__init__(data=torch.from_numpy(data), targets=torch.from_numpy(targets),
                             classes=sorted(np.unique(targets).tolist()), **transforms)

        def _rescale_data(self):  # standardized features: FL-bench's /255 for max > 1 does not apply
            pass

    class MLP(DecoupledModel):
        def __init__(self, dataset=None, pretrained=False):
            super().__init__()
            self.base = nn.Sequential(nn.Linear(features, conformance.HIDDEN), nn.ReLU())
            self.classifier = nn.Linear(conformance.HIDDEN, 10)

    DATASETS[NAME] = Export
    MODELS["pflx_mlp"] = MLP
    seen = {}
    run_experiment = pFedLAServer.run_experiment

    def kept(self):
        seen["server"] = self
        return run_experiment(self)

    pFedLAServer.run_experiment = kept
    sys.argv = [str(root / "main.py"), *flbench_overrides(args.seed, args.rounds, args.hn_lr)]
    import runpy

    runpy.run_path(str(root / "main.py"), run_name="__main__")  # FL-bench's entry point, as `python main.py ...`
    server = seen["server"]
    assert server.args.pfedla.hn_lr == args.hn_lr and server.args.optimizer.lr == conformance.LR
    metrics = server.test_results[args.rounds]["all_clients"]["before"]["test"]
    return metrics.accuracy / 100


# ----------------------------------------------------------------------------- parent


def _run(tool: str, hn_lr: float, seed: int, args, work: pathlib.Path, layout: pathlib.Path, python: str) -> dict:
    cmd = [str(pathlib.Path(__file__).resolve()), "--child", tool, "--seed", str(seed), "--rounds", str(args.rounds),
           "--work", str(work), "--hn-lr", repr(hn_lr)]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
    if tool == "pflx":
        env["PYTHONPATH"] = str(conformance.ROOT)
        proc = subprocess.run([sys.executable, *cmd], capture_output=True, text=True, env=env)
    else:
        env["PYTHONPATH"] = str(HERE)
        proc = subprocess.run([python, *cmd], capture_output=True, text=True, env=env, cwd=layout)
    if proc.returncode != 0:
        raise RuntimeError(f"{tool} pfedla hn_lr {hn_lr:g} seed {seed} exited {proc.returncode}: "
                           f"{' | '.join(proc.stderr.strip().splitlines()[-4:])}")
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    print(f"  {tool} pfedla hn_lr {hn_lr:g} seed {seed}: {100 * result['accuracy']:.2f} % in "
          f"{result['seconds']:.0f} s", file=sys.stderr, flush=True)
    return result


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--flbench", help="an FL-bench checkout (default: $FLBENCH_DIR, then .venv-flbench/FL-bench)")
    ap.add_argument("--python", help="FL-bench's Python (default: $FLBENCH_PYTHON, then .venv-flbench/bin/python)")
    ap.add_argument("--rounds", type=int, default=50)
    ap.add_argument("--seeds", default="0,1,2", help="three or more: the paired verdict's t-interval needs them")
    ap.add_argument("--hn-lrs", default=f"{FLBENCH_HN_LR:g},{PFLX_HN_LR:g}",
                    help="hypernetwork step sizes, each run by both tools in their own direction (default: "
                    "FL-bench's 0.005 and pflx's 100)")
    ap.add_argument("--bound", type=float, default=conformance.BOUND)
    ap.add_argument("--tolerance", type=float, default=conformance.TOLERANCE)
    ap.add_argument("--clients", type=int, default=20)
    ap.add_argument("--dataset", default=conformance.DEFAULT_DATASET)
    ap.add_argument("--jobs", type=int, default=1)
    ap.add_argument("--json", help="also write the rows here")
    ap.add_argument("--peer-cache", help="a JSON file of FL-bench's results: runs found there (same FL-bench "
                    "version, data, rounds, step size and seed) are read, not rerun; new ones are added")
    ap.add_argument("--child", choices=("pflx", "flbench"), help=argparse.SUPPRESS)
    ap.add_argument("--seed", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--work", help=argparse.SUPPRESS)
    ap.add_argument("--hn-lr", type=float, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child:
        t = time.perf_counter()
        acc = (_child_pflx if args.child == "pflx" else _child_flbench)(args)
        print(json.dumps({"accuracy": acc, "seconds": time.perf_counter() - t}))
        return 0
    try:
        seeds = [int(s) for s in args.seeds.split(",") if s]
        hn_lrs = [float(v) for v in args.hn_lrs.split(",") if v]
    except ValueError:
        seeds, hn_lrs = [], []
    if (len(set(seeds)) < 3 or len(set(seeds)) != len(seeds) or not hn_lrs or any(not v > 0 for v in hn_lrs)
            or args.rounds < 1 or args.clients < 2 or args.jobs < 1 or not 0 <= args.tolerance <= args.bound):
        print(f"conformance_flbench.py: --seeds must list three or more distinct integers, --hn-lrs numbers > 0, "
              f"--rounds, --clients (>= 2) and --jobs be positive, 0 <= --tolerance <= --bound; got --seeds "
              f"{args.seeds!r}, --hn-lrs {args.hn_lrs!r}", file=sys.stderr)
        return 2
    flbench, why = find_flbench(args.flbench)
    python, why_python = find_python(args.python) if flbench is not None else (None, "")
    if flbench is None or python is None:
        print(f"conformance_flbench.py: skipped: {why or why_python}; see docs/performance/conformance.md")
        return 0
    version = f"FL-bench {_version(flbench)}"
    with tempfile.TemporaryDirectory(prefix="pflx-conformance-flbench-") as tmp:
        work = pathlib.Path(tmp)
        data = conformance._export(work, args.dataset, args.clients, 0)
        layout = write_flbench_layout(work, flbench)
        print(f"{version} at {flbench} ({python}); {args.dataset}, pathological 2 classes a client, "
              f"{data['clients']} clients ({data['train']} train / {data['test']} test samples), standardized; "
              f"pFedLA, MLP {data['features']}-{conformance.HIDDEN}-10, SGD lr {conformance.LR}, batch "
              f"{conformance.BATCH}, 1 local epoch, {args.rounds} rounds, every client every round; seeds "
              f"{args.seeds}; hypernetwork step sizes {args.hn_lrs}, each tool its own direction and initial draw",
              flush=True)
        cache = conformance.PeerCache(args.peer_cache, f"{version}|{args.dataset}|{args.clients}|{args.rounds}")
        jobs = [(tool, lr, s) for lr in hn_lrs for s in seeds for tool in ("pflx", "flbench")]

        def run(job):
            tool, lr, s = job
            if tool == "flbench":
                key = cache.key(f"pfedla@{lr!r}", 1.0, s, work / "none")
                if key in cache:
                    return cache[key]
                return cache.add(key, _run(*job, args, work, layout, python))
            return _run(*job, args, work, layout, python)

        with ThreadPoolExecutor(args.jobs) as pool:
            results = dict(zip(jobs, pool.map(run, jobs)))
    acc = {job: 100 * r["accuracy"] for job, r in results.items()}
    secs = {tool: statistics.mean(r["seconds"] for (t, _, _), r in results.items() if t == tool)
            for tool in ("pflx", "flbench")}
    table = rows(acc, seeds, hn_lrs, bound=args.bound, tolerance=args.tolerance)
    print(f"{'pFedLA':<36} {'pflx %':>7} {'FL-bench %':>10} {'diff':>6} {'95 % interval':>16}  verdict   "
          "per seed pflx / FL-bench")
    for r in table:
        per_seed = ", ".join(f"{p:.2f}/{q:.2f}" for p, q in zip(r["pflx"], r["flbench"]))
        print(f"{r['row']:<36} {statistics.mean(r['pflx']):>7.2f} {statistics.mean(r['flbench']):>10.2f} "
              f"{r['mean']:>+6.2f} {'[%+.2f, %+.2f]' % (r['low'], r['high']):>16}  {r['verdict']:<8}  {per_seed}")
    print(f"seconds a run (mean): pflx {secs['pflx']:.1f}, FL-bench {secs['flbench']:.1f}")
    if args.json:
        pathlib.Path(args.json).write_text(json.dumps({"peer": version, "rounds": args.rounds, "seeds": seeds,
                                                       "hn_lrs": hn_lrs, "rows": table,
                                                       "seconds": secs}, indent=1))
    misses = [r["row"] for r in table if r["verdict"] != "ok"]
    print("every row agrees" if not misses else f"{len(misses)} row(s) fail the paired verdict: {', '.join(misses)}")
    return 1 if misses else 0


if __name__ == "__main__":
    sys.exit(main())
