"""fluke-fl as the conformance benchmark's second peer (``benchmarks/conformance.py --peer fluke``).

fluke (Nardi, Di Lillo, Polato et al., PyPI ``fluke-fl``, a CLI + YAML federated learning framework)
runs the algorithms it shares with pflx on the data, partition, model, optimizer, schedule, seeds
and cohorts that conformance.py sets for PFLlib; the paired verdict is the same. This module holds
the matched settings of each shared method (:func:`fluke_algorithms`) and the child that drives fluke
(:func:`child`): run by fluke's Python (its own virtual environment, never pflx's) on the files
conformance.py exported, it builds fluke's own objects (``DataSplitter`` over a
``DummyDataContainer`` holding each client's train and test split as fluke ``FastDataLoader``s, the
hyperparameters as fluke's ``DDict``, the method's ``fluke.algorithms`` class) and calls the
method's ``run(rounds, eligible_perc)``. Nothing of fluke is copied here.

The model is the benchmark's MLP as a fluke ``EncoderHeadNet`` (encoder: flatten, ``fc1``, ReLU;
head: ``fc``), so that fluke's body/head methods (FedPer, FedRep, FedBABU) split it where pflx
and PFLlib do; with a shared initial model every copy fluke builds starts from pflx's draw.

The score is the pooled test accuracy (correct / samples over the clients' test splits) of the
model fluke itself scores last for each client at the end of the run (its ``finalize``, with its
pre- and post-fit client evaluations switched on there only, through an evaluator that counts):
the personalized model where the method has one, the global model broadcast at the end otherwise.
"""

from __future__ import annotations

import os
import pathlib
import subprocess
import sys

FLUKE_VERSION = "0.8.1"  # the release issue 40 measured; the benchmark says which one ran
HIDDEN, CLASSES = 100, 10


