"""Client-level differential privacy for federated training: the DP-FedAvg mechanism.

McMahan, Ramage, Talwar, Zhang, "Learning Differentially Private Recurrent Language Models"
(ICLR 2018), Algorithm 1 (DP-FedAvg) with uniform client weights w_k = 1:

- each round, every train client joins the cohort independently with probability q
  (Poisson sampling; line "C^t <- sample users with probability q");
- each client's contribution u_k (FedAvg: its model delta; PeFLL: its share of the server
  gradient of hypernetwork and embedding network) is clipped to L2 norm C (``ClipFn``);
- the server adds N(0, (z C)^2) to the sum and divides by the *expected* cohort size q N
  (the fixed-denominator estimator f~_f), so one client changes the released vector by at
  most C whatever the realized cohort size.

The noise multiplier z is calibrated before training from (epsilon, delta, q, rounds) with
:func:`pfl_cli.privacy.calibrate_noise`, and the ledger records ``rounds`` self-composed
Poisson-sampled Gaussian events, unit "client". The clip C and the population size N are
public inputs: C is given by the user, N is the number of clients the operator enrolled
(it sets q and the denominator; it is not protected, as in McMahan et al.).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Mapping

from pfl_cli.errors import ConfigError, check_param

DEFAULT_DELTA = 1e-6


class SampledGaussianRecord:
    """The ledger of a mechanism that is ``compositions`` Poisson-sampled Gaussian releases.

    Subclasses (frozen dataclasses) have ``noise_multiplier``, ``sampling_rate``, ``delta``, a
    ``unit``, a ``compositions`` count and a human ``note()``.
    """

    def event(self, noise_multiplier: float | None = None):
        """The dp_accounting event at the mechanism's (or a trial) noise multiplier: calibration's ``make_event``."""
        from pfl_cli.privacy import sampled_gaussian_event

        z = self.noise_multiplier if noise_multiplier is None else noise_multiplier
        return sampled_gaussian_event(z, self.sampling_rate, self.compositions)

    def ledger(self):
        """The ``privacy.json`` ledger: one self-composed Poisson-sampled Gaussian event."""
        from pfl_cli.privacy import PrivacyLedger

        return PrivacyLedger(self.unit, self.delta, (self.event(),), "add-remove", (self.note(),))


@dataclass(frozen=True)
class ClientLevelDP(SampledGaussianRecord):
    """A calibrated client-level Gaussian mechanism for ``rounds`` Poisson-sampled rounds.

    Parameters
    ----------
    epsilon, delta : float
        The target guarantee of the whole run (``epsilon`` is what the calibration met).
    clip : float
        Public L2 bound C of one client's contribution.
    sampling_rate : float
        Poisson rate q of a client joining a round.
    population : int
        N, the number of train clients (public).
    rounds : int
    noise_multiplier : float
        z: the noise on the sum has standard deviation ``z * clip``.
    accountant : {"rdp", "pld"}
    contribution : str
        What one client contributes, for the ledger's note (e.g. "model delta").
    """

    epsilon: float
    delta: float
    clip: float
    sampling_rate: float
    population: int
    rounds: int
    noise_multiplier: float
    accountant: str = "rdp"
    contribution: str = "update"

    @property
    def expected_cohort(self) -> float:
        """q N: the fixed denominator of every round's average."""
        return self.sampling_rate * self.population

    def sample_cohort(self, clients, size: int, gen):
        """Each of ``clients`` independently with probability q (may be empty); ``size`` is not used."""
        import torch

        keep = torch.rand(len(clients), generator=gen, device=gen.device) < self.sampling_rate
        return clients[keep.to(clients.device)]

    def private_mean(self, contributions: Mapping[str, Any], gen) -> dict[str, Any]:
        """Clip each client's contribution, sum, add Gaussian noise, divide by q N.

        Parameters
        ----------
        contributions : dict name -> Tensor (c, *shape)
            One row per cohort client; the clip applies to the L2 norm over all names jointly.
        gen : torch.Generator
            The noise stream.
        """
        import torch

        clipped = clip_per_client(contributions, self.clip)
        std = self.noise_multiplier * self.clip if self.noise_multiplier > 0 else 0.0  # z = 0 with C = inf: none
        out = {}
        for k, v in clipped.items():
            noise = torch.randn(v.shape[1:], generator=gen, device=gen.device, dtype=v.dtype).to(v.device)
            out[k] = (v.sum(0) + std * noise) / self.expected_cohort
        return out

    unit = "client"

    @property
    def compositions(self) -> int:
        return self.rounds

    def note(self) -> str:
        return (f"{self.rounds} rounds of DP-FedAvg (McMahan et al. 2018): Poisson cohorts at rate q = "
                f"{self.sampling_rate:.6g} of N = {self.population} clients, each client's {self.contribution} clipped to L2 {self.clip:g}, "
                f"Gaussian noise std {self.noise_multiplier:.6g} x clip on the sum, divided by q N = "
                f"{self.expected_cohort:.6g}")

    def info(self) -> dict[str, Any]:
        return {"unit": "client", "epsilon": self.epsilon, "delta": self.delta, "clip": self.clip,
                "sampling_rate": self.sampling_rate, "population": self.population, "rounds": self.rounds,
                "expected_cohort": self.expected_cohort, "noise_multiplier": self.noise_multiplier,
                "noise_std_on_sum": self.noise_multiplier * self.clip, "accountant": self.accountant,
                "cohorts": "poisson", "selection": "last round"}


