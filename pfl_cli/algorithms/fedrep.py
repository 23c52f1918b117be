"""FedRep (Collins, Hassani, Mokhtari, Shakkottai, ICML 2021, Algorithm 1).

A shared body (representation) and a personal head per client. Each round a cohort client
takes the global body, first trains its own head for ``head_epochs`` epochs with the body
frozen (Alg. 1 lines 8-10), then the body for ``body_epochs`` epochs with its new head frozen
(lines 11-13); the server sets the body to the plain mean of the cohort's bodies (line 16)
and each client keeps its head. A new client gets a fresh head trained for
``new_client_epochs`` epochs on the frozen body (the PeFLL paper's protocol: 20 epochs).
"""

from __future__ import annotations

from pfl_cli.algorithms.partial import PartialSharing


class FedRep(PartialSharing):
    name = "fedrep"
    shared_part = "body"
    average_by_size = False  # Alg. 1 line 16: (1 / rn) sum_i theta_i

    def local_update(self, start, cohort, gen):
        cfg = self.cfg
        theta, loss = start, None
        if cfg.head_epochs:
            theta, loss, _ = self.cohort_sgd(theta, cohort, gen, epochs=cfg.head_epochs, trainable=self.head)
        if cfg.body_epochs:
            theta, loss, _ = self.cohort_sgd(theta, cohort, gen, epochs=cfg.body_epochs, trainable=self.body)
        return theta, loss
