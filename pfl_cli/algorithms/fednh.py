"""FedNH (Dai, Chen, Li, Heinecke, Sun, Xu, AAAI 2023): class prototypes, uniform and semantic, Alg. 1.

The client net's classifier is replaced by C unit class prototypes w_k, kept fixed during local training:
the logits are ``s * <f(x) / ||f(x)||, w_k>``, a cosine classifier with a scale s (learned, as the authors'
code's ``scaling`` starting at 1 for non-ResNet nets, ``FedNH_fix_scaling`` False). A run:

1. initialization: the prototypes spread uniformly over the unit sphere (uniformity):
   :func:`pfl_cli.fl.prototypes.spread_prototypes` (orthonormal rows when C <= d, the authors' code's
   orthogonal initialization; else the largest pairwise cosine minimized);
2. a round: each cohort client starts from the global body and scale with the global prototypes, trains body
   and scale ``local_epochs`` epochs on cross-entropy of the cosine logits (prototypes fixed), and uploads its
   body, scale and, per class k it holds, its unit class mean mu_{i,k} = normalize(sum f(x) / ||f(x)||) times its
   count n_{i,k}, with its counts;
3. the server averages bodies and scales uniformly over the cohort (the authors' ``FedNH.py`` ``aggregate``:
   server_lr / num_participants) and infuses the class semantics with smoothing rho:
   ``w_k <- normalize(rho w_k + (1 - rho) normalize(sum_i n_{i,k} mu_{i,k} / sum_i n_{i,k}))``
   (:func:`pfl_cli.fl.prototypes.smoothed_prototypes`; a class no cohort client holds keeps its prototype).

The cohort trains in one ``vmap`` over its stacked models (:func:`pfl_cli.fl.prototypes.aligned_steps` without
the alignment term), its class means come from one vectorized pass.

Evaluation (the paper reports both): the personalized model (PM) of a train client is its model after its
last local training (its body and scale with the prototypes it trained against), what pflx serves train
clients; the global model (GM: global body, scale and prototypes) is what a new client (unseen in training)
gets, trained ``new_client_epochs`` epochs on its own data as a cohort client trains (0, the default: the GM
itself, the paper's generalization evaluation; :class:`pfl_cli.fl.prototypes.TrainsNewClients`).

Exchanged per cohort client and round: down the body, the scale and the C x d prototypes; up the body, the
scale, the C x d count-scaled unit class means and the C counts (:meth:`FedNH.floats_per_client_round`).

Defaults: the authors' code and run scripts (``experiments/FedNH_dir.sh``): SGD lr 0.01, momentum 0.9,
weight decay 1e-5 (lambda_theta 5e-6 here, pflx adding 2 * lambda_theta * param), 5 local epochs, gradient
norm clipped at 10 (``FedUH.py``), smoothing rho 0.9 (``main.py``, ``--FedNH_smoothing``); checked against the
scripts and ``main.py``. The scripts also decay the client lr (``--client_lr_scheduler diminishing``); pflx keeps it
constant. fluke (``fednh.py``) keeps rho's
meaning but defaults it to 0.1 (a tenth of the old prototypes kept), builds a client's class mean from its
unnormalized representations (the authors' code averages the unit ones) and serves one model; pflx follows the
authors' code.
"""

from __future__ import annotations

from dataclasses import dataclass


from pfl_cli.algorithms.base import PrivateState, epochs_protocol
from pfl_cli.algorithms.partial import _GlobalModel
from pfl_cli.fl.config import TrainConfig, check_own_keys, key
from pfl_cli.fl.params import stack, weighted_mean
from pfl_cli.fl.prototypes import (TrainsNewClients, aligned_steps, class_feature_sums, smoothed_prototypes,
                                    spread_prototypes)

CODE = "Dai et al., FedNH (AAAI 2023), the authors' code"
NET, PROTOS, SCALE = "net.", "prototypes", "scale"


@dataclass(frozen=True)
class FedNHConfig(TrainConfig):
    """FedNH's keys: local epochs, the smoothing rho and a new client's epochs."""

    algorithm: str = key("fednh", "the algorithm these keys configure")
    lr: float = key(0.01, "client SGD step size", f"{CODE}, experiments/FedNH_dir.sh: --client_lr 0.01")
    momentum: float = key(0.9, "client SGD momentum (buffer reset every round)",
                          f"{CODE}, experiments/FedNH_dir.sh: --sgd_momentum 0.9")
    lambda_theta: float = key(5e-6, "client weight decay, added as 2*lambda_theta*param",
                              f"{CODE}, experiments/FedNH_dir.sh: --sgd_weight_decay 1e-05")
    client_clip: float = key(10.0, "per-client gradient-norm clip before each step (0 = off)",
                             f"{CODE}, FedUH.py: clip_grad_norm_ max_norm 10")
    local_epochs: int = key(5, "epochs of local training per round (Alg. 1)",
                            f"{CODE}, experiments/FedNH_dir.sh: --num_epochs 5")
    fednh_rho: float = key(0.9, "rho: smoothing of the prototype update, w <- rho w + (1 - rho) mean (Alg. 1)",
                           f"{CODE}, main.py: --FedNH_smoothing default 0.9")
    new_client_epochs: int = key(0, "epochs a new client trains the global model as a cohort client does (0: the "
                                 "global model, the paper's GM)", "Dai et al. (AAAI 2023) evaluate the GM as is")

    def validate(self) -> None:
        super().validate()
        check_own_keys(self, {"local_epochs": "an integer >= 1", "new_client_epochs": "an integer >= 0"})
        if not (isinstance(self.fednh_rho, (int, float)) and not isinstance(self.fednh_rho, bool)
                and 0.0 <= self.fednh_rho < 1.0):
            from pfl_cli.errors import ConfigError

            raise ConfigError(f"fednh_rho must be a number in [0, 1) for fednh (1 would never move the prototypes); "
                              f"got {self.fednh_rho!r}.")