def fluke_algorithms(rounds: int, lr: float) -> dict[str, dict]:
    """pflx algorithm -> pflx's keys, fluke's algorithm class (under ``fluke.algorithms``) and the client /
    server hyperparameters set equal where they mean the same, and what stays unmatched.

    ``body_only``: fluke's method uploads and loads the encoder alone, so its global model is the MLP's body.

    ``lr``: the benchmark's client lr (FedOpt's and FedExP's server steps are set from it where the
    method's own step is a multiple of it).
    """
    del rounds  # every row below is the same at any schedule
    return {
        "fedavg": dict(peer="fedavg.FedAVG", pflx={}, client={}, server={}),
        "fedprox": dict(peer="fedprox.FedProx", pflx={"mu": 0.01}, client={"mu": 0.01}, server={}),
        # fluke's Ditto: local_epochs for the global model, tau epochs of the personal model (ditto.py:110)
        "ditto": dict(peer="ditto.Ditto", pflx={"lam": 0.1}, client={"lam": 0.1, "tau": 1}, server={}),
        # fluke's FedRep: local_epochs for the head, tau epochs for the body (fedrep.py:106, 123)
        "fedrep": dict(peer="fedrep.FedRep", body_only=True,
                       pflx={"head_epochs": 5, "body_epochs": 1, "local_epochs": None},
                       client={"local_epochs": 5, "tau": 1}, server={}),
        "fedper": dict(peer="fedper.FedPer", body_only=True, pflx={}, client={}, server={}),
        "fedbabu": dict(peer="fedbabu.FedBABU", body_only=True, pflx={"finetune_epochs": 5},
                        client={"fine_tuning_epochs": 5, "mode": "full"}, server={},
                        unmatched="FedBABU: fluke fine-tunes each client's last local model (its body after "
                                  "its last round), not the final global one (fedbabu.py:110-121: finalize "
                                  "never loads the broadcast model), and under partial participation fine-tunes "
                                  "no client (fedbabu.py:139 reads the server's participant set, which only a "
                                  "full cohort fills: server.py:283)"),
        # fluke's lam is APFL's alpha, fixed (apfl.py:91, 105: it has no alpha update); tau 1: it averages
        # every round (apfl.py:135 skips the average tau - 1 rounds in tau)
        "apfl": dict(peer="apfl.APFL", pflx={"alpha": 0.5, "alpha_lr": 0.0}, client={"lam": 0.5},
                     server={"tau": 1},
                     unmatched="APFL: fluke's personalized model takes no gradient step (apfl.py:91-95: the "
                               "mixture merge_models builds is a detached copy, utils/model.py:724-728, so "
                               "pers_optimizer steps parameters without gradients) and is replaced each round "
                               "by (1 - alpha) w_local + alpha v (apfl.py:105); pflx runs alpha fixed "
                               "(alpha_lr 0) to match fluke, which has no alpha update"),
        # issue 40's optimization baselines fluke shares; its server averages are weighted by data size (pflx too)
        "scaffold": dict(peer="scaffold.SCAFFOLD", pflx={}, client={}, server={"global_step": 1.0}),
        "feddyn": dict(peer="feddyn.FedDyn", pflx={"alpha": 0.01}, client={"alpha": 0.01, "clipping": 0},
                       server={"alpha": 0.01}),  # fluke's FedDyn client clips at 5 unless told (feddyn.py)
        "fedopt": dict(peer="fedopt.FedOpt", pflx={"server_optimizer": "adam", "server_lr": 0.01, "beta1": 0.9,
                                                   "beta2": 0.99, "tau": 0.001},
                       client={}, server={"mode": "adam", "lr": 0.01, "beta1": 0.9, "beta2": 0.99, "tau": 0.001}),
        # fluke's eps is fixed at 1e-4 (fedexp.py _compute_eta's default, no key): pflx runs eps 1e-4 (its default
        # 1e-3 is the paper's §6); fluke serves the last iterate (pflx: average_last_two false)
        "fedexp": dict(peer="fedexp.FedExP", pflx={"average_last_two": False, "eps": 1e-4}, client={}, server={},
                       unmatched="FedExP: fluke's eta_g takes the clients' deltas uniformly (fedexp.py "
                                 "_compute_eta: the plain mean and sum over the cohort, Alg. 1's p_i = 1/M) and then "
                                 "steps along the data-size-weighted mean (server.py aggregate); pflx weighs both "
                                 "by data size"),
        "fednova": dict(peer="fednova.FedNova", pflx={}, client={}, server={}),
        "fedlc": dict(peer="fedlc.FedLC", pflx={"tau": 1.0}, client={"tau": 1.0}, server={}),
        "fedsam": dict(peer="fedsam.FedSAM", pflx={"sam_rho": 0.05}, client={"rho": 0.05}, server={}),
        "moon": dict(peer="moon.MOON", pflx={"moon_mu": 1.0, "moon_tau": 0.5}, client={"mu": 1.0, "tau": 0.5},
                     server={}),
        # issue 40's prototype and similarity methods fluke has. ``score: "model"``: fluke scores another model than
        # the method's personalized one (below); the driver scores each client's own model after its last round, as
        # pflx does, and returns fluke's own figure beside it (peer_own in the JSON, over the peer_own_clients
        # clients fluke scores: its FedProto scores only the clients that hold class 0, fedproto.py evaluate).
        # FedProto: fluke's lam weighs nn.MSELoss (the mean over the d = 100 features, fedproto.py fit), pflx's
        # fedproto_lambda the squared norm: lam 1 is 1 / d
        # pflx's inference head: the client's decision layer, the model this row scores in fluke (fluke's own rule,
        # its client's own prototypes, is neither pflx's nor PFLlib's nearest global prototype)
        "fedproto": dict(peer="fedproto.FedProto", pflx={"fedproto_lambda": 1.0 / HIDDEN, "inference": "head"},
                         client={"lam": 1.0, "n_protos": CLASSES}, server={"n_protos": CLASSES}, score="model",
                         unmatched="FedProto: fluke averages a class's prototypes uniformly over the cohort clients "
                                   "that hold it (fedproto.py FedProtoServer.aggregate; pflx: by class counts, Eq. 6) "
                                   "and takes a client's prototypes from the representations of the epoch's batches "
                                   "as they train (pflx: from the trained model, Eq. 3); its own figure "
                                   "(peer_own) trains every client one more epoch in finalize and classifies by the "
                                   "client's own prototypes (fedproto.py FedProtoClient.evaluate and finalize), "
                                   "pflx by the client's decision layer"),
        # FedAMP: fluke's client proximal weight is lam / (2 lr) (fedamp.py _proximal_loss: alpha is the client's
        # optimizer lr), pflx's lam / (2 alpha_k): fluke lam = lr * pflx lam / alpha_k; fluke's server alpha is
        # alpha_k in the attention xi_ij = alpha_k A'(.). sigma 100: at PFLlib's sigma 1 the self-weight
        # xi_ii = 1 - sum_j xi_ij starts near -19 (models that start equal), every seed of both tools ends
        # 10-25 points apart and no verdict is possible (docs/performance/conformance.md); at 100 it stays >= 0.81
        "fedamp": dict(peer="fedamp.FedAMP", pflx={"alpha_k": 1.0, "sigma": 100.0, "lam": 1.0},
                       client={"lam": lr * 1.0 / 1.0}, server={"alpha": 1.0, "sigma": 100.0}, score="model",
                       unmatched="FedAMP: fluke's server weighs nothing by data size (weighted=False; the attention "
                                 "has no weights in either); its own figure (peer_own) scores each client's cloud "
                                 "model u_i, the message of the last round (fedamp.py: PFLClient.evaluate scores "
                                 "personalized_model, which receive_model overwrites with u_i), pflx the client's "
                                 "model w_i (Alg. 1's output)"),
        # FedNH: fluke's rho is the weight of the old prototypes, as pflx's fednh_rho (fednh.py aggregate); its
        # client clips at 5 unless told (fednh.py FedNHClient); the model is the encoder under fluke's ProtoNet
        "fednh": dict(peer="fednh.FedNH", body_only=True, pflx={"fednh_rho": 0.9, "lambda_theta": 0.0},
                      client={"n_protos": CLASSES, "clipping": 0, "model": f"{__name__}.FlukeEncoder"},
                      server={"n_protos": CLASSES, "rho": 0.9}, score="model",
                      unmatched="FedNH: fluke's server keeps the cosine scale at its start (fednh.py aggregate "
                                "averages the encoder and the prototypes only, and a client loads the server's "
                                "scale each round; pflx averages it, as the authors' code) and a client's class mean "
                                "is of its raw representations (pflx: of the unit ones, the authors' code); its own "
                                "figure (peer_own) trains every client one more epoch in finalize and classifies by "
                                "the client's own count-scaled class means, which fit writes over the prototypes "
                                "(fednh.py _update_protos, evaluate); the row scores the client's model with the "
                                "prototypes it trained against, pflx's personalized model"),
    }


