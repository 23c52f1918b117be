"""Benchmark: q-FFL, CFL and FedEM's round rules in pflx beside Flower's QFedAvg and FL-bench's CFL and FedEM (issue 47).

The three methods are in neither PFLlib nor fluke. Their peers: Flower's own ``QFedAvg`` strategy
(``flwr.serverapp.strategy.QFedAvg``, the Message-API strategy of the installed flwr) for q-FFL, and FL-bench's
``CFLServer`` (``src/server/cfl.py``) and ``FedEMClient`` (``src/client/fedem.py``) for CFL and FedEM. Each is fed
the inputs pflx's round had, and its result is compared with pflx's number for number:

q-FFL  pflx runs rounds of its ``qffl`` (all 20 ring clients, or 5 drawn a round) and records what each round's
       server step read: the global model w^t, the cohort's trained models w_k and their losses F_k(w^t). Flower's
       ``QFedAvg.aggregate_train`` gets the same w^t (``current_arrays``, what its ``configure_train`` stores) and one
       reply Message per client holding w_k and ``train_loss`` = F_k(w^t); its new global model is compared with
       pflx's, for q in {0, 0.2, 1, 5}.
CFL    pflx's ``cfl`` runs rounds with its split thresholds set so that the criterion fires at a chosen round; each
       round's updates dtheta_i go, as FL-bench's clients return them (``model_params_diff`` = W_global - W_local),
       into FL-bench's own ``CFLServer.train_one_round`` (on an object holding the attributes its constructor
       sets: the clusters, the clients' models, the thresholds; its trainer returns the recorded packages). The
       two tools' clusters after the round and each client's new model are compared.
FedEM  FL-bench's ``FedEMClient.update_data_sample_weights`` and ``update_learner_weights`` (its E-step) on a
       client's train samples under pflx's M components and the client's pi, against pflx's E-step
       (``pfl_cli.fl.clusters.mixture_weights``): the client's new pi.

FL-bench is not a package; its ``src/`` goes on the path of a child process (``--flbench DIR``, ``$FLBENCH_DIR``,
default ``.venv-bench/FL-bench``) run by pflx's own Python. The methods called import FL-bench's FedAvg server
and client modules, which import ray, hydra, pynvml and torchvision at module level; those four and the two
FedAvg base modules are replaced in the child by empty modules (the methods called use none of them), so the
code that runs is FL-bench's rule itself. Nothing of FL-bench is copied into pflx.

Exit 1 when a compared number differs by more than the stated tolerance (float32 rounding: 1e-5 relative,
1e-6 absolute for q-FFL's steps; clusters equal as sets; FedEM's pi to 1e-5), 0 when all agree, 0 with a line
saying why when Flower or FL-bench is not found.

    python benchmarks/conformance_rules.py [--flbench DIR] [--rounds 6] [--seeds 0,1]
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import subprocess
import sys
import tempfile
import types

HERE = pathlib.Path(__file__).resolve().parent
ROOT = HERE.parent
RING = "ring:?train_per_class=90&test_per_class=90"
QS = (0.0, 0.2, 1.0, 5.0)
TOL = dict(rtol=1e-5, atol=1e-6)


def ring_store(seed: int, equal_sizes: bool = False):
    """conformance.py's clients (the ring, 20 clients, two classes each, 75/25 train/test) as a pflx store;
    ``equal_sizes``: every train split cut to the smallest one's size (its first samples)."""
    import dataclasses

    import numpy as np

    from pfl_cli.data import load_dataset
    from pfl_cli.fl.store import build_store
    from pfl_cli.partition import PartitionConfig, partition_labels
    from pfl_cli.rng import make_rng

    ds = load_dataset(RING)
    cfg = PartitionConfig(scheme="pathological", classes_per_client=2, class_shares="equal", num_clients=20,
                          test_fraction=0.25)
    part = partition_labels(ds.y, cfg, num_classes=ds.num_classes, rng=make_rng(seed, "partition"), pool=ds.pool)
    if equal_sizes:
        n = int(part.train_sizes.min())
        keep = [part.train_indices[part.train_offsets[i]:part.train_offsets[i] + n] for i in range(part.num_clients)]
        part = dataclasses.replace(part, train_indices=np.concatenate(keep).astype(np.int64),
                                   train_offsets=np.arange(part.num_clients + 1, dtype=np.int64) * n)
    return build_store(ds.x, ds.y, ds.num_classes, part, val_fraction=0.0, rng=make_rng(seed, "validation-split"),
                       device="cpu")


