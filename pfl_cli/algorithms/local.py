"""Local: every client trains its own model on its own data, with no communication.

The PeFLL paper's baseline (thesis §4.4, App. B.1.2: 200 epochs per client). There are no
rounds: a client's model is ``local_epochs`` passes of local SGD from a shared seeded
initialization, so a client never seen in training gets its model the same way, and
all clients of a group train together as one vmapped computation.

``adapters=lora`` (:mod:`pfl_cli.fl.adapters`): each client trains LoRA adapters and the classifier on model_arch's
net frozen (its seeded start or ``lora_base_weights``) instead of the full net: the adapters are all it personalizes.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from pfl_cli.algorithms.base import Algorithm
from pfl_cli.fl.adapters import AdapterKeys, AdapterTraining, adapted_arch
from pfl_cli.fl.config import key
from pfl_cli.fl.params import cpu_tree


DEFAULT_EPOCHS = 200


@dataclass(frozen=True)
class LocalConfig(AdapterKeys):
    """Local's keys: no rounds are communicated, each client trains local_epochs on its own data (its full net, or
    LoRA adapters on it with adapters=lora)."""

    algorithm: str = key("local", "the algorithm these keys configure")
    local_epochs: int = key(DEFAULT_EPOCHS, "epochs of local SGD per client", "thesis §4.4, App. B.1.2: 200 epochs")


class Local(AdapterTraining, Algorithm):
    name = "local"
    # under --secagg (pfl_cli.fl.secagg)
    individual_reads = "nothing: there is no server step (each client trains alone), so secure aggregation has nothing to hide"
    search_space = {"lr": "log:1e-3:1"}
    search_space_source = ("each client's own SGD: the lr is the one key (Scott 2026 thesis §4.4 tunes every "
                           "baseline's lr on validation data)")
    tune_group = "train"
    paper = "Local training, the PeFLL paper's baseline (thesis §4.4, App. B.1.2)"
    new_client_protocol = "trains its own model from the shared initialization"
    config = LocalConfig
    federated = False

    @staticmethod
    def resolve_arch(cfg, store) -> dict:
        return adapted_arch(cfg, store, Algorithm.resolve_arch(cfg, store))

    def build(self) -> None:
        self.net = self.client_net()
        self.init_params = {k: v.detach().clone() for k, v in self.net.named_parameters()}

    @staticmethod
    def floats_per_client_round(arch: dict) -> int:
        return 0  # no communication

    def protocol(self, new: bool) -> dict:
        epochs = self.cfg.local_epochs or DEFAULT_EPOCHS
        return {"protocol": f"local training from the shared initialization, {epochs} epochs", "rounds": 0}

    def personalize(self, clients: np.ndarray, gen):
        epochs = self.cfg.local_epochs or DEFAULT_EPOCHS
        return self.train_clients(self.init_params, clients, gen, epochs=epochs), True

    def state(self):
        return {"init": self.init_params}

    def load_state(self, state):
        self.init_params = {k: v.to(self.device) for k, v in state["init"].items()}

    def weights(self):
        return {"client_init": cpu_tree(self.init_params)}

    def load_weights(self, weights):
        self.init_params = {k: v.to(self.device) for k, v in weights["client_init"].items()}