COMMON_UNMATCHED = (
    "fluke trains exactly `rounds` rounds and scores in its finalize (FedBABU after its fine-tuning); "
    "pflx scores after round `rounds`",
    "model initialization: the same layers and PyTorch's default init, drawn from each tool's own seed",
)


def find_python(arg: str | None, root: pathlib.Path) -> tuple[str | None, str]:
    """fluke's Python: --python, $FLUKE_PYTHON, then .venv-fluke/bin/python beside the checkout; (None, why)
    when none of them imports fluke."""
    cands = [c for c in (arg, os.environ.get("FLUKE_PYTHON"), str(root / ".venv-fluke" / "bin" / "python")) if c]
    for cand in cands:
        if pathlib.Path(cand).exists():
            python = os.path.abspath(cand)
            if version(python):
                return python, ""
            return None, f"{python} does not import fluke"
    return None, ("fluke's Python not found (give --python or FLUKE_PYTHON, or make the virtual environment "
                  ".venv-fluke beside the checkout)")


def version(python: str) -> str:
    """fluke's installed version and its torch's, or '' when ``python`` cannot import fluke."""
    code = ("import importlib.metadata as m, torch; "
            "print(m.version('fluke-fl') + ' (torch ' + torch.__version__ + ')')")
    out = subprocess.run([python, "-c", code], capture_output=True, text=True)
    return out.stdout.strip() if out.returncode == 0 else ""


# ----------------------------------------------------------------------------- the child: run by fluke's Python

FEATURES = None  # set by the child before fluke builds its models
INITIAL = None  # pflx's initial model under the peer MLP's names (--init shared), or None: fluke's own draw


def __getattr__(name):  # fluke builds models by qualified name ("conformance_fluke.FlukeMLP"): made on first use
    if name in ("FlukeMLP", "FlukeEncoder"):
        globals()["FlukeMLP"], globals()["FlukeEncoder"] = _mlp_class()
        return globals()[name]
    raise AttributeError(name)


def _without_torchvision() -> None:
    """fluke.nets imports torchvision's ResNets at import (nets.py:13); the registry's torchvision wheels are CUDA
    builds whose ``_C.so`` does not load beside the CPU torch, so the benchmark's fluke environment has no
    torchvision (docs/performance/conformance.md). Where it is absent, ``torchvision.models`` is a stand-in whose
    ResNets refuse: the benchmark's MLP never builds one."""
    import importlib.machinery
    import importlib.util
    import types

    if "torchvision" in sys.modules or importlib.util.find_spec("torchvision") is not None:
        return
    import torchmetrics  # noqa: F401  (it looks for torchvision once, at import: it finds none)

    def refuse(*args, **kwargs):
        raise RuntimeError("conformance_fluke: torchvision is not installed in fluke's environment")

    vision, models = types.ModuleType("torchvision"), types.ModuleType("torchvision.models")
    vision.__spec__ = importlib.machinery.ModuleSpec("torchvision", None)
    models.__spec__ = importlib.machinery.ModuleSpec("torchvision.models", None)
    models.resnet18 = models.resnet34 = models.resnet50 = refuse
    vision.models = models
    sys.modules.update({"torchvision": vision, "torchvision.models": models})