def algorithm(store, name: str, seed: int, **keys):
    from pfl_cli.fl.api import make_algorithm
    from pfl_cli.registry import train_config

    cfg = train_config(name, seed=seed, mlp_hidden=(100,), local_steps=6, batch_size=10, lr=0.05, **keys)
    return make_algorithm(cfg, store)


def recorded(alg, names=("cohort_sgd",)):
    """Wrap ``alg``'s methods ``names`` so that each call's result is kept in ``alg._seen[name]``."""
    alg._seen = {}
    for n in names:
        f = getattr(alg, n)

        def wrap(*a, _f=f, _n=n, **k):
            out = _f(*a, **k)
            alg._seen[_n] = out
            return out

        setattr(alg, n, wrap)


def cohorts(store, rounds: int, per_round, seed: int):
    import numpy as np
    import torch

    from pfl_cli.fl.store import ROLE_TRAIN

    train = store.clients(ROLE_TRAIN)
    rng = np.random.default_rng(seed)
    for _ in range(rounds):
        pick = train if per_round is None else np.sort(rng.choice(train, per_round, replace=False))
        yield torch.as_tensor(pick)


# ----------------------------------------------------------------------------- q-FFL against Flower


def flower_qfedavg(w: dict, theta: dict, f, *, q: float, lr: float) -> dict:
    """Flower's QFedAvg server step on pflx's round inputs: w^t, the cohort's models theta (c, ...), losses f (c,)."""
    import numpy as np
    from flwr.app import ArrayRecord, Message, MetricRecord, RecordDict
    from flwr.serverapp.strategy import QFedAvg
    from flwr.supercore.task_identity import TaskIdentity

    TaskIdentity.run_id, TaskIdentity.node_id, TaskIdentity.task_id = 1, 0, 1  # a Message needs a run's identity
    names = list(w)
    strategy = QFedAvg(client_learning_rate=lr, q=q, min_train_nodes=1, min_available_nodes=1)
    strategy.current_arrays = ArrayRecord({n: w[n].detach().cpu().clone() for n in names})
    replies = []
    for r in range(len(f)):
        arrays = ArrayRecord({n: theta[n][r].detach().cpu().clone() for n in names})
        metrics = MetricRecord({"train_loss": float(f[r]), "num-examples": 1})
        replies.append(Message(content=RecordDict({"arrays": arrays, "metrics": metrics}), dst_node_id=0,
                               message_type="train"))
    out, _ = strategy.aggregate_train(1, replies)
    return {n: a.numpy() for n, a in out.items()}


def qffl_rows(seeds, rounds: int) -> list[dict]:
    import logging

    import numpy as np
    import torch

    logging.getLogger("flwr").setLevel(logging.WARNING)
    rows = []
    for seed in seeds:
        store = ring_store(seed)
        for q in QS:
            for per_round in (None, 5):
                alg = algorithm(store, "qffl", seed, q=q)
                recorded(alg, ("cohort_sgd", "losses"))
                worst_abs, worst_rel, step, misses = 0.0, 0.0, 0.0, 0
                for t, cohort in enumerate(cohorts(store, rounds, per_round, seed)):
                    w = {k: v.clone() for k, v in alg.global_params.items()}
                    alg.run_round(t, cohort, torch.Generator().manual_seed(seed * 1000 + t))
                    theta, f = alg._seen["cohort_sgd"][0], alg._seen["losses"]
                    peer = flower_qfedavg(w, theta, f, q=q, lr=alg.cfg.lr)
                    for k, v in alg.global_params.items():
                        ours, theirs = v.double().numpy(), peer[k].astype(np.float64)
                        diff = np.abs(ours - theirs)
                        worst_abs = max(worst_abs, float(diff.max()))
                        worst_rel = max(worst_rel, float((diff / (np.abs(theirs) + 1e-12)).max()))
                        misses += not np.allclose(ours, theirs, **TOL)
                        step = max(step, float(np.abs(ours - w[k].double().numpy()).max()))
                rows.append(dict(method="qffl", seed=seed, q=q, cohort=per_round or 20, rounds=rounds,
                                 max_abs=worst_abs, max_rel=worst_rel, largest_step=step,
                                 verdict="miss" if misses else "ok"))
    return rows


# ----------------------------------------------------------------------------- FL-bench's CFL and FedEM (child)


