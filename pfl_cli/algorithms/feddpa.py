"""FedDPA (Yang, Long, Shen, Jiang, Blumenstein, "Dual-Personalizing Adapter for Federated Foundation Models",
NeurIPS 2024): a global LoRA adapter averaged by the server and a local LoRA adapter kept by each client, weighted
per test instance by its similarity to the client's own data.

The client net carries two adapters in every targeted layer of the frozen base (§4.1, Fig. 1): the global one
(``lora_A`` / ``lora_B``) and the local one (``local_A`` / ``local_B``); a layer computes
``base(x) + g * global(x) + l * local(x)``. pflx implements FedDPA-T, the iterative variant (§4.2, Fig. 2b): each
round from the second on, a cohort client first trains its local adapter for the round's local work with the
global adapter frozen and the output weighted ``l = a``, ``g = 1 - a`` (``dpa_train_weight``; §4.2 and Table 5's
ablation of a over 0.3 / 0.5 / 0.7, the released code's default 0.5), then trains the global adapter alone
(``g = 1``, ``l = 0``) as FedIT does; the server averages the global adapters (and the classifier, which pflx keeps
with the global adapter: the paper adapts a generative LLM and has none) by client data size, and each client
keeps its local adapter. Only the global adapter and the classifier travel.

Prediction (§4.3, instance-wise dynamic weighting): an instance's representation is the classifier's input with
the local adapter alone (the released code reads the last hidden state with the local adapter active); its mean
cosine similarity ``s(x)`` to the client's own training instances sets the local adapter's weight
``lam(x) = w * clamp(s(x), 0, 1)`` (``dpa_max_weight`` w: the released code's default halves the similarity) and
the global adapter's ``1 - lam(x)``: an instance like the client's data leans on the local adapter, a shifted one
on the global adapter. pflx weights the local adapter by the similarity, as §4.3 motivates it; the released
inference script applies ``w * s(x)`` to the adapter active at the time (the global one), which reverses the
rationale. The mean over all of the client's training instances replaces the released code's 5 random ones (its
expectation; one reference vector per client, see :mod:`pfl_cli.algorithms.feddpa_net`).

New clients (and train clients never sampled): no local adapter exists; pflx starts it from the global adapter
(FedDPA-F's initialization, §4.2: the local adapter fine-tuned from the global one) and trains it
``new_client_epochs`` epochs on the client's data with the global adapter frozen, weighted as in training; with 0
epochs the local adapter equals the global one and the client gets the global model. The paper serves no new
clients. Not done: FedDPA-F as a training variant (the global adapter trained alone, the local one fine-tuned
after the last round); its initialization is the new-client protocol here.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from pfl_cli.algorithms.lora_common import LoRAClient, LoRAKeys, parts_floats
from pfl_cli.algorithms.partial import PartialSharing, PartialSharingConfig
from pfl_cli.fl.config import check_own_keys, key

FEDDPA = "Yang et al., FedDPA (NeurIPS 2024)"
PREFIX = "net."


@dataclass(frozen=True)
class FedDPAConfig(PartialSharingConfig, LoRAKeys):
    """FedDPA's keys: the partial-sharing round, the LoRA keys (both adapters share them) and the two weights."""

    algorithm: str = key("feddpa", "the algorithm these keys configure")
    dpa_train_weight: float = key(0.5, "a: the local adapter's weight while it trains (the frozen global adapter's "
                                  "1 - a)", f"{FEDDPA} §4.2, Table 5 (a in 0.3 / 0.5 / 0.7); released code: 0.5")
    dpa_max_weight: float = key(0.5, "w: at prediction the local adapter's weight is w * s(x), s(x) the instance's "
                                "mean cosine similarity to the client's training instances (clamped to [0, 1])",
                                f"{FEDDPA} §4.3; the released inference script's default halves s(x): w = 0.5")

    def validate(self) -> None:
        super().validate()
        check_own_keys(self, {"dpa_train_weight": "a number in (0, 1]", "dpa_max_weight": "a number in [0, 1]"})


