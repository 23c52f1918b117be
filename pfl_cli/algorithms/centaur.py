"""CENTAUR (Shen et al. 2023) as HyperFL adapts it to ISRL-DP (B.10): a DP representation, personal heads.

Each round a cohort client first fits its personal head on the frozen global representation
(``local_steps`` plain SGD steps: the head never leaves the client), then takes ``local_steps``
DP-SGD steps on the representation with the head frozen (per-sample clipping and Gaussian
noise on the client) and uploads the representation delta.
"""

from __future__ import annotations

from dataclasses import dataclass

from pfl_cli.algorithms.ldp_heads import PersonalHeadLDP, PersonalHeadLDPConfig
from pfl_cli.fl.config import key


@dataclass(frozen=True)
class CENTAURConfig(PersonalHeadLDPConfig):
    """CENTAUR's keys."""

    algorithm: str = key("centaur", "the algorithm these keys configure")


class CENTAUR(PersonalHeadLDP):
    name = "centaur"
    individual_reads = ""  # under --secagg the mean of the privatized representation deltas from sums
    search_space = {"lr": "log:1e-3:1"}
    search_space_source = ("the client lr (the DP-SGD noise is the user's budget, never searched)")
    tune_group = "train"
    paper = "CENTAUR: Shen et al. 2023, as HyperFL adapts it (HyperFL App. D.1 and its code)"
    new_client_protocol = "a head trained on the frozen DP representation"
    config = CENTAURConfig
    dp_unit = "example"  # declared: DP-SGD on the representation on every client

    def local_update(self, start, cohort, gen, noise_gen):
        from pfl_cli.fl.dpsgd import dp_local_sgd, poisson_batches

        cfg, dp = self.cfg, self.dp
        heads, _ = self.head_steps(start, cohort, gen, cfg.local_steps)
        index, mask = poisson_batches(self.store.fit, cohort, cfg.local_steps, dp.sampling_rate, gen)
        return dp_local_sgd(self.net, heads, self.store, index, mask, private=list(self.global_params),
                            frozen=self.head, clip=dp.clip, noise_multiplier=dp.noise_multiplier,
                            denominator=dp.denominator, lr=cfg.lr, momentum=cfg.momentum,
                            weight_decay=2.0 * cfg.lambda_theta, noise_gen=noise_gen)