def _mlp_class():
    from torch import nn

    from fluke.nets import EncoderHeadNet

    class Flatten(nn.Flatten):
        """nn.Flatten that leaves one unbatched sample as it is: fluke's FedNH sizes its prototypes by running the
        encoder on one sample (fednh.py FedNHClient, utils/model.py get_activation_size)."""

        def forward(self, x):
            return x if x.dim() == 1 else super().forward(x)

    class FlukeEncoder(nn.Sequential):
        """The MLP's body (flatten, fc1, ReLU): the global model of fluke's body-only methods (FedPer, FedRep,
        FedBABU, FedNH: their clients upload and load the encoder alone)."""

        def __init__(self):
            super().__init__(Flatten(), nn.Linear(FEATURES, HIDDEN), nn.ReLU())
            if INITIAL is not None:
                self.load_state_dict({"1.weight": INITIAL["fc1.weight"], "1.bias": INITIAL["fc1.bias"]})

    class FlukeMLP(EncoderHeadNet):
        """The benchmark's MLP (fc1 -> ReLU -> fc) as fluke's encoder + head net; pflx's draw when shared."""

        def __init__(self):
            head = nn.Linear(HIDDEN, CLASSES)
            if INITIAL is not None:
                head.load_state_dict({"weight": INITIAL["fc.weight"], "bias": INITIAL["fc.bias"]})
            super().__init__(FlukeEncoder(), head)

    FlukeMLP.__module__ = FlukeEncoder.__module__ = __name__
    return FlukeMLP, FlukeEncoder


def _counting_evaluator():
    """A fluke Evaluator that scores accuracy and keeps, per test loader, the counts of its last final call."""
    import torch

    from fluke.evaluation import Evaluator

    class Counting(Evaluator):
        def __init__(self):
            super().__init__(eval_every=1)
            self.final, self.last = False, {}

        def evaluate(self, round, model, eval_data_loader, loss_fn=None, additional_metrics=None, **kwargs):
            if eval_data_loader is None or model is None:
                return {}
            model.eval()
            correct = total = 0
            with torch.no_grad():
                for x, y in eval_data_loader:
                    out = model(x)  # logits; FedNH's ArgMaxModule returns the predicted classes
                    correct += int(((out.argmax(1) if out.dim() > 1 else out) == y).sum())
                    total += len(y)
            if self.final:
                self.last[id(eval_data_loader)] = (correct, total)
            return {"accuracy": correct / max(total, 1)}

    return Counting()


def read_clients(folder: pathlib.Path) -> list[tuple]:
    """The per-client arrays conformance.py exported (``<folder>/<i>.npz``, each a pickled ``{'x', 'y'}``
    dict, PFLlib's layout), in client order: [(x, y), ...]."""
    import numpy as np

    out = []
    for i in range(len(list(folder.glob("*.npz")))):
        with open(folder / f"{i}.npz", "rb") as f:
            data = np.load(f, allow_pickle=True)["data"].item()
        out.append((data["x"], data["y"]))
    return out


def hyperparameters(spec: dict, batch: int, lr: float) -> dict:
    """fluke's hyperparameters of one row (its ``DDict`` tree, as plain dicts): the matched client settings
    (plain SGD, a constant scheduler), then the row's client keys over them (FedRep's ``local_epochs`` is its
    head epochs), the server averaging by data size (as pflx and PFLlib) under the row's server keys, and the
    model by qualified name (the encoder alone for the body-only methods)."""
    model = f"{__name__}.FlukeMLP"
    client = dict(batch_size=batch, local_epochs=1, loss="CrossEntropyLoss", model=model,
                  optimizer=dict(name="SGD", lr=lr, momentum=0.0, weight_decay=0.0),
                  scheduler=dict(name="StepLR", step_size=1, gamma=1))
    return dict(client={**client, **spec["client"]}, server={"weighted": True, **spec["server"]},
                model=f"{__name__}.FlukeEncoder" if spec.get("body_only") else model)


