"""One global model, served as it is or fine-tuned: what the algorithms whose server holds a single model share.

:class:`OneGlobalModel` is a mixin of an :class:`~pfl_cli.algorithms.base.Algorithm` (it uses its ``client_net``,
``train_clients``, ``cfg`` and ``device``): the model ``global_params`` built from the client net, its checkpoint
state and weights, and FedAvg's new-client protocol (the global model, or it fine-tuned ``finetune_steps`` local
steps where the config has that key, all weights or LoRA adapters: ``finetune_adapters``, :mod:`pfl_cli.fl.finetune`;
the global model as it is where it has none). The server rule stays each
method's: q-FFL's and AFL's rounds, FedBuff's and FedAsync's asynchronous server
(:class:`pfl_cli.fl.asynchronous.GlobalModelOnTheClock`).
"""

from __future__ import annotations

import numpy as np

from pfl_cli.fl.params import cpu_tree


class OneGlobalModel:
    """``global_params``: the one model every client downloads and every client is served (see the module)."""

    @property
    def finetune_steps(self) -> int:
        """``finetune_steps`` of the config; 0 where the config has none (q-FFL, AFL)."""
        return int(getattr(self.cfg, "finetune_steps", 0))

    @property
    def needs_labels_to_predict(self) -> bool:
        return self.finetune_steps > 0

    def build(self) -> None:
        self.net = self.client_net()
        self.global_params = {k: v.detach().clone() for k, v in self.net.named_parameters()}
        self.personalized = self.finetune_steps > 0
        self.check_finetune()

    def losses_and_local_models(self, cohort, gen):
        """The client half of a round whose server reads each client's loss (q-FFL, AFL): the global model w sent to
        every cohort client; ``(f, theta, loss)``: their losses F_k(w) (c,) on their fit samples under w, all in one
        batched forward (:func:`pfl_cli.fl.clusters.losses_under`), and their models ``theta`` {name: (c, ...)} after
        the round's local SGD from w (:meth:`Algorithm.cohort_sgd`), with its training loss."""
        from pfl_cli.fl.clusters import losses_under
        from pfl_cli.fl.cohort import resolve_cohort_exec
        from pfl_cli.fl.params import broadcast

        c = len(cohort)
        for k, v in self.global_params.items():
            self.traffic.send(k, v, copies=c)
        how = resolve_cohort_exec(self.cfg.cohort_exec, self.net, self.device)
        one = {k: v.unsqueeze(0) for k, v in self.global_params.items()}
        f = losses_under(self.net, self.store, self.store.fit, cohort, one, how)[:, 0]
        theta, loss, _ = self.cohort_sgd(broadcast(self.global_params, c), cohort, gen, **self.round_schedule())
        return f, theta, loss

    # ---------------------------------------------------------------- serving
    def personalize(self, clients: np.ndarray, gen):
        if self.finetune_steps > 0:  # all weights, or LoRA adapters (Algorithm.finetune)
            return self.finetune(self.global_params, clients, gen, self.finetune_steps), True
        return self.global_params, False

    def protocol(self, new: bool) -> dict:
        return {"protocol": self.finetune_protocol(self.finetune_steps), "rounds": 0}

    # ---------------------------------------------------------------- checkpoint and artifact
    def state(self):
        return {"global": {k: v.detach().clone() for k, v in self.global_params.items()}}

    def load_state(self, state):
        self.global_params = {k: v.to(self.device) for k, v in state["global"].items()}

    def weights(self):
        return {"client": cpu_tree(self.global_params, clone=True)}

    def load_weights(self, weights):
        self.global_params = {k: v.to(self.device) for k, v in weights["client"].items()}
