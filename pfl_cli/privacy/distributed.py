"""Distributed DP: the distributed discrete Gaussian mechanism under secure aggregation.

Kairouz, Liu & Steinke, "The Distributed Discrete Gaussian Mechanism for Federated Learning with
Secure Aggregation" (ICML 2021), Algorithm 1, without its random rotation: each cohort client

1. clips its update to L2 norm ``clip`` C (DP-FedAvg's clip, McMahan et al. 2018);
2. scales it to ``scale`` s integer units per C (x s / C) and rounds each coordinate randomly to one of
   its two neighbouring integers (unbiased); the rounded vector's norm is at most s + sqrt(d) whatever
   the draw (each coordinate moves by less than 1), the sensitivity ``Delta_2`` the accounting uses;
3. adds its share of the noise, i.i.d. discrete Gaussian N_Z(0, sigma_c^2) per coordinate (the sampler
   of Canonne, Kamath & Steinke, NeurIPS 2020, "The Discrete Gaussian for Differential Privacy",
   Algorithm 3, in floating point on CSPRNG uniforms);
4. sends the result modulo 2^b, which secure aggregation sums modulo 2^b (:mod:`pfl_cli.fl.secagg`).

The server learns only that sum: it maps it back to the centred range [-2^(b-1), 2^(b-1)), multiplies by
C / s and divides by the fixed cohort size. No party sees an update with less noise than its client's
share, and the sum carries the noise of at least ``min_survivors`` shares.

Accounting (Kairouz et al. 2021, Theorem 1 / Proposition 14): the sum of n independent
N_Z(0, sigma_c^2) shares, for integer inputs whose sum changes by at most Delta in L2 norm, is
``1/2 eps^2``-concentrated DP with ``eps = Delta / (sqrt(n) sigma_c) + tau sqrt(d)``, where
``tau = 10 sum_{k=1}^{n-1} exp(-2 pi^2 sigma_c^2 k / (k + 1))``. pflx records it as dp_accounting's
``ZCDpEvent(rho = eps^2 / 2)`` (rho-zCDP, Bun & Steinke 2016, which the RDP accountant takes as
(alpha, rho alpha)-RDP), self-composed over the rounds. n is the *minimum surviving cohort*
``min_survivors`` (public): a client that drops after adding its share takes its noise with it, so the
noise is calibrated for the fewest shares that reach a released sum (a round with fewer survivors
releases nothing: secure aggregation's threshold, Bonawitz et al. 2017); tau is taken at the largest
cohort (it grows with n). The server picks the cohort (clients_per_round, uniformly), so it knows who
takes part: no amplification by subsampling is claimed, and the guarantee holds against the server
too. Neighbouring datasets differ by adding or removing one client: the server's cohort of a fixed size
then differs in at most one slot, one client's update in place of another's, so the sum moves by at most
Delta = 2 Delta_2 (replace-one); the output is a mixture over the server's uniform choice of cohort, coupled
slot for slot, and the Renyi divergence is jointly quasi-convex, so the bound of each coupled pair holds for
the mixture (and for replace-one neighbours directly). Modular wrap-around is post-processing of the noisy sum: it costs accuracy, never privacy; ``scale``
is chosen so that a coordinate of the sum stays inside the range even when one client's whole norm sits
on it and the noise is 10 of its standard deviations.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any, Mapping

from pfl_cli.errors import ConfigError

MECHANISM = "ddg"
NOISE_RANGE = 10.0  # standard deviations of the summed noise kept inside the modular range


def discrete_gaussian(sigma: float, shape, gen):
    """i.i.d. N_Z(0, sigma^2) integers (int64) of ``shape``: Canonne, Kamath & Steinke 2020, Algorithm 3.

    A discrete Laplace proposal of scale t = floor(sigma) + 1 (the difference of two geometric draws
    floor(-t ln U)), accepted with probability exp(-(|Y| - sigma^2 / t)^2 / (2 sigma^2)); rejected
    positions draw again. Floating point on the uniforms of ``gen`` (:func:`pfl_cli.privacy.randomness.uniform`:
    CSPRNG unless noise=seeded), not the paper's exact rational arithmetic.
    """
    import torch

    from pfl_cli.privacy.randomness import uniform

    n = math.prod(shape)
    out = torch.zeros(n, dtype=torch.int64)
    todo = torch.arange(n)
    t = math.floor(sigma) + 1
    while len(todo):
        u = 1.0 - uniform(gen, (3, len(todo)), device="cpu").to(torch.float64)  # (0, 1]
        y = torch.floor(-t * torch.log(u[0])) - torch.floor(-t * torch.log(u[1]))
        accept = u[2] <= torch.exp(-(y.abs() - sigma * sigma / t) ** 2 / (2.0 * sigma * sigma))
        out[todo[accept]] = y[accept].to(torch.int64)
        todo = todo[~accept]
    return out.view(*shape)


def clip_rows(contributions: Mapping[str, Any], clip: float) -> dict[str, Any]:
    """Each row (client) scaled to L2 norm at most ``clip`` over all names jointly (DP-FedAvg's clip, the same
    rule as :func:`pfl_cli.fl.dp.clip_per_client`, here so that ``privacy`` does not import ``fl``)."""
    import torch

    norm = torch.sqrt(sum(v.flatten(1).pow(2).sum(1) for v in contributions.values()))
    scale = torch.where(norm > clip, clip / norm.clamp_min(1e-30), torch.ones_like(norm))
    return {k: v * scale.view(-1, *([1] * (v.dim() - 1))) for k, v in contributions.items()}


def tau(sigma: float, n: int) -> float:
    """Kairouz et al. 2021, Theorem 1: tau = 10 sum_{k=1}^{n-1} exp(-2 pi^2 sigma^2 k / (k + 1))."""
    return 10.0 * sum(math.exp(-2.0 * math.pi ** 2 * sigma ** 2 * k / (k + 1)) for k in range(1, n))


def integer_scale(noise_multiplier: float, *, cohort: int, min_survivors: int, dim: int, bits: int) -> float:
    """s: integer units per clip norm, the largest for which a coordinate of the sum fits in [-2^(b-1), 2^(b-1)).

    Worst case: every one of ``cohort`` clients puts its whole norm s (plus one rounding unit) on one
    coordinate, and the noise of the sum (std z Delta_2 sqrt(cohort / min_survivors) at most, Delta_2 =
    s + sqrt(d)) reaches :data:`NOISE_RANGE` standard deviations. Returns 0 when no positive s fits.
    """
    half = 2.0 ** (bits - 1)
    spread = NOISE_RANGE * noise_multiplier * math.sqrt(cohort / min_survivors)
    return max(0.0, (half - cohort - spread * math.sqrt(dim)) / (cohort + spread))


@dataclass(frozen=True)
class DistributedDiscreteGaussian:
    """A calibrated distributed discrete Gaussian mechanism for ``rounds`` rounds of a fixed cohort.

    Parameters
    ----------
    epsilon, delta : float
        The target guarantee of the whole run.
    clip : float
        Public L2 bound C of one client's update.
    cohort : int
        Clients per round (chosen by the server, uniformly); the fixed denominator of the mean.
    min_survivors : int
        The public minimum number of noise shares in a released sum (the noise is calibrated for it).
    bits : int
        b: secure aggregation's modulus is 2^b.
    dim : int
        d: coordinates of one update (the model's parameters).
    rounds : int
    noise_multiplier : float
        z: the noise of a sum of ``min_survivors`` shares has standard deviation z Delta_2 (integer units).
    """

    epsilon: float
    delta: float
    clip: float
    cohort: int
    min_survivors: int
    bits: int
    dim: int
    rounds: int
    noise_multiplier: float
    contribution: str = "update"
    accountant: str = "rdp"

    unit = "client"

    # -- the mechanism's numbers ---------------------------------------------------------------
    @property
    def modulus(self) -> int:
        return 2 ** self.bits

    @property
    def scale(self) -> float:
        return integer_scale(self.noise_multiplier, cohort=self.cohort, min_survivors=self.min_survivors,
                             dim=self.dim, bits=self.bits)

    @property
    def sensitivity(self) -> float:
        """Delta_2: the L2 norm of a clipped, scaled, randomly rounded update is at most s + sqrt(d)."""
        return self.scale + math.sqrt(self.dim)

    @property
    def client_sigma(self) -> float:
        """sigma_c: each client's share, so that ``min_survivors`` shares have std z Delta_2."""
        return self.noise_multiplier * self.sensitivity / math.sqrt(self.min_survivors)

    @property
    def denominator(self) -> float:
        return float(self.cohort)

    def sample_cohort(self, clients, size: int, gen):
        """``size`` of ``clients`` uniformly without replacement, chosen by the server (no amplification claimed)."""
        import torch

        return clients[torch.randperm(len(clients), generator=gen)[:size].to(clients.device)]

    # -- the client's half ------------------------------------------------------------------------
    def client_rows(self, contributions: Mapping[str, Any], gen) -> dict[str, Any]:
        """Each row (client) clipped, scaled, randomly rounded, its noise share added, modulo 2^b (int64)."""
        import torch

        from pfl_cli.privacy.randomness import uniform

        s = self.scale
        out = {}
        for k, v in clip_rows(contributions, self.clip).items():
            x = v.detach().to("cpu", torch.float64) * (s / self.clip)
            low = torch.floor(x)
            up = uniform(gen, tuple(x.shape), device="cpu").to(torch.float64) < (x - low)
            rounded = low.to(torch.int64) + up.to(torch.int64)
            noisy = rounded + discrete_gaussian(self.client_sigma, tuple(x.shape), gen)
            out[k] = noisy.remainder(self.modulus).to(v.device)
        return out

    # -- the server's half ------------------------------------------------------------------------
    def release_sum(self, total, gen=None) -> dict[str, Any]:
        """The secure sum (mod 2^b) centred, back in update units, divided by the cohort size.

        A round with fewer than ``min_survivors`` contributions releases nothing (secure aggregation's
        threshold): the server step gets a zero mean update.
        """
        import torch

        sums = total.total()
        if total.count() < self.min_survivors:
            return {k: torch.zeros(v.shape, dtype=torch.float32, device=v.device) for k, v in sums.items()}
        half, unit = self.modulus // 2, self.clip / self.scale
        out = {}
        for k, v in sums.items():
            v = v.remainder(self.modulus)
            centred = torch.where(v >= half, v - self.modulus, v)
            out[k] = (centred.to(torch.float64) * unit / self.denominator).to(torch.float32)
        return out

    # -- the ledger --------------------------------------------------------------------------------
    def round_event(self, noise_multiplier: float | None = None):
        """One round: ``ZCDpEvent(rho)``, rho = (2/z + tau sqrt(d))^2 / 2 (Kairouz et al. 2021, Theorem 1, with
        n = min_survivors shares, the sum's sensitivity 2 Delta_2 of a replaced cohort slot; tau at the largest
        cohort)."""
        from dp_accounting import dp_event

        mech = self if noise_multiplier is None else dataclasses.replace(self, noise_multiplier=noise_multiplier)
        if mech.noise_multiplier <= 0 or mech.scale <= 0:
            return dp_event.NonPrivateDpEvent()
        eps = 2.0 / mech.noise_multiplier + tau(mech.client_sigma, mech.cohort) * math.sqrt(mech.dim)
        return dp_event.ZCDpEvent(rho=0.5 * eps * eps)

    def event(self, noise_multiplier: float | None = None):
        from dp_accounting import dp_event

        return dp_event.SelfComposedDpEvent(self.round_event(noise_multiplier), self.rounds)

    def note(self) -> str:
        return (f"{self.rounds} rounds of distributed DP-FedAvg with the distributed discrete Gaussian (Kairouz, Liu "
                f"& Steinke 2021) under secure aggregation mod 2^{self.bits}: each of {self.cohort} cohort clients "
                f"clips its {self.contribution} to L2 {self.clip:g}, scales it to {self.scale:.6g} units, rounds "
                f"randomly (sensitivity {self.sensitivity:.6g}) and adds discrete Gaussian noise std "
                f"{self.client_sigma:.6g} (Canonne, Kamath & Steinke 2020 Alg. 3, floating point); accounted for a surviving cohort of at least {self.min_survivors} clients "
                f"(clients that drop after adding noise take their share with it; a round with fewer releases "
                f"nothing), zCDP per round (Theorem 1, sensitivity 2 x {self.sensitivity:.6g}: a client added or removed "
                f"changes one slot of the fixed cohort) composed by the RDP accountant; no amplification by "
                f"subsampling (the server picks the cohort)")

    def ledger(self):
        from pfl_cli.privacy import PrivacyLedger

        return PrivacyLedger(self.unit, self.delta, (self.event(),), "add-remove", (self.note(),), "rdp")

    def info(self) -> dict[str, Any]:
        return {"unit": "client", "mechanism": "distributed discrete Gaussian (secure aggregation)",
                "epsilon": self.epsilon, "delta": self.delta, "clip": self.clip, "cohort": self.cohort,
                "min_survivors": self.min_survivors,
                "surviving_cohort_assumption": f"at least {self.min_survivors} of {self.cohort} clients' noise "
                                               "shares reach every released sum",
                "bits": self.bits, "dim": self.dim, "scale": self.scale, "sensitivity": self.sensitivity,
                "rounds": self.rounds, "noise_multiplier": self.noise_multiplier,
                "client_noise_std": self.client_sigma, "noise_std_on_sum": self.noise_multiplier * self.sensitivity,
                "denominator": self.denominator, "accountant": "rdp", "sampling_rate": 1.0,
                "cohorts": "fixed size, server-chosen (no amplification: q = 1 in the accounting)",
                "sampler": "discrete Gaussian: Canonne, Kamath & Steinke 2020 Alg. 3 in floating point on CSPRNG "
                           "uniforms (not their exact rational arithmetic)",
                "selection": "last round"}


def check_distributed_options(cfg) -> None:
    """The distributed mechanism's own rules, from public inputs only (before any data is read)."""
    if cfg.dp_mechanism != MECHANISM:
        return
    if not cfg.secagg:
        raise ConfigError("dp_mechanism=ddg adds each client's noise share before secure aggregation; add --secagg "
                          "(or use the central mechanism, dp_mechanism=central).")
    if cfg.clients_per_round is None:
        raise ConfigError("dp_mechanism=ddg needs a public cohort size (its noise shares are calibrated for it); "
                          "set --clients-per-round.")
    for name in ("dp_population", "dp_sampling_rate"):
        if getattr(cfg, name) is not None:
            raise ConfigError(f"{name} sets Poisson sampling of the central mechanism; dp_mechanism=ddg samples fixed "
                              f"cohorts chosen by the server and claims no amplification; got {getattr(cfg, name)!r}. "
                              "Drop it.")
    if cfg.dp_accountant != "rdp":
        raise ConfigError("dp_mechanism=ddg is accounted in zCDP, which dp_accounting's PLD accountant does not take; "
                          f"use dp_accountant=rdp; got {cfg.dp_accountant!r}.")
    t = cfg.dp_min_survivors
    if t is not None and t > cfg.clients_per_round:
        raise ConfigError(f"dp_min_survivors must be at most the cohort (clients_per_round {cfg.clients_per_round}); "
                          f"got {t}.")
    if not (isinstance(cfg.dp_bits, int) and 8 <= cfg.dp_bits <= 62):
        raise ConfigError(f"dp_bits must be an integer in [8, 62] (the sums are int64); got {cfg.dp_bits!r}.")


def calibrate_distributed_dp(cfg, dim: int, *, contribution: str = "update") -> DistributedDiscreteGaussian:
    """The noise multiplier z meeting (eps, delta) over ``cfg.rounds`` rounds, from public inputs only."""
    from pfl_cli.errors import check_param
    from pfl_cli.privacy import calibrate_noise

    check_distributed_options(cfg)
    rounds = int(cfg.rounds)
    check_param("rounds", rounds >= 1, "must be >= 1 with --dp", rounds)
    cohort = int(cfg.clients_per_round)
    draft = DistributedDiscreteGaussian(float(cfg.dp_epsilon), float(cfg.dp_delta), float(cfg.dp_clip), cohort,
                                        int(cfg.dp_min_survivors or cohort), int(cfg.dp_bits), int(dim), rounds,
                                        float("nan"), contribution)
    # The largest z whose scale leaves an update at least 4 sqrt(d) integer units (else rounding dominates):
    # integer_scale(z) >= 4 sqrt(d) solved for the noise spread k = NOISE_RANGE z sqrt(cohort / min_survivors).
    root_d, survivors = math.sqrt(dim), draft.min_survivors
    spread_max = (2.0 ** (draft.bits - 1) - cohort * (1 + 4 * root_d)) / (5 * root_d)
    z_max = min(1e4, spread_max / (NOISE_RANGE * math.sqrt(cohort / survivors)))
    fix = (f"dp_bits {cfg.dp_bits}: too few bits for this model ({dim} parameters) at the noise (epsilon "
           f"{draft.epsilon:g}, {rounds} rounds) needs: a coordinate of the sum would not fit modulo 2^{cfg.dp_bits} "
           f"with an update of at least 4 sqrt(d) integer units; raise dp_bits (e.g. --set dp_bits={cfg.dp_bits + 4}).")
    if z_max <= 0.01:
        raise ConfigError(fix)
    from pfl_cli.errors import PrivacyBudgetError

    try:
        cal = calibrate_noise(draft.event, draft.epsilon, draft.delta, accountant="rdp", max_noise=z_max)
    except PrivacyBudgetError:
        if z_max < 1e4:
            raise ConfigError(fix) from None
        raise
    return dataclasses.replace(draft, noise_multiplier=float(cal.noise_multiplier))
