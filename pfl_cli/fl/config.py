"""Options of ``pflx train`` and ``pflx predict``; each field is the flag of the same name.

Defaults follow the PeFLL paper and the authors' code (``specs/pefll.md`` §1.7, §9): k = 50
local SGD steps with momentum 0.9, batch 32, client gradient clip 50, Adam 2e-4 on the
server with clip 50, lambda_h = lambda_v = 1e-3, lambda_theta = 0, hypernetwork M,
descriptor dimension int(1 + n/4) and 5 clients per round.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

ALGORITHMS = ("pefll", "fedavg", "local", "pfedhn", "pfedhn-pc", "hyperfl")
CLIENT_ARCHS = ("auto", "lenet", "mlp", "hyperfl-cnn")
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
    clients_per_round: Optional[int] = None  # None: the algorithm's default (5; pfedhn 1 as its paper; hyperfl all)
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
    # --- hypernetwork family: pfedhn, pfedhn-pc, hyperfl (issue 11; specs/pfedhn-hyperfl.md A.8, B.6) ---
    hn_momentum: float = 0.9              # pfedhn: momentum of the server SGD on (phi, embeddings)
    hn_weight_decay: float = 1e-3         # pfedhn: its weight decay (touches the whole embedding table, A.4)
    embed_lr: Optional[float] = None      # pfedhn: step of the embedding rows (default: the server lr); hyperfl: eta_v (default --lr)
    head_lr: Optional[float] = None       # hyperfl: classifier step eta_g (default 0.1)
    embed_rounds: int = 20                # pfedhn new clients: rounds of K local steps that train a fresh embedding
    client_sizes: str = ""                # pfedhn: target widths "S,M,L" (client j gets the size j mod 3); "" = one size


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


CLIENT_SIZES = ("S", "M", "L")  # pFedHN App. B: LeNet conv1 with 8 / 16 / 32 filters; MLP widths x 1/2, 1, 2


def client_sizes(value: str) -> list[str]:
    """``"S,M,L"`` -> ``["S", "M", "L"]``; ``""`` -> ``[]`` (one size)."""
    return [s.strip() for s in str(value).split(",") if s.strip()]


def hidden_sizes(value) -> tuple[int, ...]:
    """``mlp_hidden`` as a tuple: ``32`` and ``[32]`` both mean one hidden layer of 32."""
    return (value,) if isinstance(value, int) and not isinstance(value, bool) else tuple(value)
