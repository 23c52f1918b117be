"""FedProto (Tan, Long, Liu, Zhou, Lu, Jiang, Zhang, AAAI 2022): federated prototype learning, Alg. 1.

Clients exchange class prototypes, never model parameters. Every client i keeps its own whole model
F_i = g_i o f_i (representation f_i, decision layer g_i; pflx's client net with ``features()`` and a linear
``head()``), private from the first round it trains. A round, for every cohort client (Alg. 1):

1. it receives the global prototypes C̄^(j) of the classes the server has seen;
2. it trains its model ``local_epochs`` epochs on L_S(F_i(x), y) + lambda * ||f_i(x) - C̄^(y)||^2 (Eq. 7-8,
   the per-sample squared L2 distance of App. B's local loss; only for samples whose class has a global
   prototype: none in the first round);
3. it uploads its prototypes C_i^(j), the mean of f_i(x) over its samples of class j (Eq. 3, with the
   trained model), and its class counts |D_{i,j}|;
4. the server sets C̄^(j) to the count-weighted mean of the cohort's prototypes of class j,
   sum_i |D_{i,j}| C_i^(j) / N_j (Eq. 6 and App. B's q_i; a class no cohort client holds keeps its last
   prototype): :func:`pfl_cli.fl.prototypes.merge_prototypes`.

Exchanged per cohort client and round: the C x d global prototypes down, its C x d prototypes and C class
counts up (:meth:`FedProto.floats_per_client_round`), measured from those tensors (the paper's experiments,
"Communication efficiency", count the prototypes alone, "parameters communicated per round").

The cohort trains in one ``vmap`` over its stacked models (:func:`pfl_cli.fl.prototypes.aligned_steps`), and its
prototypes come from one vectorized pass (:func:`pfl_cli.fl.prototypes.class_feature_sums`).

Inference (``inference``): ``prototype``, the default, FedProto's own rule: a client's model maps x to
f_i(x) and predicts the class j of the nearest global prototype, argmin_j ||f_i(x) - C̄^(j)||^2 over the classes
with one (:class:`pfl_cli.fl.prototypes.NearestPrototypeNet`); the authors' code (``lib/update.py``,
``test_inference_new_het_lt``: "acc with protos", the MSE distance, whose argmin is the same) and PFLlib
(``clientproto.py``, ``test_metrics``) score FedProto this way. ``head``: the client's decision layer g_i(f_i(x)),
what the authors' code prints beside it ("w/o protos"). The authors' rule compares a client's samples with the
prototypes of its own classes only (``j in classes_list[idx]``): pflx's ``--label-mask`` headline
(``masked_accuracy``) is that rule; the plain accuracy takes every class with a global prototype.

A new client (unseen in training): the paper's clients train their own heterogeneous models, so no global model
exists to hand over; it gets the global prototypes and trains its own model from the common initialization
``new_client_epochs`` epochs on the same local objective (step 2), the honest protocol of a prototype-only
exchange (:class:`pfl_cli.fl.prototypes.TrainsNewClients`), then predicts as a train client does.

Defaults: App. A (SGD at 0.01, momentum 0.5, one local epoch, batches of 8, lambda 1 for MNIST and FEMNIST), checked
against the authors' code (the paper's text was not at hand): its README's --lr 0.01, --train_ep 1, --ld 1 (MNIST,
FEMNIST; 0.1 for CIFAR-10) and ``lib/update.py``'s momentum 0.5 agree; its README gives --local_bs 4 as the
default, where App. A is cited for 8 (kept, unverified).
The authors' code and PFLlib (``clientproto.py``: ``nn.MSELoss()``) take the mean over the d coordinates
where the paper writes the squared norm; their lambda 1 is pflx's ``fedproto_lambda`` 1 / d on the squared
norm, the default (null), as FedPAC's (:mod:`pfl_cli.algorithms.fedpac`). The global prototypes follow the
paper's count weighting (Eq. 6); the authors' code (``lib/utils.py``, ``proto_aggregation``) and PFLlib's copy of it
(``serverproto.py``) average the prototypes of a class uniformly over the clients that hold it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional


from pfl_cli.algorithms.base import PrivateState, epochs_protocol
from pfl_cli.algorithms.partial import _GlobalModel
from pfl_cli.fl.config import TrainConfig, check_own_keys, key
from pfl_cli.fl.prototypes import (KeepsGlobalPrototypes, TrainsNewClients,
                                    aligned_steps, class_feature_sums, merge_prototypes)

APPENDIX = "Tan et al., FedProto (AAAI 2022), App. A"
INFERENCES = ("prototype", "head")


@dataclass(frozen=True)
class FedProtoConfig(TrainConfig):
    """FedProto's keys: local epochs, the prototype-distance weight lambda and a new client's epochs."""

    algorithm: str = key("fedproto", "the algorithm these keys configure")
    batch_size: int = key(8, "client minibatch size", f"{APPENDIX}: local batch size 8 (the authors' README gives "
                          "options.py's --local_bs default as 4)")
    lr: float = key(0.01, "client SGD step size", f"{APPENDIX}: SGD with learning rate 0.01 (the authors' README: "
                    "--lr 0.01)")
    momentum: float = key(0.5, "client SGD momentum (buffer reset every round)",
                          f"{APPENDIX}: momentum 0.5 (the authors' lib/update.py: SGD momentum=0.5)")
    local_epochs: int = key(1, "epochs of local training per round (Alg. 1, LocalUpdate)",
                            f"{APPENDIX}: one local epoch (the authors' README: --train_ep 1)")
    fedproto_lambda: Optional[float] = key(None, "lambda: weight of ||f(x) - global prototype of y||^2 (Eq. 7-8); "
                                           "null: 1 / d, d the feature width",
                                           f"{APPENDIX}: lambda 1 (MNIST, FEMNIST; the authors' README: --ld 1, 0.1 "
                                           "for CIFAR-10) on the authors' MSELoss, the mean over the d coordinates: "
                                           "1 / d on the squared norm")
    new_client_epochs: int = key(20, "epochs a new client trains its own model from the initial one, aligned to "
                                 "the global prototypes",
                                 "PeFLL (ICLR 2024) App. A.2: a new client's model part trained locally for 20 epochs")
    inference: str = key("prototype", "how a client predicts: prototype (the class of the nearest global prototype "
                         "of its representation) | head (its model's decision layer)",
                         "Tan et al., FedProto (AAAI 2022): inference by the nearest global prototype; the authors' "
                         "code (lib/update.py, test_inference_new_het_lt) and PFLlib (clientproto.py, test_metrics) "
                         "score it so", choices=INFERENCES)

    def validate(self) -> None:
        super().validate()
        check_own_keys(self, {"local_epochs": "an integer >= 1", "fedproto_lambda": "a finite number >= 0",
                              "new_client_epochs": "an integer >= 0"})


class FedProto(KeepsGlobalPrototypes, TrainsNewClients, PrivateState, _GlobalModel):
    name = "fedproto"
    individual_reads = ""  # under --secagg Eq. 6 from the sums of n_ik c_ik and n_ik (merge_prototypes_secure)
    paper = "FedProto: Tan et al., AAAI 2022 (Alg. 1)"
    new_client_protocol = "its own model trained new_client_epochs from the initial one towards the global prototypes"
    config = FedProtoConfig
    dp_unit = None  # no DP variant: the prototypes are class means of private representations, released as such
    not_distributed = "its prototype merge and per-client models run in one process"
    search_space = {"lr": "log:1e-3:1", "fedproto_lambda": "log:1e-3:10"}
    search_space_source = ("Tan et al., FedProto (AAAI 2022), App. A: lambda tuned from a candidate set (their best 1 "
                           "or 0.1 on the coordinate mean, 1e-3 to 10 on the squared norm here) and the client lr")
    tune_group = "train"

    @classmethod
    def floats_per_client_round(cls, arch: dict) -> int:
        """Down: the C x d global prototypes; up: the C x d client prototypes and the C class counts."""
        from pfl_cli.models import build

        classes, d = int(arch["client"]["num_classes"]), build(arch["client"]).head().in_features
        return 2 * classes * d + classes

    def build(self) -> None:
        from pfl_cli.fl.prototype_nets import FeatureNet, NearestPrototypeNet
        import torch

        self.net = FeatureNet(self.client_net(), self.name)
        init = {k: v.detach().clone() for k, v in self.net.named_parameters()}
        self.global_params = init  # the common initialization every model starts from; never averaged
        self.private = self.new_private_state(init)
        d = self.net.net.head().in_features
        self.prototypes = torch.zeros(self.store.num_classes, d, device=self.device)
        self.seen = torch.zeros(self.store.num_classes, dtype=torch.bool, device=self.device)
        self.nearest = NearestPrototypeNet(self.net.net, self.store.num_classes, d)

    @property
    def alignment_weight(self) -> float:
        """lambda: ``fedproto_lambda``, or 1 / d (the authors' lambda 1 on the mean over the d coordinates)."""
        lam = self.cfg.fedproto_lambda
        return float(lam) if lam is not None else 1.0 / self.net.net.head().in_features

    def _train(self, start: dict, clients, gen, epochs: int):
        steps, taken = self.draw_batches(clients, gen, epochs=epochs)
        theta, loss = aligned_steps(self.net, start, self.store, steps, trainable=list(start),
                                    sgd=self.sgd_update_options(), lam=self.alignment_weight,
                                    prototypes=self.prototypes if bool(self.seen.any()) else None, seen=self.seen)
        return theta, loss, taken

    def _class_sums(self, params: dict, clients):
        from torch.func import functional_call

        features = lambda p, x: functional_call(self.net, p, (x,), {"parts": True})[0]  # noqa: E731
        return class_feature_sums(features, params, self.store, clients)

    def run_round(self, t, cohort, gen):
        c = len(cohort)
        self.traffic.send("prototypes", self.prototypes, copies=c)                        # Alg. 1: C̄ down
        theta, loss, _ = self._train(self.private.gather(cohort), cohort, gen, self.cfg.local_epochs)
        local = self._class_sums(theta, cohort)                                            # Eq. 3
        protos = local.prototypes()
        self.traffic.receive("prototypes", protos)
        self.traffic.receive("class_counts", local.counts)
        if self.cfg.secagg:  # the server learns sum_i n_ik c_ik and sum_i n_ik only (pfl_cli.fl.secagg)
            from pfl_cli.fl.prototypes import merge_prototypes_secure

            self.prototypes, self.seen = merge_prototypes_secure(self.prototypes, self.seen, protos, local.counts)
        else:
            self.prototypes, self.seen = merge_prototypes(self.prototypes, self.seen, protos, local.counts)  # Eq. 6
        self.private.scatter(cohort, theta)
        return loss

    # -- serving
    def own_models(self, rows):
        return self.private.gather(rows)

    def global_model(self):
        """None: the server holds the class prototypes only (Alg. 1: no model parameter is exchanged);
        ``global_params`` is the common initialization, never trained, so there is no model to score as the
        global one (it scored 6.9 % on digits, below chance, as ``global_accuracy``)."""
        return None

    @property
    def predict_net(self):
        """The client net under the ``inference`` rule: the nearest of the server's current global prototypes, or
        the client's own decision layer."""
        if self.cfg.inference == "head":
            return self.net
        return self.nearest.use(self.prototypes, self.seen)

    def protocol(self, new: bool) -> dict:
        return epochs_protocol(new, self.cfg.new_client_epochs, "its own model",
                               "its own model trained {e} epochs towards the global prototypes",
                               "the initial model")