def stub_flbench_imports(flbench: pathlib.Path) -> None:
    """FL-bench's ``src/`` on the path, with the modules its CFL server and FedEM client import only for the rest
    of FL-bench (ray, hydra, pynvml, torchvision; its FedAvg server and client) replaced by empty ones."""
    import torch

    sys.path.insert(0, str(flbench))
    for name in ("ray", "pynvml", "torchvision", "torchvision.models", "torchvision.transforms", "hydra",
                 "hydra.core", "hydra.core.hydra_config"):
        sys.modules[name] = types.ModuleType(name)
    sys.modules["torchvision"].models = sys.modules["torchvision.models"]
    # FL-bench's models.py names torchvision's nets in class bodies (ResNet's table): any name resolves to a
    # placeholder, never called (the MLP learner below is the only model built)
    sys.modules["torchvision.models"].__getattr__ = lambda name: types.SimpleNamespace(DEFAULT=None)
    omegaconf = types.ModuleType("omegaconf")
    omegaconf.DictConfig = types.SimpleNamespace
    omegaconf.OmegaConf = None
    sys.modules.setdefault("omegaconf", omegaconf)
    server = types.ModuleType("src.server.fedavg")
    server.FedAvgServer = object
    client = types.ModuleType("src.client.fedavg")
    client.FedAvgClient = object
    sys.modules["src.server.fedavg"], sys.modules["src.client.fedavg"] = server, client
    del torch


def flbench_cfl_round(state: dict) -> dict:
    """FL-bench's ``CFLServer.train_one_round`` on pflx's round: ``state`` holds the clients' models before the round
    (n, d) float64, the clusters (lists of client positions), the round's packages (position -> W_global - W_local),
    the thresholds and the round number; returns the clusters and the clients' models after it."""
    import torch
    from src.server.cfl import CFLServer

    n = state["models"].shape[0]
    server = object.__new__(CFLServer)
    server.train_clients = list(range(n))
    server.public_model_param_names = ["w"]
    server.clients_personal_model_params = {i: {"w": state["models"][i].clone()} for i in range(n)}
    server.clients_model_params_diff = [None] * n
    server.client_clusters = [list(c) for c in state["clusters"]]
    server.selected_clients = sorted(state["packages"])
    server.current_epoch = state["round"]
    server.args = types.SimpleNamespace(cfl=types.SimpleNamespace(**state["cfl"]))
    packages = {i: {"model_params_diff": {"w": d}} for i, d in state["packages"].items()}
    server.trainer = types.SimpleNamespace(train=lambda: packages)
    CFLServer.train_one_round(server)
    return {"clusters": [sorted(int(i) for i in c) for c in server.client_clusters],
            "models": torch.stack([server.clients_personal_model_params[i]["w"] for i in range(n)])}


def flbench_fedem_pi(components: list, pi, x, y) -> dict:
    """FL-bench's FedEM E-step (``update_data_sample_weights``, ``update_learner_weights``) for one client."""
    import torch
    from src.client.fedem import EnsembleModel, FedEMClient
    from torch.utils.data import Subset, TensorDataset

    client = object.__new__(FedEMClient)
    client.model = EnsembleModel(learners=components, learners_weights=pi.clone())
    client.dataset = torch.nn.Identity()  # only .eval() is called on it
    pool = TensorDataset(x, y)
    client.trainset = Subset(pool, list(range(len(y))))
    client.trainloader = types.SimpleNamespace(batch_size=7)
    client.device = "cpu"
    client.args = types.SimpleNamespace(fedem=types.SimpleNamespace(n_learners=len(components)))
    FedEMClient.update_data_sample_weights(client)
    FedEMClient.update_learner_weights(client)
    return client.model.learners_weights.detach()


def mlp_learner_class():
    """FL-bench's ``DecoupledModel`` holding pflx's MLP: ``base`` = fc1 and ReLU, ``classifier`` = fc2."""
    import torch
    from src.utils.models import DecoupledModel

    class MLPLearner(DecoupledModel):
        def __init__(self, d, hidden, classes):
            super().__init__()
            self.base = torch.nn.Sequential(torch.nn.Linear(d, hidden), torch.nn.ReLU())
            self.classifier = torch.nn.Linear(hidden, classes)

    return MLPLearner


