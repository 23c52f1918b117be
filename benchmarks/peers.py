"""Benchmark: pflx against the simulators people would pick instead, on the same clients, model and steps.

For each workload every framework trains the same synthetic CIFAR-shaped clients (uint8
images 3x32x32, 10 classes, ``--clients`` clients of ``--samples`` each, all joining every
round) with the same model, one local epoch of plain SGD (no momentum, no clipping) in
batches of ``--batch``, FedAvg's data-size-weighted mean on the server:

- ``fedavg-mlp``: MLP 3072-100-10 (308,310 parameters);
- ``fedavg-cnn``: LeNet 3-16-32 conv + 800-120-84-10 (121,182 parameters, pflx's ``lenet``);
- ``fedprox-mlp``: FedProx (mu = 0.01), the baseline both peers ship; the proximal term is
  part of each local step.

Peers (the optional ``bench`` extra; nothing is installed at run time): Apple's pfl-research
(``pfl``) with its ``SimulatedBackend`` and ``PyTorchModel``, and Flower's simulation engine
(``flwr[simulation]``: ``run_simulation`` on Ray with one 1-CPU actor, Flower's ``FedAvg`` /
``FedProx`` strategies, a ``ClientApp`` training the same torch net). Each framework runs in its
own process tree (so peak memory is its own), ``--repeats`` times, alternating the order; the
table prints the median seconds per round (wall, and CPU seconds of the process tree, which a
loaded machine distorts less), peak RSS, the start-up time (process start to the first round's
start, and data loading apart), the load average each run saw, and pflx's ratio. It exits 1
where pflx is slower per round (CPU time) or uses more peak memory than a peer, 0 when every
row holds, and 0 with a notice when no peer is installed.

Every framework holds the same bytes: the uint8 images, standardized batch by batch with the
train pool's per-channel mean and std (pflx's own data path; the peers' loss functions do the same
conversion on each batch they are handed), so the memory verdict compares like with like. The
learning rate is per workload (``LR``): 0.005 trains the MLP to full train accuracy in the timed
rounds, while LeNet under plain SGD needs 0.1 to leave the 10 % plateau within four rounds, so the
accuracy column says whether each framework learns. What differs, by design of each tool (printed
under the table): pflx trains all clients of a round at once (stacked parameters,
``cohort_exec=auto``); the peers one after another. Neither peer ships a
personalized algorithm pflx has (pfl-research: Reptile only, no hypernetwork; Flower: none in the
package), so the baseline row is FedProx, which both ship.

Timing repeated runs: an identical ``pflx train`` re-run with the same ``--out`` is a no-op
(the artifact contract), which times nothing. This benchmark calls the library in a fresh
process each time; to time the command line, give each run a fresh ``--out`` or pass
``--force``.

    python benchmarks/peers.py [--workloads fedavg-mlp,fedavg-cnn,fedprox-mlp] [--rounds 3] [--repeats 2]

The peers pin older versions of typer, dp-accounting and protobuf than pflx uses, so the
``bench`` extra goes into its own virtual environment (docs/performance/peers.md).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import pathlib
import statistics
import subprocess
import sys
import tempfile
import threading
import time

HERE = pathlib.Path(__file__).resolve().parent
WORKLOADS = ("fedavg-mlp", "fedavg-cnn", "fedprox-mlp")
PEERS = {"pfl-research": ("pfl",), "Flower": ("flwr", "ray")}  # framework -> modules that must be importable
PROX_MU = 0.01
LR = {"mlp": 0.005, "cnn": 0.1}  # per model: see the module docstring


# ----------------------------------------------------------------------------- parent: orchestration


def _tree(root: int) -> list[int]:
    """``root`` and all its living descendants, from /proc (a peer's worker processes count as its own)."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    ppid = int(f.read().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            children.setdefault(ppid, []).append(int(entry))
    found, todo = [], [root]
    while todo:
        pid = todo.pop()
        found.append(pid)
        todo.extend(children.get(pid, []))
    return found


def _tree_rss_kb(root: int) -> int:
    """Resident memory of ``root`` and all its descendants (kB), from /proc."""
    total = 0
    for pid in _tree(root):
        try:
            with open(f"/proc/{pid}/status") as f:
                total += next(int(line.split()[1]) for line in f if line.startswith("VmRSS:"))
        except (OSError, StopIteration):
            pass
    return total


def _tree_cpu_s(root: int | None = None) -> float:
    """User + system CPU seconds of ``root`` (default: this process) and its living descendants."""
    total = 0
    for pid in _tree(os.getpid() if root is None else root):
        try:
            with open(f"/proc/{pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            total += int(fields[11]) + int(fields[12])  # utime, stime (fields 14 and 15 of proc(5))
        except (OSError, IndexError, ValueError):
            pass
    return total / os.sysconf("SC_CLK_TCK")


def _run_child(framework: str, workload: str, args, data: str) -> dict:
    """One framework's run in its own process; its JSON result plus the peak RSS of its process tree."""
    cmd = [sys.executable, str(pathlib.Path(__file__).resolve()), "--child", framework, "--workload", workload,
           "--data", data, "--rounds", str(args.rounds), "--batch", str(args.batch), "--spawned", repr(time.time())]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "PYTHONPATH": str(HERE.parent)}
    load = os.getloadavg()[0]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    peak, done = [0], threading.Event()

    def sample():
        while not done.wait(0.05):
            peak[0] = max(peak[0], _tree_rss_kb(proc.pid))

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    out, err = proc.communicate()
    done.set()
    sampler.join()
    if proc.returncode != 0:
        raise RuntimeError(f"{framework} {workload} exited {proc.returncode}: {err.strip().splitlines()[-3:]}")
    result = json.loads(out.strip().splitlines()[-1])
    result["tree_rss_mb"] = peak[0] / 1024
    result["load"] = (load + os.getloadavg()[0]) / 2  # 1-minute load average at the run's start and end
    return result


def _make_data(path: pathlib.Path, clients: int, samples: int) -> None:
    import numpy as np

    rng = np.random.default_rng(0)
    n = clients * samples
    # Learnable, not noise: each class has its own mean image, so the runs also say whether a framework learns.
    y = rng.integers(0, 10, n)
    centres = rng.integers(0, 256, size=(10, 3, 32, 32))
    x = np.clip(centres[y] * 0.5 + rng.integers(0, 128, size=(n, 3, 32, 32)), 0, 255).astype(np.uint8)
    np.savez(path, x=x, y=y, clients=np.int64(clients))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workloads", default=",".join(WORKLOADS))
    ap.add_argument("--clients", type=int, default=50)
    ap.add_argument("--samples", type=int, default=1000, help="train samples per client")
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=3, help="timed rounds per run (after one warm-up round)")
    ap.add_argument("--repeats", type=int, default=2, help="runs per framework, alternating the order")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    ap.add_argument("--workload", help=argparse.SUPPRESS)
    ap.add_argument("--data", help=argparse.SUPPRESS)
    ap.add_argument("--spawned", type=float, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child:
        print(json.dumps(CHILDREN[args.child](args)))
        return 0
    workloads = [w for w in args.workloads.split(",") if w]
    unknown = [w for w in workloads if w not in WORKLOADS]
    if unknown:
        print(f"peers.py: --workloads must be among {', '.join(WORKLOADS)}; got {', '.join(unknown)}", file=sys.stderr)
        return 2
    peers = [p for p, modules in PEERS.items() if all(importlib.util.find_spec(m) is not None for m in modules)]
    if not peers:
        print("peers.py: skipped: no peer installed (the `bench` extra: pfl-research, flwr[simulation]); "
              "see docs/performance/peers.md for its virtual environment")
        return 0
    versions = {p: _version(PEERS[p][0]) for p in peers}
    print(f"peers: {', '.join(f'{p} {v}' for p, v in versions.items())}; torch {_version('torch')}; "
          f"{args.clients} clients x {args.samples} samples, batch {args.batch}, 1 local epoch, all clients "
          f"every round; CPU, 1 thread each; load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores")
    misses = 0
    with tempfile.TemporaryDirectory(prefix="pflx-peers-") as tmp:
        data = pathlib.Path(tmp) / "data.npz"
        _make_data(data, args.clients, args.samples)
        header = (f"{'workload':<12} {'framework':<13} {'s/round wall':>12} {'s/round CPU':>11} {'peak RSS MB':>11} "
                  f"{'start s':>7} {'data s':>6} {'acc':>5} {'load':>5}")
        print(header)
        for workload in workloads:
            runs: dict[str, list[dict]] = {f: [] for f in ["pflx", *peers]}
            order = ["pflx", *peers]
            for r in range(args.repeats):
                for framework in (order if r % 2 == 0 else order[::-1]):
                    runs[framework].append(_run_child(framework, workload, args, str(data)))
            figures = ("wall_per_round", "cpu_per_round", "tree_rss_mb", "start_s", "data_s", "accuracy", "load")
            med = {f: {k: statistics.median(run[k] for run in rs) for k in figures} for f, rs in runs.items()}
            for f, m in med.items():
                print(f"{workload:<12} {f:<13} {m['wall_per_round']:>12.2f} {m['cpu_per_round']:>11.2f} "
                      f"{m['tree_rss_mb']:>11.0f} {m['start_s']:>7.2f} {m['data_s']:>6.2f} {m['accuracy']:>5.2f} "
                      f"{m['load']:>5.1f}")
            for p in peers:
                speed = med[p]["cpu_per_round"] / med["pflx"]["cpu_per_round"]
                wall = med[p]["wall_per_round"] / med["pflx"]["wall_per_round"]
                memory = med["pflx"]["tree_rss_mb"] / med[p]["tree_rss_mb"]
                ok = speed >= 1.0 and memory <= 1.0
                misses += not ok
                print(f"  {workload} vs {p}: pflx speed-up {speed:.2f}x CPU ({wall:.2f}x wall), target >= 1x; "
                      f"peak memory pflx/peer {memory:.2f}, target <= 1; {'ok' if ok else 'MISS'}")
            print(f"  pflx first round starts {med['pflx']['start_s']:.2f} s after process start "
                  f"({med['pflx']['data_s']:.2f} s of it loading data), target ~2 s plus data loading")
    print("same data path: every framework holds the uint8 images and standardizes each batch with the train "
          "pool's per-channel statistics. Differences: pflx trains a round's clients at once (auto: client by client "
          "for this MLP and for convolutional nets on a CPU); the peers one after another. Flower: Ray with one "
          "1-CPU actor; its CPU and memory are its whole process tree's (driver, Ray's GCS and raylet, the worker). "
          "Accuracy is on the clients' own train data after the timed rounds.")
    print(f"{'every row met its target' if not misses else f'{misses} row(s) missed a target'}")
    return 1 if misses else 0


def _version(module: str) -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(module)
    except PackageNotFoundError:
        return "?"


# ----------------------------------------------------------------------------- children: one framework each


def _load(path: str):
    import numpy as np

    with np.load(path) as f:
        x, y, clients = f["x"], f["y"], int(f["clients"])
    return x, y, clients


def _lr(workload: str) -> float:
    return LR["cnn" if workload.endswith("cnn") else "mlp"]


def _pool_stats(x, chunk: int = 1000):
    """Per-channel mean and std of the uint8 pool, as pflx computes its train-pool statistics
    (``pfl_cli.fl.store.normalization_stats``: two passes with float64 accumulators), chunk by chunk so
    that no float copy of the pool adds to a peer's peak memory; shaped to broadcast over (B, C, H, W)."""
    import numpy as np

    chunks = [x[i:i + chunk] for i in range(0, len(x), chunk)]
    count = len(x) * x.shape[2] * x.shape[3]
    mean = sum(c.sum(axis=(0, 2, 3), dtype=np.float64) for c in chunks) / count
    centre = mean[None, :, None, None]
    var = sum(np.square(c - centre).sum(axis=(0, 2, 3)) for c in chunks) / count
    return (mean.astype(np.float32).reshape(1, -1, 1, 1), np.sqrt(var).astype(np.float32).reshape(1, -1, 1, 1))


def _standardize(xb, stats):
    """One batch of uint8 images -> float32, standardized: the conversion every framework does per batch."""
    import torch

    mean, std = stats
    return (torch.as_tensor(xb).to(torch.float32) - torch.as_tensor(mean)) / torch.as_tensor(std)


def _torch_model(workload: str):
    """The peers' copy of pflx's nets (``pfl_cli.models.client``: MLP and LeNet, same layers and sizes)."""
    import torch
    from torch import nn
    import torch.nn.functional as F

    class LeNet(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv1, self.conv2 = nn.Conv2d(3, 16, 5), nn.Conv2d(16, 32, 5)
            self.fc1, self.fc2, self.fc3 = nn.Linear(800, 120), nn.Linear(120, 84), nn.Linear(84, 10)

        def forward(self, x):
            x = F.max_pool2d(F.relu(self.conv1(x)), 2)
            x = F.max_pool2d(F.relu(self.conv2(x)), 2)
            return self.fc3(F.relu(self.fc2(F.relu(self.fc1(x.flatten(1))))))

    if workload.endswith("cnn"):
        return LeNet()
    return nn.Sequential(nn.Flatten(), nn.Linear(3072, 100), nn.ReLU(), nn.Linear(100, 10))


class _Clock:
    """Per-round wall and CPU seconds (of the process tree: Flower's Ray workers included); round 0 is the
    warm-up and is not counted."""

    def __init__(self, spawned: float):
        self.spawned, self.marks, self.start_s = spawned, [], None

    def round_start(self):
        if self.start_s is None:
            self.start_s = time.time() - self.spawned
            self.marks.append((time.perf_counter(), _tree_cpu_s()))

    def round_end(self):
        self.marks.append((time.perf_counter(), _tree_cpu_s()))

    def result(self, **extra) -> dict:
        import resource

        timed = self.marks[1:]  # after the warm-up round
        n = len(timed) - 1
        return {"wall_per_round": (timed[-1][0] - timed[0][0]) / n, "cpu_per_round": (timed[-1][1] - timed[0][1]) / n,
                "start_s": self.start_s, "ru_maxrss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
                **extra}


def _child_pflx(args) -> dict:
    clock = _Clock(args.spawned)
    import torch

    torch.set_num_threads(1)
    from pfl_cli.fl.api import train_federated
    from pfl_cli.registry import train_config
    from pfl_cli.partition import PartitionConfig, partition_labels
    from pfl_cli.rng import make_rng

    t = time.perf_counter()
    x, y, clients = _load(args.data)
    data_s = time.perf_counter() - t
    part = partition_labels(y, PartitionConfig(scheme="iid", num_clients=clients, holdout_clients=0,
                                               test_fraction=0.0), num_classes=10, rng=make_rng(0, "peers"))
    algorithm = "fedprox" if args.workload.startswith("fedprox") else "fedavg"
    arch = "lenet" if args.workload.endswith("cnn") else "mlp"
    prox = {"mu": PROX_MU} if algorithm == "fedprox" else {}
    cfg = train_config(algorithm, rounds=args.rounds + 1, clients_per_round=clients, local_epochs=1,
                       batch_size=args.batch, lr=_lr(args.workload), momentum=0.0, client_clip=0.0, **prox, model_arch=arch,
                       mlp_hidden=(100,), eval_every=args.rounds + 1, val_fraction=0.0, device="cpu")
    import pfl_cli.fl.loop as loop

    # The round loop has no start-of-round hook; time the algorithm's run_round itself.
    build = loop.run_rounds

    def timed_rounds(alg, cfg, **kw):
        run_round = alg.run_round

        def timed(*a, **k):
            clock.round_start()
            out = run_round(*a, **k)
            clock.round_end()
            return out

        alg.run_round = timed
        return build(alg, cfg, **kw)

    loop.run_rounds = timed_rounds
    run = train_federated(x, y, 10, part, cfg)
    from torch.func import functional_call

    alg, store, correct = run.algorithm, run.store, 0
    with torch.no_grad():  # pooled train accuracy of the global model, in chunks (no extra peak memory)
        for i in range(0, len(x), 1000):
            idx = torch.arange(i, min(i + 1000, len(x)))
            logits = functional_call(alg.net, alg.global_params, (store.inputs(idx),))
            correct += int((logits.argmax(1) == store.y[idx]).sum())
    return clock.result(data_s=data_s, accuracy=correct / len(x))


def _child_pfl_research(args) -> dict:
    clock = _Clock(args.spawned)
    import numpy as np
    import torch

    torch.set_num_threads(1)
    from pfl.aggregate.simulate import SimulatedBackend
    from pfl.algorithm import FederatedAveraging, FedProx, FedProxParams, NNAlgorithmParams
    from pfl.callback.base import TrainingProcessCallback
    from pfl.data.dataset import Dataset
    from pfl.data.federated_dataset import FederatedDataset
    from pfl.data.sampling import get_user_sampler
    from pfl.hyperparam import NNEvalHyperParams, NNTrainHyperParams
    from pfl.metrics import Metrics, Weighted
    from pfl.model.pytorch import PyTorchModel

    t = time.perf_counter()
    x, y, clients = _load(args.data)
    stats = _pool_stats(x)  # the images stay uint8, as pflx holds them
    data_s = time.perf_counter() - t
    per = len(x) // clients
    users = {u: [x[u * per:(u + 1) * per], y[u * per:(u + 1) * per]] for u in range(clients)}
    train = FederatedDataset.from_slices(users, get_user_sampler("minimize_reuse", list(range(clients))))
    net = _torch_model(args.workload)

    def loss(self, x, y, eval=False):
        self.eval() if eval else self.train()
        return torch.nn.functional.cross_entropy(self(_standardize(x, stats)), torch.as_tensor(y).long())

    def metrics(self, x, y, eval=False):
        self.eval() if eval else self.train()
        with torch.no_grad():
            logits = self(_standardize(x, stats))
        correct = (logits.argmax(1) == torch.as_tensor(y)).sum().item()
        return {"accuracy": Weighted(correct, len(x))}

    type(net).loss, type(net).metrics = loss, metrics
    model = PyTorchModel(model=net, local_optimizer_create=torch.optim.SGD,
                         central_optimizer=torch.optim.SGD(net.parameters(), lr=1.0))

    class Clocked(TrainingProcessCallback):
        def on_train_begin(self, *, model):
            clock.round_start()
            return Metrics()

        def after_central_iteration(self, aggregate_metrics, model, *, central_iteration):
            clock.round_end()
            return False, Metrics()

    backend = SimulatedBackend(training_data=train, val_data=None)
    fedprox = args.workload.startswith("fedprox")
    algorithm = FedProx() if fedprox else FederatedAveraging()
    common = dict(central_num_iterations=args.rounds + 1, evaluation_frequency=10**9, train_cohort_size=clients,
                  val_cohort_size=None)
    params = FedProxParams(mu=PROX_MU, **common) if fedprox else NNAlgorithmParams(**common)
    algorithm.run(algorithm_params=params, backend=backend, model=model,
                  model_train_params=NNTrainHyperParams(local_learning_rate=_lr(args.workload), local_num_epochs=1,
                                                        local_batch_size=args.batch),
                  model_eval_params=NNEvalHyperParams(local_batch_size=256), callbacks=[Clocked()])
    with torch.no_grad():
        acc = float(np.mean([(net(_standardize(xs, stats)).argmax(1).numpy() == ys).mean() for xs, ys in users.values()]))
    return clock.result(data_s=data_s, accuracy=acc)


def _child_flower(args) -> dict:
    """Flower's simulation engine (``run_simulation``, Ray backend, one 1-CPU actor): a ServerApp running
    Flower's own FedAvg / FedProx strategy and a ClientApp that trains the torch net one epoch."""
    clock = _Clock(args.spawned)
    import numpy as np
    import torch

    torch.set_num_threads(1)
    from flwr.app import ArrayRecord, ConfigRecord
    from flwr.serverapp import ServerApp
    from flwr.serverapp.strategy import FedAvg, FedProx
    from flwr.simulation import run_simulation

    # The ClientApp must pickle by reference into Ray's workers: take it from the importable module.
    from benchmarks import peers as importable

    t = time.perf_counter()
    x, y, clients = _load(args.data)
    data_s = time.perf_counter() - t
    fedprox = args.workload.startswith("fedprox")
    net = _torch_model(args.workload)
    base = FedProx if fedprox else FedAvg

    class Timed(base):
        def configure_train(self, server_round, arrays, config, grid):
            clock.round_start()
            return super().configure_train(server_round, arrays, config, grid)

        def aggregate_train(self, server_round, replies):
            out = super().aggregate_train(server_round, replies)
            clock.round_end()
            return out

    final = []
    server = ServerApp()

    @server.main()
    def main(grid, context):
        strategy = Timed(fraction_train=1.0, fraction_evaluate=0.0, min_train_nodes=clients,
                         min_available_nodes=clients, **({"proximal_mu": PROX_MU} if fedprox else {}))
        config = ConfigRecord({"lr": _lr(args.workload), "batch": args.batch, "data": args.data, "workload": args.workload})
        result = strategy.start(grid=grid, initial_arrays=ArrayRecord(net.state_dict()), num_rounds=args.rounds + 1,
                                train_config=config)
        final.append(result.arrays)

    run_simulation(server_app=server, client_app=importable._flower_client_app(), num_supernodes=clients,
                   backend_config={"init_args": {"num_cpus": 1}, "client_resources": {"num_cpus": 1, "num_gpus": 0.0}})
    net.load_state_dict(final[0].to_torch_state_dict())
    per, stats = len(x) // clients, _pool_stats(x)
    with torch.no_grad():
        acc = float(np.mean([(net(_standardize(x[u * per:(u + 1) * per], stats)).argmax(1)
                              .numpy() == y[u * per:(u + 1) * per]).mean() for u in range(clients)]))
    return clock.result(data_s=data_s, accuracy=acc)


_FLOWER_WORKER = {}  # per Ray worker process: each client's float32 data and the net, built on first use


def _flower_client_app():
    """The ClientApp: one local epoch of ``torch.optim.SGD`` on the node's client, as Flower's PyTorch examples
    write it (FedProx: the proximal term ``mu / 2 * ||w - w_global||^2`` joins the loss)."""
    from flwr.clientapp import ClientApp

    app = ClientApp()
    app.train()(_flower_train)
    return app


def _flower_train(msg, context):
    import torch
    import torch.nn.functional as F
    from flwr.app import ArrayRecord, Message, MetricRecord, RecordDict

    torch.set_num_threads(1)
    config = msg.content["config"]
    u = int(context.node_config["partition-id"])
    if "data" not in _FLOWER_WORKER:
        x, y, clients = _load(config["data"])
        _FLOWER_WORKER["data"] = (x, y, len(x) // clients, _pool_stats(x))
        _FLOWER_WORKER["net"] = _torch_model(config["workload"])
    x, y, per, stats = _FLOWER_WORKER["data"]  # uint8, as every framework holds it; standardized per batch
    xs, ys = x[u * per:(u + 1) * per], torch.as_tensor(y[u * per:(u + 1) * per])
    net = _FLOWER_WORKER["net"]
    net.load_state_dict(msg.content["arrays"].to_torch_state_dict())
    mu = float(config.get("proximal-mu", 0.0))
    anchor = [p.detach().clone() for p in net.parameters()] if mu else []
    opt = torch.optim.SGD(net.parameters(), lr=float(config["lr"]))
    batch = int(config["batch"])
    order = torch.randperm(len(xs))
    for i in range(0, len(xs), batch):
        rows = order[i:i + batch]
        loss = F.cross_entropy(net(_standardize(xs[rows.numpy()], stats)), ys[rows])
        if mu:
            loss = loss + mu / 2 * sum((p - a).pow(2).sum() for p, a in zip(net.parameters(), anchor))
        opt.zero_grad()
        loss.backward()
        opt.step()
    content = RecordDict({"arrays": ArrayRecord(net.state_dict()), "metrics": MetricRecord({"num-examples": len(xs)})})
    return Message(content=content, reply_to=msg)


CHILDREN = {"pflx": _child_pflx, "pfl-research": _child_pfl_research, "Flower": _child_flower}


if __name__ == "__main__":
    sys.exit(main())
