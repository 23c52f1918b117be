"""Options of ``pflx train`` and ``pflx predict``; each field is the flag of the same name.

Defaults follow the PeFLL paper and the authors' code (``specs/pefll.md`` §1.7, §9): k = 50
local SGD steps with momentum 0.9, batch 32, client gradient clip 50, Adam 2e-4 on the
server with clip 50, lambda_h = lambda_v = 1e-3, lambda_theta = 0, hypernetwork M,
descriptor dimension int(1 + n/4) and 5 clients per round.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from pfl_cli.schema import register_choices

ALGORITHMS = ("pefll", "fedavg", "local", "pfedhn", "pfedhn-pc", "hyperfl", "hyperfl-lpm", "fedprox", "fedper", "fedrep", "lg-fedavg", "ditto", "apfl", "perfedavg",
              "pfedme", "knnper", "flowdup", "ld-fedavg", "ldp-fedavg", "ppsgd", "centaur")
VARIANTS = ("fo", "hf")                # perfedavg: first-order MAML | Hessian-free
CLIENT_ARCHS = ("auto", "lenet", "mlp", "hyperfl-cnn")
EMBEDDINGS = ("auto", "cnn", "cnn-x", "linear", "mlp", "mlp-x")
BACKBONE_TUNES = ("adapters", "probe", "full")  # models.pretrained.TUNES (kept here: no torch import for the schema)
HYPER_SIZES = ("S", "M", "L")
SERVER_OPTIMIZERS = ("adam", "sgd")
EVAL_DESCRIPTORS = ("all", "batch")
CLIENT_SETS = ("holdout", "train", "all")
COHORT_EXECS = ("auto", "vmap", "loop")


@dataclass(frozen=True)
class TrainConfig:
    """Options of ``pflx train``."""

    algorithm: str = "pefll"
    rounds: int = 1000
    clients_per_round: Optional[int] = None  # None: the algorithm's default (5; pfedhn 1 as its paper; hyperfl all)
    local_steps: int = 50                 # k: client SGD steps per round (FedAvg, PeFLL)
    batch_size: int = 32
    lr: float = 2e-3                      # client SGD step size
    momentum: float = 0.9                 # client SGD momentum (buffer reset every round)
    client_clip: float = 50.0             # per-client gradient-norm clip before each step (0 = off)
    server_optimizer: str = "adam"        # pefll: adam (code) | sgd (Alg. 8 update rule)
    server_lr: Optional[float] = None     # pefll: server step (adam 2e-4, sgd 1 = Alg. 8); fedavg: step on the mean delta (default 1)
    server_momentum: float = 0.0          # fedavg server momentum / pefll sgd momentum
    server_clip: Optional[float] = None   # pefll: clip of the server gradient over (eta_h, eta_v): adam 50, sgd off (0 = off)
    lambda_h: float = 1e-3                # Eq. (4.1) regularizers, added as 2*lambda*param (Alg. 8)
    lambda_v: float = 1e-3
    lambda_theta: float = 0.0
    model_arch: str = "auto"              # client net: auto (lenet for images >= 28x28, else mlp) | lenet | mlp
    backbone: str = ""                    # a pre-trained backbone client net instead: vit-s16 | resnet18 | vit-micro | resnet-micro
    backbone_weights: str = ""            # its local state dict (.pth / .safetensors, timm / torchvision keys); "" = random
    backbone_tune: str = "adapters"       # adapters (frozen backbone + adapters) | probe (classifier only) | full (FPT)
    mlp_hidden: tuple = (32,)
    embedding: str = "auto"               # auto (cnn for images, mlp for vectors) | cnn | cnn-x | linear | mlp | mlp-x
    embed_dim: int = 0                    # l; 0 = int(1 + n_clients / 4) (§2.4)
    hyper_size: str = "M"                 # S/M/L = 1/3/5 hidden layers (Table B.5)
    hyper_hidden: int = 100
    descriptor_batch: int = 32            # samples per training descriptor (§1.1)
    eval_descriptor: str = "all"          # descriptor at evaluation: all train samples (code) | one batch (paper)
    standardize_descriptor: bool = True   # the code's frozen scalar (v - m) / s from the first descriptor (§9.3)
    label_mask: bool = False              # evaluation: classes absent from a client's train data get -inf
    finetune_steps: int = 0               # fedavg: local steps from the global model before evaluation
    local_epochs: Optional[int] = None    # local: epochs of per-client training (default 200); fedavg: epochs instead of k
    eval_every: int = 50
    val_fraction: float = 0.1             # of every train client's train samples, for model selection
    normalize: bool = True                # standardize inputs with train-pool statistics (per channel / feature)
    checkpoint_every: int = 0             # rounds between checkpoints; 0 = at every evaluation
    # ---- personalized-FL baselines (issue 13): each key is the symbol of its algorithm's paper ----
    mu: float = 0.0                       # fedprox: proximal weight mu of Eq. 2 (0 = FedAvg)
    lam: Optional[float] = None           # lambda: ditto's proximal weight to the global model (default 0.1); pfedme's Moreau-envelope weight (default 15)
    head_epochs: int = 5                  # fedrep: epochs on the head per round, body frozen (PeFLL §4.1: 5)
    body_epochs: int = 1                  # fedrep: epochs on the body per round, head frozen (PeFLL §4.1: 1)
    new_client_epochs: int = 20           # fedrep/fedper: new head; lg-fedavg: new body; ditto: personal model; apfl: v and alpha
    alpha: float = 0.5                    # apfl: initial mixing weight alpha in [0, 1]
    alpha_lr: Optional[float] = None      # apfl: step size of alpha (default lr; 0 keeps alpha fixed)
    variant: str = "fo"                   # perfedavg: fo (first-order) | hf (Hessian-free); its alpha is lr
    beta: Optional[float] = None          # perfedavg: outer step beta (default lr); pfedme: server mixing beta (default 1)
    K: int = 3                            # pfedme: gradient steps on the inner (personalized) problem
    personal_lr: Optional[float] = None   # pfedme: step size of those K steps (default lr)
    knn_k: int = 10                       # knnper: neighbours k (PeFLL §4.1: 5 or 10)
    knn_scale: float = 100.0              # knnper: distance scale T of exp(-d / T) (PeFLL §4.1: 100)
    interpolation: float = 0.5            # knnper: weight lambda of the kNN distribution (0 = the global model)
    device: str = "auto"
    cohort_exec: str = "auto"             # cohort local SGD: vmap | loop | auto (the faster one measured for device + net)
    seed: int = 0
    # -- clients without labels, FLowDUP and LD-FedAvg (issue 15; thesis ch. 5) --
    evaluate_hidden_labels: bool = False  # evaluation scores unlabeled clients against their hidden labels (oracle)
    subspace_dim: int = 200               # flowdup, ld-fedavg: k of theta = theta_0 + P v (thesis: 10^4)
    subspace_nnz: int = 4                 # nonzeros per row of the seeded sparse P
    feature_dim: int = 64                 # flowdup: e, h_1's output width (thesis: 256); h_2's hidden is hyper_hidden
    lambda_reg: float = 1e-3              # flowdup: lambda of Omega = ||h(X) - psi_r||^2 (eq. 5.4)
    labeled_rate: float = 0.9             # flowdup: alpha, the labeled share of every cohort (Alg. 9)
    learnable_centre: bool = True         # flowdup: learn psi_r (False: psi_r = 0, Table C.4)
    track_descriptors: bool = False       # pefll: log Spearman(descriptor, label-distribution distances) of holdout clients
    # -- differential privacy (issue 10): --dp eps=E[,delta=D][,clip=C] and --write-nonprivate.
    # fedavg, pefll: client-level DP-FedAvg (pfl_cli.fl.dp); ldp-fedavg, ppsgd, centaur: example-level
    # DP-SGD on every client (pfl_cli.fl.dpsgd). dp_epsilon None = no DP.
    dp_epsilon: Optional[float] = None
    dp_delta: float = 1e-6                 # checked < 1/dp_population when that public bound is given
    dp_clip: Optional[float] = None        # public L2 bound: a client's update, or one sample's gradient (ldp-*)
    dp_population: Optional[int] = None    # public bound N on the privacy units: clients (client-level; sets
                                           # q = clients_per_round / N) or one client's records (ldp-*)
    dp_sampling_rate: Optional[float] = None  # Poisson rate q: of clients (client-level; None = clients_per_round /
                                              # train clients) or of a client's records (ldp-*; required)
    dp_accountant: str = "rdp"             # rdp | pld
    dp_noise: str = "secure"               # secure (OS entropy) | seeded (repeatable; simulation only)
    write_nonprivate: bool = False         # also write diagnostics computed on private data (nonprivate*)
    # --- hypernetwork family: pfedhn, pfedhn-pc, hyperfl (issue 11; specs/pfedhn-hyperfl.md A.8, B.6) ---
    hn_momentum: float = 0.9              # pfedhn: momentum of the server SGD on (phi, embeddings)
    hn_weight_decay: float = 1e-3         # pfedhn: its weight decay (touches the whole embedding table, A.4)
    embed_lr: Optional[float] = None      # pfedhn: step of the embedding rows (default: the server lr); hyperfl: eta_v (default --lr)
    head_lr: Optional[float] = None       # hyperfl: classifier step eta_g (default 0.1)
    embed_rounds: int = 20                # pfedhn new clients: rounds of K local steps that train a fresh embedding
    client_sizes: str = ""                # pfedhn(-pc): target widths "S,M,L" (client j gets the size j mod 3); "" = one size


@dataclass(frozen=True)
class PredictConfig:
    """Options of ``pflx predict``."""

    clients: str = "holdout"
    label_mask: Optional[bool] = None     # None: as the model was trained
    finetune_steps: Optional[int] = None  # fedavg; None: as trained
    eval_descriptor: Optional[str] = None # pefll; None: as trained
    # --- hypernetwork family (issue 11): new-client protocols; None: as trained ---
    embed_rounds: Optional[int] = None    # pfedhn / pfedhn-pc: rounds training a new client's embedding
    local_epochs: Optional[int] = None    # hyperfl: local epochs training a new client's embedding and classifier
    save_models: bool = False
    batch_size: int = 256                 # evaluation chunk (samples per forward)
    device: str = "auto"
    seed: int = 0
    # -- clients without labels (issue 15) --
    evaluate_hidden_labels: bool = False  # score unlabeled clients against their hidden labels (an oracle)
    predictions: bool = True              # write predictions.npz (client, sample, predicted class, probabilities)


register_choices(TrainConfig, algorithm=lambda: ALGORITHMS, model_arch=CLIENT_ARCHS, embedding=EMBEDDINGS,
                 hyper_size=HYPER_SIZES, server_optimizer=SERVER_OPTIMIZERS, eval_descriptor=EVAL_DESCRIPTORS,
                 backbone_tune=BACKBONE_TUNES)
register_choices(PredictConfig, clients=CLIENT_SETS, eval_descriptor=EVAL_DESCRIPTORS)


CLIENT_SIZES = ("S", "M", "L")  # pFedHN App. B: LeNet conv1 with 8 / 16 / 32 filters; MLP widths x 1/2, 1, 2


def client_sizes(value: str) -> list[str]:
    """``"S,M,L"`` -> ``["S", "M", "L"]``; ``""`` -> ``[]`` (one size)."""
    return [s.strip() for s in str(value).split(",") if s.strip()]


def hidden_sizes(value) -> tuple[int, ...]:
    """``mlp_hidden`` as a tuple: ``32`` and ``[32]`` both mean one hidden layer of 32."""
    return (value,) if isinstance(value, int) and not isinstance(value, bool) else tuple(value)


def planned_cohort(cfg) -> int | None:
    """Clients per round: ``--clients-per-round``, or the algorithm's own default (None: every train client)."""
    from pfl_cli.algorithms import REGISTRY

    return cfg.clients_per_round if cfg.clients_per_round is not None else REGISTRY[cfg.algorithm].default_cohort