def clip_per_client(contributions: Mapping[str, Any], clip: float) -> dict[str, Any]:
    """Scale each row (client) so its L2 norm over all tensors jointly is at most ``clip``."""
    import torch

    rows = next(iter(contributions.values())).shape[0]
    sq = sum(v.reshape(rows, -1).pow(2).sum(1) for v in contributions.values())
    norm = torch.sqrt(sq)
    scale = torch.where(norm > clip, clip / norm.clamp_min(1e-30), torch.ones_like(norm))
    return {k: v * scale.view(-1, *([1] * (v.dim() - 1))) for k, v in contributions.items()}


def check_dp_options(cfg) -> None:
    """The --dp options' own rules, before any data is read (delta < 1/N comes with the data)."""
    eps = cfg.dp_epsilon
    ok = isinstance(eps, (int, float)) and not isinstance(eps, bool) and math.isfinite(eps) and eps > 0
    check_param("--dp eps", ok, "must be a finite number > 0", eps)
    check_param("--dp delta", isinstance(cfg.dp_delta, (int, float)) and 0 < cfg.dp_delta < 1,
                "must be in the open interval (0, 1)", cfg.dp_delta)
    if cfg.dp_clip is None:
        raise ConfigError("--dp needs clip=C, the public L2 bound of one client's update (per-sample gradient for "
                          "the local-DP algorithms); it calibrates the noise, so it must be chosen without "
                          "looking at the private data, e.g. --dp eps=4,clip=1.")
    clip = cfg.dp_clip
    ok = isinstance(clip, (int, float)) and not isinstance(clip, bool) and clip > 0 and not math.isnan(clip)
    check_param("--dp clip", ok, "must be a number > 0", clip)
    if cfg.dp_sampling_rate is not None:
        rate = cfg.dp_sampling_rate
        check_param("dp_sampling_rate", isinstance(rate, (int, float)) and 0 < rate <= 1, "must be in (0, 1]", rate)
    if cfg.normalize:
        raise ConfigError("normalize standardizes inputs with statistics of the private train clients, which --dp "
                          "does not release; pass --set normalize=false with --dp.")


def check_delta_population(delta: float, population: int, unit: str) -> None:
    """delta < 1 / N: a larger delta allows a mechanism that publishes one unit's data outright."""
    if not delta < 1.0 / population:
        raise ConfigError(f"--dp delta must be < 1/N = {1.0 / population:.3g} for N = {population} privacy units "
                          f"({unit}s); got {delta:g}. Pass a smaller delta, e.g. --dp eps=...,delta=1e-6.")


def calibrate_client_dp(cfg, population: int, *, contribution: str = "update") -> ClientLevelDP:
    """Calibrate the noise multiplier for ``cfg.rounds`` Poisson-sampled rounds over ``population`` clients.

    q is ``cfg.dp_sampling_rate`` or ``clients_per_round / population`` (at most 1).
    """
    from pfl_cli.privacy import calibrate_noise

    check_dp_options(cfg)
    check_delta_population(cfg.dp_delta, population, "client")
    rate = cfg.dp_sampling_rate if cfg.dp_sampling_rate is not None else min(1.0, cfg.clients_per_round / population)
    rounds = int(cfg.rounds)
    check_param("rounds", rounds >= 1, "must be >= 1 with --dp", rounds)
    draft = ClientLevelDP(float(cfg.dp_epsilon), float(cfg.dp_delta), float(cfg.dp_clip), float(rate),
                          int(population), rounds, float("nan"), cfg.dp_accountant, contribution)
    cal = calibrate_noise(draft.event, draft.epsilon, draft.delta, accountant=cfg.dp_accountant)
    return ClientLevelDP(draft.epsilon, draft.delta, draft.clip, draft.sampling_rate, draft.population, rounds,
                         float(cal.noise_multiplier), cfg.dp_accountant, contribution)