class FedNH(TrainsNewClients, PrivateState, _GlobalModel):
    name = "fednh"
    individual_reads = ""  # under --secagg the body's mean and the prototypes' update from the cohort's sums
    paper = "FedNH: Dai et al., AAAI 2023 (Alg. 1)"
    new_client_protocol = "the global model (GM), or it trained new_client_epochs on its own data"
    config = FedNHConfig
    dp_unit = None  # no DP variant
    not_distributed = "its prototype update and per-client models run in one process"
    search_space = {"lr": "log:1e-3:1", "fednh_rho": "choice:0.5,0.9,0.99"}
    search_space_source = ("Dai et al., FedNH (AAAI 2023): the client lr and the smoothing rho (0.9 in their runs; "
                           "0.5 and 0.99 around it)")
    tune_group = "train"

    @classmethod
    def floats_per_client_round(cls, arch: dict) -> int:
        """Down: body, scale, C x d prototypes; up: body, scale, C x d scaled class means, C counts."""
        from pfl_cli.fl.split import split_names
        from pfl_cli.models import build

        net = build(arch["client"])
        body, _ = split_names(net, "fednh")
        sizes = dict((k, p.numel()) for k, p in net.named_parameters())
        nb, classes, d = sum(sizes[k] for k in body), int(arch["client"]["num_classes"]), net.head().in_features
        return 2 * (nb + 1 + classes * d) + classes

    def build(self) -> None:
        from pfl_cli.algorithms.fednh_net import CosineNet

        from pfl_cli.fl.split import split_names
        from pfl_cli.rng import torch_generator

        net = self.client_net()
        self.net = CosineNet(net, self.store.num_classes).to(self.device)
        body, _ = split_names(net, "fednh")
        self.body = [NET + k for k in body]
        self.trainable = [*self.body, SCALE]
        gen = torch_generator(self.cfg.seed, "fednh-prototypes")
        init = {k: v.detach().clone() for k, v in self.net.named_parameters() if k in (*self.trainable, PROTOS)}
        init[PROTOS] = spread_prototypes(self.store.num_classes, self.net.dim, gen).to(self.device)
        self.global_params = init
        self.private = self.new_private_state(init)

    def _train(self, start: dict, clients, gen, epochs: int):
        steps, taken = self.draw_batches(clients, gen, epochs=epochs)
        theta, loss = aligned_steps(self.net, start, self.store, steps, trainable=self.trainable,
                                    sgd=self.sgd_update_options())
        return theta, loss, taken

    def _unit_means(self, params: dict, clients):
        """Each client's normalized class means of its unit representations (c, C, d) and its counts (c, C)."""
        from torch import nn

        from torch.func import functional_call

        features = lambda p, x: functional_call(self.net, p, (x,), {"parts": True})[0]  # noqa: E731
        sums = class_feature_sums(features, params, self.store, clients)
        return nn.functional.normalize(sums.sums, dim=-1), sums.counts

    def run_round(self, t, cohort, gen):
        c = len(cohort)
        start = stack(self.global_params, c)
        for k in self.trainable:                                        # counted, not copied
            self.traffic.send("model", self.global_params[k], copies=c)
        self.traffic.send(PROTOS, self.global_params[PROTOS], copies=c)
        theta, loss, _ = self._train(start, cohort, gen, self.cfg.local_epochs)
        means, counts = self._unit_means(theta, cohort)
        for k in self.trainable:
            self.traffic.receive("model", theta[k])
        self.traffic.receive("scaled_class_means", means * counts.unsqueeze(-1))
        self.traffic.receive("class_counts", counts)
        if self.cfg.secagg:  # sums only (pfl_cli.fl.secagg): of copies of the bodies (each client keeps its PM)
            from pfl_cli.fl.prototypes import smoothed_prototypes_secure
            from pfl_cli.fl.secagg import cohort_mean

            self.global_params.update(cohort_mean(self.store, cohort, {k: theta[k].clone() for k in self.trainable},
                                                  by_size=False, secagg=True))
            self.global_params[PROTOS] = smoothed_prototypes_secure(self.global_params[PROTOS], means, counts,
                                                                    float(self.cfg.fednh_rho))
        else:
            self.global_params.update(weighted_mean(self.store, cohort, {k: theta[k] for k in self.trainable},
                                                    by_size=False))
            self.global_params[PROTOS] = smoothed_prototypes(self.global_params[PROTOS], means, counts,
                                                             float(self.cfg.fednh_rho))
        self.private.scatter(cohort, theta)  # the PM: its trained body and scale, the prototypes it trained with
        return loss

    # -- serving
    def own_models(self, rows):
        return self.private.gather(rows)

    def protocol(self, new: bool) -> dict:
        return epochs_protocol(new, self.cfg.new_client_epochs, "its personalized model (PM)",
                               "the global model (GM) trained {e} epochs", "the global model (GM)")
