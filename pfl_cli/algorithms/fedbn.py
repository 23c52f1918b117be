"""FedBN (Li, Jiang, Zhang, Kamp, Dou, ICLR 2021, Algorithm 1): FedAvg that keeps batch normalization local.

The client net has batch-normalization layers (``model_arch`` ``mlp-bn`` or ``lenet-bn``,
:mod:`pfl_cli.models.normalized`). Each round a cohort client takes the global model's other
layers with its own normalization layers, trains the whole net with FedAvg's local steps (or
``local_epochs``), and keeps its normalization layers (affine weights and running statistics);
the server averages every other layer uniformly over the cohort (Algorithm 1: (1/K) sum_k; the authors'
code, ``federated/fed_digits.py``: ``client_weights = 1 / client_num``, keys with "bn" skipped). Only
those layers travel: 2 x (|client net| - |normalization parameters|) floats per cohort client and
round. A train client's model is the global layers with its own normalization layers.

A client unseen in training has no normalization layers of its own (the paper evaluates the
clients it trained on): it starts from the initial ones (weight 1, bias 0, statistics 0 / 1) and
trains their weights, the global layers frozen, for ``new_client_epochs`` epochs on its own data;
its statistics are then those of all its samples under the trained layers (pflx's choice: a few
epochs of running averages from 0 / 1 are far from them). FedBN on a net without normalization
layers is refused.

Peers: PFLlib's FedBN averages the shared layers weighted by client data size; the paper's
Algorithm 1 (and pflx) average them uniformly.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass

import numpy as np

from pfl_cli.algorithms.base import PrivateState, epochs_protocol
from pfl_cli.algorithms.fedavg import FedAvgRoundConfig
from pfl_cli.algorithms.partial import _GlobalModel
from pfl_cli.errors import InputError
from pfl_cli.fl.config import CLIENT_ARCHS, check_own_keys, key, model_kind
from pfl_cli.fl.params import stack
from pfl_cli.fl.robust import average_uploads, corrupt_uploads


@dataclass(frozen=True)
class FedBNConfig(FedAvgRoundConfig):
    """FedBN's keys: FedAvg's round on a batch-norm client net (``model_arch`` mlp-bn here), and new clients."""

    algorithm: str = key("fedbn", "the algorithm these keys configure")
    model_arch: str = key("mlp-bn", "client net: mlp-bn | lenet-bn (a net with batch-norm layers, kept local)",
                          "FedBN (ICLR 2021) authors' code, nets/models.py: a BatchNorm after every layer but the last",
                          choices=CLIENT_ARCHS, also=model_kind)  # a kind's net: refused in validate, saying why
    new_client_epochs: int = key(20, "epochs a new client trains its own normalization layers, the rest frozen",
                                 "PeFLL (ICLR 2024) App. A.2: new clients of the baselines train 20 local epochs")

    def validate(self) -> None:
        from pfl_cli.errors import ConfigError

        if model_kind(self.model_arch) is not None:
            raise ConfigError(f"model_arch {self.model_arch!r}: fedbn keeps each client's batch-norm statistics, which "
                              "a model kind's net does not carry per client (its BatchNorm statistics are fixed, "
                              "docs/models.md); use model_arch mlp-bn or lenet-bn.")
        super().validate()
        check_own_keys(self, {"new_client_epochs": "an integer >= 0"})


class FedBN(PrivateState, _GlobalModel):
    name = "fedbn"
    individual_reads = ""  # under --secagg the uniform mean of the shared layers from the cohort's sums
    averages_updates = True  # its server averages the layers outside batch norm: an attack and an aggregator act
    paper = "FedBN: Li, Jiang, Zhang, Kamp, Dou, ICLR 2021"
    new_client_protocol = "its own normalization layers trained new_client_epochs, the global layers frozen"
    config = FedBNConfig
    dp_unit = None
    local_normalization = True
    not_distributed = "its batch-norm local steps run in one process (no sharding of the cohort across ranks)"
    search_space = {"lr": "log:1e-3:1"}
    search_space_source = "Li et al., FedBN (ICLR 2021): the client lr (SGD) per benchmark; FedBN has no constant"
    tune_group = "train"

    @classmethod
    def floats_per_client_round(cls, arch: dict) -> int:
        from pfl_cli.models import build
        from pfl_cli.models.normalized import norm_names

        net = build(arch["client"])
        local = set(norm_names(net)[0])
        return 2 * sum(p.numel() for k, p in net.named_parameters() if k not in local)

    def build(self) -> None:
        from pfl_cli.models.normalized import norm_names

        self.net = self.client_net()
        norm_params, norm_buffers = norm_names(self.net)
        if not norm_params:
            raise InputError(f"model_arch: fedbn keeps the client net's normalization layers local; the "
                             f"{self.arch['client'].get('arch')!r} net has none. Use --set model_arch=mlp-bn "
                             "(or lenet-bn for images).")
        self.eval_net = copy.deepcopy(self.net).eval()  # normalizes with the running statistics
        self.norm_params, self.norm_buffers = norm_params, norm_buffers
        params = {k: v.detach().clone() for k, v in self.net.named_parameters()}
        buffers = {k: v.detach().clone() for k, v in self.net.named_buffers()}
        self.shared = [k for k in params if k not in set(norm_params)]
        self.global_params = {k: params[k] for k in self.shared}
        self.init_local = {**{k: params[k] for k in norm_params}, **{k: buffers[k] for k in norm_buffers}}
        self.private = self.new_private_state(self.init_local)

    @property
    def predict_net(self):
        return self.eval_net

    def _steps(self, start: dict, clients, gen, *, trainable: list[str], **schedule):
        from pfl_cli.fl.normalization import norm_local_steps

        steps, taken = self.draw_batches(clients, gen, **schedule)
        params = {k: v for k, v in start.items() if k not in set(self.norm_buffers)}
        buffers = {k: start[k] for k in self.norm_buffers}
        theta, stats, loss = norm_local_steps(self.net, params, buffers, self.store, steps, trainable=trainable,
                                              sgd=self.sgd_update_options())
        return {**theta, **stats}, loss, taken

    def run_round(self, t, cohort, gen):
        start = {**stack(self.global_params, len(cohort)), **self.private.gather(cohort)}
        theta, loss, _ = self._steps(start, cohort, gen, trainable=self.shared + self.norm_params,
                                     **self.round_schedule())
        shared = corrupt_uploads(self, t, cohort, {k: theta[k] for k in self.shared})  # as the server receives it
        self.record_exchange(self.global_params, shared, len(cohort))
        # Alg. 1: (1/K) sum_k, then the server step (server_lr, server_momentum; 1 and 0: the mean itself)
        self.global_params = self.server_average(average_uploads(self, cohort, shared, by_size=False,
                                                                   secagg=self.cfg.secagg))
        self.private.scatter(cohort, {k: theta[k] for k in self.init_local})
        return loss

    def own_models(self, rows):
        return {**stack(self.global_params, len(rows)), **self.private.gather(rows)}

    def new_clients(self, clients: np.ndarray, gen) -> dict:
        """The initial normalization layers trained ``new_client_epochs`` epochs; the global layers frozen."""
        start = {**self.global_params, **self.init_local}
        if not len(clients):
            return stack(start, len(clients))

        def build(sel):
            from pfl_cli.fl.normalization import population_stats

            theta, _, taken = self._steps(stack(start, len(sel)), sel, gen, trainable=self.norm_params,
                                          epochs=self.cfg.new_client_epochs)
            self.client_sgd_steps += taken
            # A few epochs' running averages from the initial 0 / 1 are far from the client's statistics
            # (momentum 0.1); its trained layers normalize with the statistics of all its samples instead.
            params = {k: v for k, v in theta.items() if k not in set(self.norm_buffers)}
            return {**params, **population_stats(self.net, params, self.store, sel)}

        return self.chunked(np.asarray(clients, dtype=np.int64), build)

    def protocol(self, new: bool) -> dict:
        return epochs_protocol(new, self.cfg.new_client_epochs,
                               "the global layers with its own normalization layers",
                               "its normalization layers trained {e} epochs, the global layers frozen",
                               "the global layers with the initial normalization weights and its own statistics")
