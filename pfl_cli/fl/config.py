"""Options of ``pflx train`` and ``pflx predict``; each field is the flag of the same name.

Defaults follow the PeFLL paper and the authors' code (``specs/pefll.md`` §1.7, §9): k = 50
local SGD steps with momentum 0.9, batch 32, client gradient clip 50, Adam 2e-4 on the
server with clip 50, lambda_h = lambda_v = 1e-3, lambda_theta = 0, hypernetwork M,
descriptor dimension int(1 + n/4) and 5 clients per round.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

ALGORITHMS = ("pefll", "fedavg", "local", "ldp-fedavg", "ppsgd", "centaur")
CLIENT_ARCHS = ("auto", "lenet", "mlp")
EMBEDDINGS = ("auto", "cnn", "cnn-x", "linear", "mlp", "mlp-x")
HYPER_SIZES = ("S", "M", "L")
SERVER_OPTIMIZERS = ("adam", "sgd")
EVAL_DESCRIPTORS = ("all", "batch")
CLIENT_SETS = ("holdout", "train", "all")


@dataclass(frozen=True)
class TrainConfig:
    """Options of ``pflx train``."""

    algorithm: str = "pefll"
    rounds: int = 1000
    clients_per_round: int = 5
    local_steps: int = 50                 # k: client SGD steps per round (FedAvg, PeFLL)
    batch_size: int = 32
    lr: float = 2e-3                      # client SGD step size
    momentum: float = 0.9                 # client SGD momentum (buffer reset every round)
    client_clip: float = 50.0             # per-client gradient-norm clip before each step (0 = off)
    server_optimizer: str = "adam"        # pefll: adam (code) | sgd (Alg. 8 update rule)
    server_lr: Optional[float] = None     # pefll: server step (default 2e-4); fedavg: step on the mean delta (default 1)
    server_momentum: float = 0.0          # fedavg server momentum / pefll sgd momentum
    server_clip: float = 50.0             # pefll: clip of the server gradient over (eta_h, eta_v) (0 = off)
    lambda_h: float = 1e-3                # Eq. (4.1) regularizers, added as 2*lambda*param (Alg. 8)
    lambda_v: float = 1e-3
    lambda_theta: float = 0.0
    model_arch: str = "auto"              # client net: auto (lenet for images >= 28x28, else mlp) | lenet | mlp
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
    device: str = "auto"
    seed: int = 0
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
    write_nonprivate: bool = False         # also write diagnostics computed on private data (nonprivate*)


@dataclass(frozen=True)
class PredictConfig:
    """Options of ``pflx predict``."""

    clients: str = "holdout"
    label_mask: Optional[bool] = None     # None: as the model was trained
    finetune_steps: Optional[int] = None  # fedavg; None: as trained
    eval_descriptor: Optional[str] = None # pefll; None: as trained
    save_models: bool = False
    batch_size: int = 256                 # evaluation chunk (samples per forward)
    device: str = "auto"
    seed: int = 0


def hidden_sizes(value) -> tuple[int, ...]:
    """``mlp_hidden`` as a tuple: ``32`` and ``[32]`` both mean one hidden layer of 32."""
    return (value,) if isinstance(value, int) and not isinstance(value, bool) else tuple(value)