def child(flbench: pathlib.Path, job: pathlib.Path) -> None:
    """Run FL-bench's rules on the inputs in ``job`` (torch.save'd by the parent) and save what they return."""
    import torch

    stub_flbench_imports(flbench)
    global MLPLearner
    MLPLearner = mlp_learner_class()
    todo = torch.load(job, weights_only=False)  # written by this script's parent process a moment ago
    out = {"cfl": [flbench_cfl_round(s) for s in todo["cfl"]], "fedem": []}
    for case in todo["fedem"]:
        nets = []
        for params in case["components"]:  # pflx's MLP (fc1, ReLU, fc2) as an FL-bench DecoupledModel
            net = MLPLearner(params["fc1.weight"].shape[1], params["fc1.weight"].shape[0], params["fc2.weight"].shape[0])
            net.load_state_dict({"base.0.weight": params["fc1.weight"], "base.0.bias": params["fc1.bias"],
                                 "classifier.weight": params["fc2.weight"], "classifier.bias": params["fc2.bias"]})
            nets.append(net)
        out["fedem"].append(flbench_fedem_pi(nets, case["pi"], case["x"], case["y"]))
    torch.save(out, job.with_suffix(".out"))


def run_child(flbench: pathlib.Path, todo: dict) -> dict:
    import torch

    with tempfile.TemporaryDirectory() as tmp:
        job = pathlib.Path(tmp) / "job.pt"
        torch.save(todo, job)
        env = {**os.environ, "PYTHONPATH": str(ROOT)}
        subprocess.run([sys.executable, __file__, "--child", str(flbench), str(job)], check=True, env=env)
        return torch.load(job.with_suffix(".out"), weights_only=False)


# ----------------------------------------------------------------------------- CFL and FedEM: pflx's side


def flat(params: dict, names):
    import torch

    return torch.cat([params[k].reshape(params[k].shape[0], -1) for k in names], 1).double()


def cfl_cases(seeds, rounds: int):
    """pflx's CFL rounds on the ring, with each round's inputs for FL-bench and pflx's result after it.

    Every client has the same number of train samples in these cases (FL-bench weighs a cluster's updates
    uniformly, pflx by |D_i| as Sattler et al.'s Alg. 1: equal sizes make the two the same rule)."""
    import torch

    cases = []
    for seed in seeds:
        store = ring_store(seed, equal_sizes=True)
        alg = algorithm(store, "cfl", seed, cfl_warmup_rounds=rounds - 2, cfl_eps1=1e9, cfl_eps2=0.0)
        recorded(alg)
        names = list(alg.models)
        n = len(store.clients(0))
        for t, cohort in enumerate(cohorts(store, rounds, None, seed)):
            node = alg.member.gather(cohort)["node"].clone()
            before = flat({k: v[node] for k, v in alg.models.items()}, names)
            leaves = torch.unique(node).tolist()
            clusters = [[int(r) for r in torch.nonzero(node == c).flatten()] for c in leaves]
            alg.run_round(t, cohort, torch.Generator().manual_seed(seed * 1000 + t))
            theta = flat(alg._seen["cohort_sgd"][0], names)
            after_node = alg.member.gather(cohort)["node"]
            after = flat({k: v[after_node] for k, v in alg.models.items()}, names)
            ours = sorted(sorted(int(r) for r in torch.nonzero(after_node == c).flatten())
                          for c in torch.unique(after_node).tolist())
            cases.append(dict(seed=seed, round=t, n=n, ours_clusters=ours, ours_models=after, state=dict(
                models=before, clusters=clusters, round=t,
                packages={i: before[i] - theta[i] for i in range(n)},  # FL-bench's diff = W_global - W_local
                cfl=dict(eps_1=alg.cfg.cfl_eps1, eps_2=alg.cfg.cfl_eps2, min_cluster_size=1,
                         start_clustering_round=alg.cfg.cfl_warmup_rounds))))
    return cases


def largest_cross_similarity(before: list, after: list, updates) -> float:
    """The largest cosine similarity of two clients' updates that were in one cluster before the round and are in
    two after it: what Sattler et al.'s optimal bipartition minimizes (§III-C)."""
    import torch

    unit = torch.stack([updates[i] for i in range(len(updates))])
    unit = unit / unit.norm(dim=1, keepdim=True).clamp_min(1e-12)
    sim = unit @ unit.T
    where = {i: j for j, members in enumerate(after) for i in members}
    worst = -1.0
    for members in before:
        for a in members:
            for b in members:
                if where[a] != where[b]:
                    worst = max(worst, float(sim[a, b]))
    return worst


