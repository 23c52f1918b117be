"""FedRoD (Chen & Chao, ICLR 2022): a generic predictor and a personalized head, two losses.

Every client's model is the shared generic predictor (body + generic head, the client net)
plus its own personalized head on the same features (:class:`pfl_cli.fl.heads.TwoHeadNet`).
Each local step, on one batch, the generic predictor descends the Balanced Softmax loss,
cross-entropy of the generic logits plus the log of the client's class counts (the
BSM loss of its balanced risk minimization, robust to clients' label shift), and the
personalized head the cross-entropy of generic + personalized logits with the generic
predictor held fixed (the personalized head "learned to minimize each client's empirical risk on top
of the generic predictor", abstract); the
server averages the generic predictors weighted by client data size (as FedAvg) and each
client keeps its head (the linear personalized head, not the paper's hypernetwork variant).
The personalized prediction is generic + personalized logits; only the generic predictor
travels: 2 x |client net| floats per cohort client and round.

A new client: a fresh personalized head (the shared initialization) trained for
``new_client_epochs`` epochs on the frozen generic predictor (pflx's protocol for private
heads, as FedRep's); with 0 it is served the generic predictor's prediction plus the initial
head. The personalized head starts as a copy of the net's initial classifier, as PFLlib does.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from pfl_cli.algorithms.base import PrivateState, epochs_protocol
from pfl_cli.algorithms.fedavg import FedAvgRoundConfig
from pfl_cli.algorithms.partial import _GlobalModel
from pfl_cli.fl.config import check_own_keys, key
from pfl_cli.fl.params import stack
from pfl_cli.fl.robust import average_uploads, corrupt_uploads


@dataclass(frozen=True)
class FedRoDConfig(FedAvgRoundConfig):
    """FedRoD's keys: FedAvg's round for the generic predictor, and the new-client protocol."""

    algorithm: str = key("fedrod", "the algorithm these keys configure")
    new_client_epochs: int = key(20, "epochs a new client trains its personalized head on the frozen generic model",
                                 "PeFLL (ICLR 2024) App. A.2: a new client's head trained locally for 20 epochs (FedRep)")

    def validate(self) -> None:
        super().validate()
        check_own_keys(self, {"new_client_epochs": "an integer >= 0"})


class FedRoD(PrivateState, _GlobalModel):
    name = "fedrod"
    individual_reads = ""  # under --secagg the mean of the generic models from the cohort's sums
    averages_updates = True  # its server averages the generic models: an update attack and an aggregator act
    paper = "FedRoD: Chen & Chao, ICLR 2022"
    new_client_protocol = "a personalized head trained new_client_epochs on the frozen generic predictor"
    config = FedRoDConfig
    dp_unit = None
    not_distributed = "its two-loss local steps run in one process (no sharding of the cohort across ranks)"
    search_space = {"lr": "log:1e-3:1"}
    search_space_source = "Chen & Chao, FedRoD (ICLR 2022): the client lr per dataset; the BSM loss has no constant"
    tune_group = "train"

    @classmethod
    def floats_per_client_round(cls, arch: dict) -> int:
        from pfl_cli.models import num_parameters

        return 2 * num_parameters(arch["client"])  # the generic predictor down and up; the head stays

    def build(self) -> None:
        from pfl_cli.fl.heads import NET, PERSONAL, TwoHeadNet

        self.net = TwoHeadNet(self.client_net())
        init = {k: v.detach().clone() for k, v in self.net.named_parameters()}
        self.generic = [k for k in init if k.startswith(NET)]
        self.personal = [k for k in init if k.startswith(PERSONAL)]
        self.global_params = {k: init[k] for k in self.generic}
        self.init_personal = {k: init[k] for k in self.personal}
        self.private = self.new_private_state(self.init_personal)

    def _steps(self, start: dict, clients, gen, *, train_generic: bool, **schedule):
        from pfl_cli.fl.heads import balanced_log_prior, two_head_steps

        steps, taken = self.draw_batches(clients, gen, **schedule)
        theta, loss = two_head_steps(self.net, start, self.store, steps, balanced_log_prior(self.store, clients),
                                     train_generic=train_generic, sgd=self.sgd_update_options())
        return theta, loss, taken

    def run_round(self, t, cohort, gen):
        start = {**stack(self.global_params, len(cohort)), **self.private.gather(cohort)}
        theta, loss, _ = self._steps(start, cohort, gen, train_generic=True, **self.round_schedule())
        generic = corrupt_uploads(self, t, cohort, {k: theta[k] for k in self.generic})  # as the server receives it
        self.record_exchange(self.global_params, generic, len(cohort))
        self.global_params = self.server_average(average_uploads(self, cohort, generic, secagg=self.cfg.secagg))
        self.private.scatter(cohort, {k: theta[k] for k in self.personal})
        return loss

    def own_models(self, rows):
        return {**stack(self.global_params, len(rows)), **self.private.gather(rows)}

    def new_clients(self, clients: np.ndarray, gen) -> dict:
        """The initial personalized head trained ``new_client_epochs`` epochs with the generic predictor frozen."""
        start = {**self.global_params, **self.init_personal}
        if not self.cfg.new_client_epochs:
            return stack(start, len(clients))

        def build(sel):
            theta, _, taken = self._steps(stack(start, len(sel)), sel, gen, train_generic=False,
                                          epochs=self.cfg.new_client_epochs)
            self.client_sgd_steps += taken
            return theta

        if not len(clients):
            return {k: v.unsqueeze(0)[:0] for k, v in start.items()}
        return self.chunked(np.asarray(clients, dtype=np.int64), build)

    def protocol(self, new: bool) -> dict:
        return epochs_protocol(new, self.cfg.new_client_epochs,
                               "its own personalized head on the generic predictor",
                               "a personalized head trained {e} epochs on the frozen generic predictor",
                               "the generic predictor with the initial personalized head")
