"""FedIT (Zhang et al., "Towards Building the Federated GPT: Federated Instruction Tuning", ICASSP 2024, §3):
FedAvg on LoRA adapters.

Each client trains the adapters (A and B of every adapted layer) and the classifier on a frozen base net, and the
server averages all of them weighted by client data size, as FedAvg averages a whole model (§3: FedAvg's
aggregation applied to the LoRA parameters). Only the adapters and the classifier travel. A client's
model is the global adapter, or it fine-tuned ``finetune_steps`` steps on its own data (new clients the same).
With ``adapter=ia3`` the adapters are IA3's vectors (Liu et al., NeurIPS 2022, §3.3), averaged the same way.

Under client-level ``--dp`` the round is DP-FedAvg's (McMahan et al. 2018, Alg. 1; :mod:`pfl_cli.fl.dp`) on what
travels: each client's delta of A, B and the classifier, clipped jointly to L2 ``clip``, the noisy sum divided by
the fixed denominator. The frozen base is a public input (seeded, or ``lora_base_weights``) and is never released.
"""

from __future__ import annotations

from dataclasses import dataclass

from pfl_cli.algorithms.fedavg import FedAvg, FedAvgConfig
from pfl_cli.algorithms.lora_common import LoRAClient, LoRAKeys
from pfl_cli.fl.config import key


@dataclass(frozen=True)
class FedITConfig(FedAvgConfig, LoRAKeys):
    """FedIT's keys: FedAvg's round and the LoRA keys."""

    algorithm: str = key("fedit", "the algorithm these keys configure")


class FedIT(LoRAClient, FedAvg):
    name = "fedit"
    individual_reads = ""  # runs under --secagg: FedAvg's secure round on what it trains (adapters, classifier)
    search_space = {"lr": "log:1e-3:1"}
    search_space_source = ("Zhang et al. 2024 (FedIT) §4: the local step size is the tuned setting (FedAvg's "
                           "client lr over its log range)")
    tune_group = "train"
    paper = "FedIT: Zhang et al., ICASSP 2024 §3 (FedAvg on LoRA adapters)"
    new_client_protocol = "the global adapter, or it fine-tuned finetune_steps local steps"
    config = FedITConfig
    serves_unlabeled = "fedit without --finetune-steps (one global adapter)"
    dp_unit = "client"  # FedAvg.aggregate's DP-FedAvg branch, on the adapters and the classifier (all it trains)
    dp_contribution = "adapter (A and B, or IA3's vectors) and classifier delta"
    adapter_kinds = ("lora", "ia3")  # FedAvg averages whatever the client trains: IA3's vectors as well as A and B