def cfl_verdict(case: dict, theirs: dict) -> dict:
    """One CFL round: ``ok`` when both tools give the same clusters and models (1e-5); where they split the same
    cluster differently, ``by design`` when pflx's split has the smaller largest cross-cluster similarity (the
    optimum of §III-C; FL-bench cuts by complete linkage), else ``miss``; ``flbench defect`` when FL-bench's clusters
    do not partition the clients."""
    ours, peer = case["ours_clusters"], sorted(theirs["clusters"])
    n = case["n"]
    row = dict(method="cfl", seed=case["seed"], round=case["round"], clusters_pflx=ours, clusters_flbench=peer)
    if sorted(i for c in peer for i in c) != list(range(n)):
        return {**row, "verdict": "flbench defect: a client in two clusters or in none"}
    if ours == peer:
        gap = float((case["ours_models"] - theirs["models"].double()).abs().max())
        return {**row, "max_abs_model": gap, "verdict": "ok" if gap <= 1e-5 else "miss"}
    updates = {i: -d for i, d in case["state"]["packages"].items()}
    before = case["state"]["clusters"]
    a, b = largest_cross_similarity(before, ours, updates), largest_cross_similarity(before, peer, updates)
    return {**row, "cross_similarity_pflx": a, "cross_similarity_flbench": b,
            "verdict": "by design: pflx's split is the optimal bipartition" if a <= b + 1e-9 else "miss"}


def fedem_cases(seeds):
    import torch

    from pfl_cli.fl.store import ROLE_TRAIN

    cases = []
    for seed in seeds:
        store = ring_store(seed)
        alg = algorithm(store, "fedem", seed)
        for t, cohort in enumerate(cohorts(store, 3, None, seed)):  # three rounds: components that differ
            alg.run_round(t, cohort, torch.Generator().manual_seed(seed * 1000 + t))
        clients = torch.as_tensor(store.clients(ROLE_TRAIN))
        pi = alg.private.gather(clients)["pi"]
        ours = alg.e_step(clients, pi)
        stacked = alg.stacked()
        for r, i in enumerate(clients.tolist()):
            n = int(store.fit.length[i])
            idx = store.fit.index[i, :n]
            comps = [{name: v[m].clone() for name, v in stacked.items()}
                     for m in range(alg.k)]
            cases.append(dict(seed=seed, client=i, pi=pi[r].clone(), ours=ours[r].clone(), components=comps,
                              x=store.inputs(idx).clone(), y=store.y[idx].clone()))
    return cases


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--flbench", default=os.environ.get("FLBENCH_DIR", ".venv-bench/FL-bench"))
    p.add_argument("--rounds", type=int, default=6)
    p.add_argument("--seeds", default="0,1")
    p.add_argument("--json", default=None)
    p.add_argument("--child", nargs=2, default=None, help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    if a.child:
        child(pathlib.Path(a.child[0]), pathlib.Path(a.child[1]))
        return 0
    import torch

    torch.set_num_threads(1)
    seeds = [int(s) for s in a.seeds.split(",")]
    rows, failed = [], False
    try:
        import flwr  # noqa: F401
    except ImportError:
        print("conformance_rules.py: q-FFL skipped: flwr is not installed (pip install 'pflx[flower]')")
    else:
        for r in qffl_rows(seeds, a.rounds):
            rows.append(r)
            print(json.dumps(r))
            failed |= r["verdict"] != "ok"
    flbench = pathlib.Path(a.flbench)
    if not (flbench / "src" / "server" / "cfl.py").is_file():
        print(f"conformance_rules.py: CFL and FedEM skipped: no FL-bench checkout at {flbench} (--flbench DIR)")
    else:
        cfl, fedem = cfl_cases(seeds, a.rounds), fedem_cases(seeds)
        peer = run_child(flbench, {"cfl": [c["state"] for c in cfl], "fedem": [
            {k: c[k] for k in ("components", "pi", "x", "y")} for c in fedem]})
        for c, theirs in zip(cfl, peer["cfl"]):
            r = cfl_verdict(c, theirs)
            rows.append(r)
            print(json.dumps(r))
            failed |= r["verdict"] == "miss"
        gaps = {}
        for c, theirs in zip(fedem, peer["fedem"]):
            gaps.setdefault(c["seed"], []).append(float((c["ours"].double() - theirs.double()).abs().max()))
        for seed, g in gaps.items():
            r = dict(method="fedem", seed=seed, clients=len(g), max_abs_pi=max(g),
                     verdict="ok" if max(g) <= 1e-5 else "miss")
            rows.append(r)
            print(json.dumps(r))
            failed |= max(g) > 1e-5
    if a.json:
        pathlib.Path(a.json).write_text(json.dumps(rows, indent=1))
    print("conformance_rules.py:", "a row misses" if failed else "every row agrees")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
