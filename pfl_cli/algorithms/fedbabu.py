"""FedBABU (Oh, Kim, Yun, ICLR 2022): body aggregation, a frozen random head, fine-tuning to personalize.

During federated training the head (the classifier, the net's last layer) keeps its random
initialization and is never updated: a cohort client trains only the body from the global
model with FedAvg's local steps (or ``local_epochs``), and the server averages the bodies,
weighted by client data size (Figure 1 (b); the authors' scripts: ``--local_upt_part body --aggr_part body``). Every client shares the same
fixed head, so it never travels: 2 x |body| floats per cohort client and round. A client's
personalized model, seen in training or not, is the global model (body and the frozen head)
fine-tuned whole for ``finetune_epochs`` epochs on its own data (abstract: "the head is fine-tuned
for personalization during the evaluation process"; pflx fine-tunes body and head at the one lr). No
private state: the fine-tuning runs wherever a client is evaluated.

Peers: PFLlib's FedBABU fine-tunes every client for 10 epochs (``fine_tuning_epochs``); the
authors' code fine-tunes 5 epochs (``utils/options.py``: ``--ft_ep 5``), pflx's default.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from pfl_cli.algorithms.fedavg import FedAvg, FedAvgRoundConfig
from pfl_cli.errors import ConfigError
from pfl_cli.fl.config import key
from pfl_cli.fl.params import broadcast
from pfl_cli.fl.robust import average_uploads


@dataclass(frozen=True)
class FedBABUConfig(FedAvgRoundConfig):
    """FedBABU's keys: FedAvg's round on the body, and the fine-tuning that personalizes."""

    algorithm: str = key("fedbabu", "the algorithm these keys configure")
    finetune_epochs: int = key(5, "epochs every client fine-tunes the whole global model (body and head) on its own "
                               "data before evaluation (0: the global model with its random head)",
                               "FedBABU (ICLR 2022) authors' code, utils/options.py: --ft_ep 5 (fine-tuning epochs)")

    def validate(self) -> None:
        super().validate()
        v = self.finetune_epochs
        if isinstance(v, bool) or not isinstance(v, int) or v < 0:
            raise ConfigError(f"finetune_epochs must be an integer >= 0 for fedbabu; got {v!r}.")


class FedBABU(FedAvg):
    name = "fedbabu"
    compressible_upload = True  # the body's delta (the head is fixed and never sent)
    async_ready = ("its body is FedAvg's model with a fixed head: the body could take FedBuff's buffered step")
    averages_updates = True  # its round ends in server_mean: an update attack and a robust aggregator act there
    individual_reads = ""  # runs under --secagg: its shared body averaged from sums (fl.secagg.cohort_mean)
    paper = "FedBABU: Oh, Kim, Yun, ICLR 2022"
    new_client_protocol = "the global body and frozen head fine-tuned whole for finetune_epochs"
    config = FedBABUConfig
    dp_unit = None  # no DP variant declared (FedAvg's DP-FedAvg is not inherited)
    models_upload = False  # its upload is the body alone, not FedAvg's whole model
    serves_unlabeled = ""
    search_space = {"lr": "log:1e-3:1", "finetune_epochs": "int:1:10"}
    search_space_source = ("Oh et al., FedBABU (ICLR 2022): the lr per task (their scripts: 0.1 with momentum 0.9), "
                           "and the fine-tuning epochs (their default 5)")
    tune_group = "train"

    @property
    def finetune_steps(self) -> int:  # FedAvg's step-counted fine-tuning is not FedBABU's
        return 0

    @property
    def needs_labels_to_predict(self) -> bool:
        return self.cfg.finetune_epochs > 0

    @classmethod
    def floats_per_client_round(cls, arch: dict) -> int:
        from pfl_cli.fl.split import part_floats

        return 2 * part_floats(arch["client"], "body", cls.name)

    def build(self) -> None:
        from pfl_cli.fl.split import split_names

        super().build()
        self.body, self.head = split_names(self.net, self.name)
        self.personalized = self.cfg.finetune_epochs > 0

    def run_round(self, t, cohort, gen):
        # The head is a fixed part of every client's model: only the body moves (Figure 1 (b)).
        theta, loss, _ = self.cohort_sgd(broadcast(self.global_params, len(cohort)), cohort, gen,
                                         **self.round_schedule(), trainable=self.body)
        body = self.byzantine_uploads(t, cohort, {k: theta[k] for k in self.body})
        if self.upload_codec is not None:  # the body's delta as compressed on the wire (pfl_cli.fl.compression)
            body = self.upload_codec.compress_models(self, cohort, {k: self.global_params[k] for k in self.body}, body)
        else:
            self.record_exchange({k: self.global_params[k] for k in self.body}, body, len(cohort))
        # the aggregator's average (--secagg: the mean from sums only, pfl_cli.fl.secagg)
        self.server_step(average_uploads(self, cohort, body, secagg=self.cfg.secagg))
        return loss

    def server_step(self, mean: dict) -> None:
        """The body moves towards the cohort's mean body; the head stays at its initialization."""
        self.server_update({k: (mean[k] - g if k in mean else g.new_zeros(g.shape))
                            for k, g in self.global_params.items()})

    def protocol(self, new: bool) -> dict:
        e = self.cfg.finetune_epochs
        return {"protocol": f"global model fine-tuned {e} epochs (body and head)" if e else "global model",
                "rounds": 0}

    def personalize(self, clients: np.ndarray, gen):
        if self.cfg.finetune_epochs > 0:
            return self.train_clients(self.global_params, np.asarray(clients, dtype=np.int64), gen,
                                      epochs=self.cfg.finetune_epochs), True
        return self.global_params, False
