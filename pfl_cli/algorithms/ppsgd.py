"""PPSGD (Bietti et al. 2022, personalized private SGD) as HyperFL adapts it to ISRL-DP (B.10).

Each round a cohort client takes ``local_steps`` joint SGD steps on the global representation
and its personal head from one Poisson batch per step: the representation's per-sample
gradients are clipped and noised on the client (DP-SGD), the head's gradient is the plain
batch mean (the head never leaves the client). The client uploads its representation delta.
"""

from __future__ import annotations

from dataclasses import dataclass

from pfl_cli.algorithms.ldp_heads import PersonalHeadLDP, PersonalHeadLDPConfig
from pfl_cli.fl.config import key


@dataclass(frozen=True)
class PPSGDConfig(PersonalHeadLDPConfig):
    """PPSGD's keys."""

    algorithm: str = key("ppsgd", "the algorithm these keys configure")


class PPSGD(PersonalHeadLDP):
    name = "ppsgd"
    individual_reads = ""  # under --secagg the mean of the privatized representation deltas from sums
    search_space = {"lr": "log:1e-3:1"}
    search_space_source = ("the client lr (the DP-SGD noise is the user's budget, never searched)")
    tune_group = "train"
    paper = "PPSGD: Bietti et al. 2022, as HyperFL adapts it (HyperFL App. D.1 and its code)"
    new_client_protocol = "a head trained on the frozen DP representation"
    config = PPSGDConfig
    dp_unit = "example"  # declared: DP-SGD on the representation on every client

    def local_update(self, start, cohort, gen, noise_gen):
        from pfl_cli.fl.dpsgd import dp_local_sgd, poisson_batches

        cfg, dp = self.cfg, self.dp
        index, mask = poisson_batches(self.store.fit, cohort, cfg.local_steps, dp.sampling_rate, gen)
        return dp_local_sgd(self.net, start, self.store, index, mask, private=list(self.global_params),
                            clip=dp.clip, noise_multiplier=dp.noise_multiplier, denominator=dp.denominator,
                            lr=cfg.lr, momentum=cfg.momentum, weight_decay=2.0 * cfg.lambda_theta,
                            noise_gen=noise_gen)