def child(args, dataset: pathlib.Path, batch: int, lr: float) -> float:
    """One fluke run: ``args.algorithm`` at ``args.join``, seed ``args.seed``, on the clients exported under
    ``dataset`` (``train/<i>.npz``, ``test/<i>.npz``)."""
    import contextlib

    import torch

    global FEATURES, INITIAL
    torch.set_num_threads(1)
    splits = {s: read_clients(pathlib.Path(dataset) / s) for s in ("train", "test")}
    spec = fluke_algorithms(args.rounds, lr)[args.algorithm]
    FEATURES = int(splits["train"][0][0].reshape(len(splits["train"][0][0]), -1).shape[1])
    _without_torchvision()
    shared = pathlib.Path(args.work) / f"init-{args.algorithm}-{args.seed}.pt"
    INITIAL = torch.load(shared) if shared.exists() else None

    from fluke import DDict, FlukeENV
    from fluke.data import DataSplitter, DummyDataContainer, FastDataLoader
    from fluke.utils import get_class_from_qualified_name

    env = FlukeENV()
    env.set_seed(args.seed)  # torch, numpy and random
    env.set_device("cpu")
    env.set_inmemory(True)
    env.set_eval_cfg(pre_fit=False, post_fit=False, locals=False, server=False)  # scored in finalize only
    evaluator = _counting_evaluator()
    env.set_evaluator(evaluator)

    def loader(x, y, train):
        xs, ys = torch.from_numpy(x).float(), torch.from_numpy(y).long()
        return FastDataLoader(xs, ys, num_labels=CLASSES, batch_size=batch if train else max(len(y), 1),
                              shuffle=train, skip_singleton=train)

    train = [loader(x, y, True) for x, y in splits["train"]]
    test = [loader(x, y, False) for x, y in splits["test"]]
    n = len(train)
    splitter = DataSplitter(DummyDataContainer(train, test, None, num_classes=CLASSES))
    hp = DDict(hyperparameters(spec, batch, lr))  # nested dicts become fluke's DDicts
    cls = get_class_from_qualified_name(f"fluke.algorithms.{spec['peer']}")
    if spec["peer"] == "fednh.FedNH":
        _keep_fednh_trained_prototypes()
    own_models = {}
    with contextlib.redirect_stdout(sys.stderr):  # fluke renders progress; the result line is ours
        algorithm = cls(n, splitter, hp)
        finalize = algorithm.finalize

        def scored_finalize():
            if spec.get("score") == "model":  # each client's own model after its last round, before finalize
                for client in algorithm.clients:
                    own_models[id(client.test_set)] = _counts(_scored_model(client), client.test_set)
            env.set_eval_cfg(pre_fit=True, post_fit=True)
            evaluator.final = True
            finalize()

        algorithm.finalize = scored_finalize
        algorithm.run(args.rounds, args.join)
    counts = [evaluator.last.get(id(t)) for t in test]
    if spec.get("score") == "model":  # the clients' own models; fluke's own figure over the clients it scored
        scored, own = [own_models[id(t)] for t in test], [c for c in counts if c is not None]
        return sum(c for c, _ in scored) / sum(t for _, t in scored), {
            "peer_own": sum(c for c, _ in own) / max(sum(t for _, t in own), 1), "peer_own_clients": len(own)}
    if any(c is None for c in counts):
        raise RuntimeError(f"fluke {spec['peer']} scored {sum(c is not None for c in counts)} of {n} clients "
                           "in its finalize")
    return sum(c for c, _ in counts) / sum(t for _, t in counts)


def _counts(model, loader) -> tuple[int, int]:
    """(correct, samples) of ``model``'s argmax on ``loader``."""
    import torch

    model.eval()
    correct = total = 0
    with torch.no_grad():
        for x, y in loader:
            correct += int((model(x).argmax(1) == y).sum())
            total += len(y)
    return correct, total


def _scored_model(client):
    """The model a ``score: "model"`` row scores for a fluke client: its own model as its last round left it
    (FedProto's encoder and head, FedAMP's w_i); FedNH's ProtoNet with the prototypes it trained against (fit writes
    its own class means over them afterwards: :func:`_keep_fednh_trained_prototypes`), its logits."""
    import copy

    from torch import nn

    model = client.model
    if hasattr(client, "trained_prototypes"):
        net = copy.deepcopy(model)
        net.prototypes.data = client.trained_prototypes.clone()

        class Logits(nn.Module):
            def forward(self, x):
                return net(x)[1]

        return Logits()
    return model


def _keep_fednh_trained_prototypes() -> None:
    """fluke's FedNH client overwrites its model's prototypes with its own class means after every fit (the upload,
    ``fednh.py`` ``_update_protos``); keep a copy of the ones it trained against, to score that model. Training is
    untouched."""
    from fluke.algorithms.fednh import FedNHClient
    from fluke.utils.model import unwrap

    update = FedNHClient._update_protos

    def kept(self, protos):
        self.trained_prototypes = unwrap(self.model).prototypes.data.clone()
        return update(self, protos)

    FedNHClient._update_protos = kept
