"""FedOpt: FedAvg's clients with an adaptive server optimizer (Reddi et al., ICLR 2021, Alg. 2).

"Adaptive Federated Optimization" (Reddi, Charles, Zaheer, Garrett, Rush, Konečný, Kumar,
McMahan) keeps FedAvg's client work (ClientOpt = SGD from the global model, E local epochs or
K steps) and treats the cohort's mean model delta as a pseudo-gradient of a server optimizer:
FedAdagrad, FedYogi or FedAdam (``server_optimizer``), with momentum ``beta1``, second-moment
decay ``beta2`` (not used by Adagrad) and adaptivity ``tau`` (:func:`pfl_cli.fl.server_optim.adaptive_step`).
Alg. 2 averages the deltas uniformly over the cohort; pflx weighs them by the clients' data
sizes, as its FedAvg (McMahan et al. 2017 Alg. 1) does, so that FedOpt with the server step of
FedAvg differs from FedAvg in the server optimizer alone (equal sizes: Alg. 2's mean exactly).
A client unseen in training uses the global model, or fine-tunes it ``finetune_steps`` steps, as FedAvg's.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from pfl_cli.algorithms.fedavg import FedAvg
from pfl_cli.fl.config import key
from pfl_cli.fl.finetune import FinetuneAdapterKeys
from pfl_cli.fl.server_optim import SERVER_OPTIMIZERS, adaptive_step, init_moments

REDDI = "Reddi et al., ICLR 2021"


@dataclass(frozen=True)
class FedOptConfig(FinetuneAdapterKeys):
    """FedOpt's keys: FedAvg's round and Alg. 2's server optimizer."""

    algorithm: str = key("fedopt", "the algorithm these keys configure")
    rounds: int = key(1500, "communication rounds", f"{REDDI}, App. C: 1500 rounds on EMNIST CR and Stack Overflow")
    clients_per_round: Optional[int] = key(10, "cohort size of every round (null: every train client)",
                                           f"{REDDI}, §5: 10 clients per round (Stack Overflow 50)")
    local_steps: int = key(50, "K: client SGD steps per round, when local_epochs is null")
    local_epochs: Optional[int] = key(1, "E: epochs of local SGD per round (null: local_steps steps)",
                                      f"{REDDI}, §5: clients train E = 1 epoch")
    lr: float = key(10 ** -1.5, "client SGD step size eta_l",
                    f"{REDDI}, §5 / App. D: eta_l tuned on the grid 10^-3 ... 10^0.5 (step 10^0.5); 10^-1.5 inside it")
    momentum: float = key(0.0, "client SGD momentum", f"{REDDI}, §5: ClientOpt is SGD (no momentum)")
    server_optimizer: str = key("adam", "adam (FedAdam) | yogi (FedYogi) | adagrad (FedAdagrad)",
                                f"{REDDI}, Alg. 2", choices=SERVER_OPTIMIZERS)
    server_lr: float = key(1e-2, "server step size eta",
                           f"{REDDI}, §5 / App. D: eta tuned on the grid 10^-3 ... 10^1 (step 10^0.5); 10^-2 inside it")
    beta1: float = key(0.9, "momentum of the pseudo-gradient, m <- beta1 m + (1 - beta1) Delta",
                       f"{REDDI}, §5: beta1 = 0.9")
    beta2: float = key(0.99, "second-moment decay of adam and yogi (adagrad sums, it takes none)",
                       f"{REDDI}, §5: beta2 = 0.99")
    tau: float = key(1e-3, "adaptivity: the step is eta m / (sqrt(v) + tau); v starts at tau^2",
                     f"{REDDI}, §5: tau = 10^-3 (App. E: its sensitivity)")
    finetune_steps: int = key(0, "local steps from the global model before evaluation (0: the global model)",
                              "FedAvg's protocol: a new client uses the global model as-is")

    def validate(self) -> None:
        super().validate()
        from pfl_cli.errors import ConfigError
        from pfl_cli.fl.config import check_own_keys, inert_refusal

        check_own_keys(self, {"server_lr": "a finite number > 0", "tau": "a finite number > 0"})
        for name in ("beta1", "beta2"):
            value = getattr(self, name)
            if not (isinstance(value, (int, float)) and not isinstance(value, bool) and 0 <= value < 1):
                raise ConfigError(f"{name} must be a number in [0, 1) for {self.algorithm} (Alg. 2's decay "
                                  f"parameters); got {value!r}.")
        if self.server_optimizer == "adagrad" and self.beta2 != 0.99:
            raise inert_refusal("beta2", self.algorithm, "its server optimizer is adagrad, which sums the squared "
                                "deltas (beta2 is adam's and yogi's: --set server_optimizer=adam)", self.beta2)


class FedOpt(FedAvg):
    name = "fedopt"
    compressible_upload = True  # FedAvg's round and upload (its aggregate compresses the deltas)
    averages_updates = True  # FedAvg.aggregate: an update attack and a robust aggregator act there (issue 48)
    individual_reads = ""  # runs under --secagg: FedAvg's aggregate_secure (pfl_cli.fl.secagg)
    # Their clients run FedAvg's round, but `pflx attack`'s upload model has not been checked against them, and they
    # take no --dp: not attacked until a test says the modelled upload is theirs.
    models_upload = False
    upload_under_dp = False
    search_space = {"lr": "log:1e-3:3.16", "server_lr": "log:1e-3:10", "tau": "log:1e-5:0.1"}
    search_space_source = (f"{REDDI}, §5 / App. D: client lr on 10^-3 ... 10^0.5 and server lr on 10^-3 ... 10^1 "
                           "(log grids); tau on 10^-5 ... 10^-1 (App. E)")
    tune_group = "train"
    paper = f"FedOpt (FedAdam / FedYogi / FedAdagrad): {REDDI}, Alg. 2"
    new_client_protocol = "the global model, or it fine-tuned finetune_steps steps"
    config = FedOptConfig
    serves_unlabeled = "fedopt without --finetune-steps (one global model)"

    def build(self) -> None:
        super().build()
        del self.server_buf  # FedAvg's momentum buffer: Alg. 2 keeps m and v instead
        self.server_m, self.server_v = init_moments(self.global_params, tau=self.cfg.tau)

    def server_update(self, mean_delta: dict) -> None:
        """Alg. 2 lines 11-14 on the cohort's mean delta (:func:`pfl_cli.fl.server_optim.adaptive_step`)."""
        cfg = self.cfg
        self.global_params, self.server_m, self.server_v = adaptive_step(
            self.global_params, self.server_m, self.server_v, mean_delta, optimizer=cfg.server_optimizer,
            lr=cfg.server_lr, beta1=cfg.beta1, beta2=cfg.beta2, tau=cfg.tau)

    def state(self):
        return {"global": {k: v.detach().clone() for k, v in self.global_params.items()},
                "server_m": {k: v.detach().clone() for k, v in self.server_m.items()},
                "server_v": {k: v.detach().clone() for k, v in self.server_v.items()}}

    def load_state(self, state):
        self.global_params = {k: v.to(self.device) for k, v in state["global"].items()}
        self.server_m = {k: v.to(self.device) for k, v in state["server_m"].items()}
        self.server_v = {k: v.to(self.device) for k, v in state["server_v"].items()}
