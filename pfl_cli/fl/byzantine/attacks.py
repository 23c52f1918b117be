"""Byzantine clients' attacks: the "federation condition" registry of ``--set attack=NAME``.

Each entry is one small class. An attack acts in up to two places:

- ``poisons_data``: the malicious clients train on altered samples (:mod:`pfl_cli.fl.byzantine.poison`):
  label flipping, the backdoor's trigger;
- ``corrupts_updates``: what a malicious client uploads is replaced before the server aggregates:
  :meth:`Attack.corrupt` maps the cohort's deltas ``D`` (a ``[clients, params]`` matrix of honestly trained
  updates, the malicious rows included as they were trained) to the malicious rows' new deltas, in torch ops
  over the whole matrix.

The attacker is omniscient where a paper's attack reads the honest updates (ALIE, IPM): it sees this round's
cohort. ``scale`` is ``attack_scale`` (None: the entry's default, with its source).
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod


class Attack(ABC):
    """One entry: ``name``, the paper, where it acts (``poisons_data``, ``corrupts_updates``) and what
    ``attack_scale`` means for it. Abstract: ``none`` is the entry :class:`NoAttack`."""

    name = ""
    paper = ""
    poisons_data = False
    corrupts_updates = False
    scale_meaning = ""          # what attack_scale means for this attack ("" : it reads none)

    def default_scale(self, *, n: int, f: int, server_lr: float) -> float | None:
        return None

    @abstractmethod
    def corrupt(self, D, malicious, *, scale: float, gen):
        """The malicious rows' uploaded deltas, (m, P), from the cohort's deltas ``D`` (n, P) and the bool
        ``malicious`` (n,)."""


class NoAttack(Attack):
    name = "none"
    paper = "no attack: every client is honest"

    def corrupt(self, D, malicious, *, scale, gen):
        """Uploads as trained (no client is malicious)."""
        return D[malicious]


class LabelFlip(Attack):
    name = "label-flip"
    paper = ("label flipping: every training label l of a malicious client becomes C - 1 - l (Fang et al., USENIX "
             "Security 2020)")
    poisons_data = True

    def corrupt(self, D, malicious, *, scale, gen):
        """Uploads as trained: the attack is in the data (:mod:`pfl_cli.fl.byzantine.poison`)."""
        return D[malicious]


class SignFlip(Attack):
    name = "sign-flip"
    paper = ("sign flipping: a malicious client uploads -s times its honest delta (Li et al., RSA, AAAI 2019; "
             "with s = 1 the bit flipping of Karimireddy et al., ICML 2021)")
    corrupts_updates = True
    scale_meaning = "s, the multiplier of the flipped delta (default 4)"

    def default_scale(self, *, n, f, server_lr):
        return 4.0

    def corrupt(self, D, malicious, *, scale, gen):
        return -scale * D[malicious]


class Gaussian(Attack):
    name = "gaussian"
    paper = "Gaussian updates: a malicious client uploads N(0, sigma^2 I) (Blanchard et al., NeurIPS 2017, experiments)"
    corrupts_updates = True
    scale_meaning = "sigma, the standard deviation of every coordinate (default 1)"

    def default_scale(self, *, n, f, server_lr):
        return 1.0

    def corrupt(self, D, malicious, *, scale, gen):
        import torch

        m, p = int(malicious.sum()), D.shape[1]
        return (scale * torch.randn((m, p), generator=gen, dtype=D.dtype)).to(D.device)


class Backdoor(Attack):
    name = "backdoor"
    paper = ("model replacement with a pixel-pattern backdoor (Bagdasaryan et al., AISTATS 2020, §3.2-3.3, Eq. 3): "
             "a malicious client trains on data whose every other sample carries the trigger and the target label, "
             "then scales its delta by gamma = n / eta")
    poisons_data = True
    corrupts_updates = True
    scale_meaning = "gamma, the boost of the delta (default n / eta: cohort size over server_lr, Eq. 3)"

    def default_scale(self, *, n, f, server_lr):
        return n / server_lr

    def corrupt(self, D, malicious, *, scale, gen):
        return scale * D[malicious]


class ALIE(Attack):
    name = "alie"
    paper = ("A Little Is Enough (Baruch et al., NeurIPS 2019, §3, Alg. 3): every malicious client uploads "
             "mu - z sigma, the coordinate-wise mean and standard deviation of the cohort's honestly trained "
             "deltas, z = z_max = Phi^-1((n - s) / n), s = floor(n / 2 + 1) - f")
    corrupts_updates = True
    scale_meaning = "z (default the paper's z_max from the cohort size n and its malicious count f)"

    def default_scale(self, *, n, f, server_lr):
        return alie_z(n, f)

    def corrupt(self, D, malicious, *, scale, gen):
        mu, sigma = D.mean(dim=0), D.std(dim=0, correction=0)
        return (mu - scale * sigma).expand(int(malicious.sum()), -1).clone()


class IPM(Attack):
    name = "ipm"
    paper = ("inner-product manipulation (Xie et al., UAI 2019, §4): every malicious client uploads -epsilon times "
             "the mean of the honest clients' deltas")
    corrupts_updates = True
    scale_meaning = "epsilon (default 0.1, the paper's small-epsilon attack on median and Krum)"

    def default_scale(self, *, n, f, server_lr):
        return 0.1

    def corrupt(self, D, malicious, *, scale, gen):
        honest = ~malicious
        mean = D[honest].mean(dim=0) if bool(honest.any()) else D.mean(dim=0)
        return (-scale * mean).expand(int(malicious.sum()), -1).clone()


def alie_z(n: int, f: int) -> float:
    """ALIE's z_max (Baruch et al. 2019, §3): the largest z for which ``s = floor(n/2 + 1) - f`` honest clients
    lie farther from the mean than the attackers, ``Phi^-1((n - s) / n)``; the probability is kept inside
    ``[1 / (2n), 1 - 1 / (2n)]`` where the formula leaves (0, 1) (cohorts of one or two clients)."""
    from statistics import NormalDist

    s = math.floor(n / 2 + 1) - f
    p = min(max((n - s) / n, 1 / (2 * n)), 1 - 1 / (2 * n))
    return NormalDist().inv_cdf(p)


ATTACKS: dict[str, Attack] = {a.name: a for a in (NoAttack(), LabelFlip(), SignFlip(), Gaussian(), Backdoor(), ALIE(), IPM())}