class FedDPA(LoRAClient, PartialSharing):
    name = "feddpa"
    individual_reads = ""  # runs under --secagg: the global adapters averaged from sums (fl.secagg.cohort_mean)
    search_space = {"lr": "log:1e-3:1", "dpa_train_weight": "float:0.3:0.7", "dpa_max_weight": "float:0:1"}
    search_space_source = (f"{FEDDPA} §5 and Table 5: the learning rate, the training weight a over the ablation's "
                           "range 0.3-0.7 and the similarity's scale w over [0, 1]")
    tune_group = "train"
    paper = "FedDPA: Yang et al., NeurIPS 2024 §4 (global adapter averaged, local adapter kept, instance-wise weights)"
    new_client_protocol = ("a local adapter started from the global one and trained new_client_epochs with the "
                           "global frozen; instance-wise weights against its own data")
    config = FedDPAConfig

    @staticmethod
    def resolve_arch(cfg, store) -> dict:
        arch = LoRAClient.resolve_arch(cfg, store)
        arch["client"]["dual"] = True  # the local adapter beside the global one (pfl_cli.models.lora)
        return arch

    @classmethod
    def floats_per_client_round(cls, arch: dict) -> int:
        return 2 * parts_floats(arch, "A", "B", "head")

    def build(self) -> None:
        from pfl_cli.algorithms.feddpa_net import DPAFeatures, DPANet

        self.net = self.client_net()
        parts = self.parts
        self.shared, self.private_names = parts["A"] + parts["B"] + parts["head"], parts["local"]
        init = {k: v.detach().clone() for k, v in self.net.named_parameters()}
        self.init_private = {k: init[k] for k in self.private_names}
        self.global_params = init
        self.private = self.new_private_state(self.init_private)
        self.dpa_net = DPANet(self.net)
        self.features_net = DPAFeatures(self.net)
        self._round = 0

    @property
    def predict_net(self):
        return self.dpa_net

    def global_model(self):
        """The global adapter and classifier on the base (the local adapters weighted 0): FedIT's model."""
        return self.net, self.global_params

    def run_round(self, t, cohort, gen):
        self._round = t
        return super().run_round(t, cohort, gen)

    def local_update(self, start, cohort, gen):
        """FedDPA-T's round (§4.2): the local adapter with the global one frozen (from the second round), then the
        global adapter and the classifier alone."""
        from pfl_cli.models.lora import set_mix

        a, theta = self.cfg.dpa_train_weight, start
        try:
            if self._round > 0:
                set_mix(self.net, (1.0 - a, a))
                theta, _, _ = self.cohort_sgd(theta, cohort, gen, trainable=self.private_names,
                                              **self.round_schedule())
            set_mix(self.net, None)
            theta, loss, _ = self.cohort_sgd(theta, cohort, gen, trainable=self.shared, **self.round_schedule())
        finally:
            set_mix(self.net, None)
        return theta, loss

    def new_clients(self, clients: np.ndarray, gen) -> dict:
        """A local adapter started from the global one, trained ``new_client_epochs`` epochs with the global frozen."""
        from pfl_cli.fl.params import stack
        from pfl_cli.models.lora import set_mix

        start = dict(self.global_params)
        for k in self.private_names:  # local_A / local_B start at the global lora_A / lora_B
            start[k] = self.global_params[k.replace(".local_A.", ".lora_A.").replace(".local_B.", ".lora_B.")]
        if self.cfg.new_client_epochs == 0:
            return stack(start, len(clients))
        a = self.cfg.dpa_train_weight
        set_mix(self.net, (1.0 - a, a))
        try:
            return self.train_clients(start, clients, gen, epochs=self.cfg.new_client_epochs,
                                      trainable=self.private_names)
        finally:
            set_mix(self.net, None)

    def protocol(self, new: bool) -> dict:
        from pfl_cli.algorithms.base import epochs_protocol

        return epochs_protocol(new, self.cfg.new_client_epochs, "its own local adapter beside the global one",
                               "a local adapter started from the global one and trained {e} epochs",
                               "the global adapter (a local adapter equal to it)")

    def personalize(self, clients: np.ndarray, gen):
        """Each client's two adapters (under ``net.``), its reference direction (the mean unit representation of its
        training instances under its local adapter, §4.3) and the weight scale w."""
        params, _ = super().personalize(clients, gen)
        out = {PREFIX + k: v for k, v in params.items()}
        out["reference"] = self._references(np.asarray(clients, dtype=np.int64), out)
        out["max_weight"] = out["reference"].new_full((len(out["reference"]),), float(self.cfg.dpa_max_weight))
        return out, True

    def _references(self, clients: np.ndarray, params: dict, chunk: int = 32):
        """Each client's mean unit representation of its fit samples, ``chunk`` clients at a time; under ``--nproc``
        each rank computes the clients whose data it holds (:func:`pfl_cli.fl.distributed.split_cohort`)."""
        import torch

        from pfl_cli.fl.distributed import split_cohort

        refs = []
        with torch.no_grad():
            for lo in range(0, len(clients), chunk):
                sel = torch.as_tensor(clients[lo:lo + chunk], device=self.device)
                index, length = self.store.fit.rows(sel)
                p = {k: v[lo:lo + chunk] for k, v in params.items() if k.startswith(PREFIX)}
                refs.append(split_cohort(self._reference_rows, self.store, index,
                                         {"index": index, "length": length, "params": p}))
        if not refs:
            return torch.zeros(0, 1, device=self.device)
        return torch.cat(refs)

    def _reference_rows(self, index, length, params):
        from pfl_cli.fl.cohort import cohort_forward

        import torch

        u = cohort_forward(self.features_net, params, self.store.inputs(index), "vmap")  # (k, width, d)
        valid = (torch.arange(index.shape[1], device=u.device)[None, :] < length[:, None]).to(u.dtype)
        return (u * valid[..., None]).sum(1) / length.clamp_min(1).to(u.dtype)[:, None]
