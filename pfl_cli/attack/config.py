"""Options of ``pflx attack``; each field is the flag of the same name."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

ATTACKS = ("dlg", "ig", "rog", "analytic")
OPTIMIZED = ("dlg", "ig", "rog")
ATTACK_CHOICES = (*ATTACKS, "all")
ATTACK_CLIENTS = ("holdout", "train")
UPLOADS = ("gradient", "weights")


@dataclass(frozen=True)
class AttackConfig:
    """Options of ``pflx attack``."""

    clients: str = "holdout"     # whose data is attacked: holdout | train clients of the partition
    images: int = 8              # images attacked in all (a multiple of batch_size)
    batch_size: int = 1          # images per upload (one client's batch)
    attack: str = "ig"           # dlg | ig | rog | analytic | all
    rog_scale: int = 2           # rog: the image is optimized at 1/rog_scale of its side
    iterations: int = 2000       # Adam steps of dlg / ig / rog (the paper: IG 10000, ROG 100)
    lr: float = 0.1              # initial Adam step of dlg / ig / rog (paper: IG 0.1, ROG 0.05)
    unknowns_lr: Optional[float] = None  # initial Adam step of the joint attack's unknowns; None: lr (the paper)
    tv: float = 1e-6             # ig total-variation weight (paper: 1e-6)
    upload: str = "gradient"     # gradient: the gradient or the k-step delta (local_steps); weights: the round's update as trained
    local_steps: int = 0         # upload gradient: 0 the gradient (FedSGD); k the delta after k local SGD steps
    infer_labels: bool = False   # iDLG label rule (batch size 1) instead of the known labels
    lpips_weights: Optional[str] = None  # local AlexNet-LPIPS state dict; None: no LPIPS
    device: str = "auto"
    seed: int = 0
