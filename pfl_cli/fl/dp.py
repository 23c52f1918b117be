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
Poisson-sampled Gaussian events, unit "client". Everything that sets the mechanism is public
(release contract, :mod:`pfl_cli.privacy.release`): the clip C is the user's; q is
``dp_sampling_rate`` or ``clients_per_round / N`` for the *public* population bound N of
``--dp ...,population=N`` (the number of enrolled clients), never the partition's private
number of clients; the denominator is q N (``clients_per_round`` when no N is given). delta
< 1/N is checked against that bound, or not at all (``privacy.json`` says which).
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any, Mapping

from pfl_cli.errors import ConfigError, check_param


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
    population : int or None
        N, the public bound on the number of clients (``--dp ...,population=N``), or None.
    denominator : float
        The fixed denominator: q N, or ``clients_per_round`` (the expected cohort) without N.
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
    population: int | None
    rounds: int
    noise_multiplier: float
    accountant: str = "rdp"
    contribution: str = "update"
    denominator: float = 1.0
    # The expected share of sampled clients that answer under federation conditions (availability x (1 - dropout),
    # public inputs; pfl_cli.fl.conditions): the fixed denominator becomes q N r, the expected answering cohort,
    # so the noise on the released mean is z C / (q N r). The accounting keeps q: a client that does not answer
    # only removes its contribution (the sensitivity stays C), and the dropouts are drawn from the seeded stream,
    # not secret, so no amplification by them is claimed.
    answer_rate: float = 1.0

    def sample_cohort(self, clients, size: int, gen):
        """Each of ``clients`` independently with probability q (may be empty); ``size`` is not used."""
        from pfl_cli.privacy.randomness import uniform

        keep = uniform(gen, (len(clients),)) < self.sampling_rate  # OS entropy unless noise=seeded
        return clients[keep.to(clients.device)]

    def private_mean(self, contributions: Mapping[str, Any], gen) -> dict[str, Any]:
        """Clip each client's contribution, sum, add Gaussian noise, divide by q N.

        Parameters
        ----------
        contributions : dict name -> Tensor (c, *shape)
            One row per cohort client; the clip applies to the L2 norm over all names jointly.
        gen : torch.Generator
            The noise stream (:mod:`pfl_cli.privacy.randomness`: secure unless noise=seeded).
        """
        clipped = clip_per_client(contributions, self.clip)
        return self._noisy_mean({k: v.sum(0) for k, v in clipped.items()}, gen)

    def _noisy_mean(self, sums: Mapping[str, Any], gen) -> dict[str, Any]:
        from pfl_cli.privacy.randomness import standard_normal

        std = self.noise_multiplier * self.clip if self.noise_multiplier > 0 else 0.0  # z = 0 with C = inf: none
        out = {}
        for k, s in sums.items():
            noise = standard_normal(gen, s.shape, dtype=s.dtype).to(s.device)
            out[k] = (s + std * noise) / (self.denominator * self.answer_rate)
        return out

    # Under --secagg (pfl_cli.fl.secagg) the same mechanism in two halves: each client clips its own
    # contribution, secure aggregation sums them, the server adds the noise to the sum it learns.
    def client_rows(self, contributions: Mapping[str, Any], gen=None) -> dict[str, Any]:
        """A client's half under secure aggregation: its contribution clipped to L2 ``clip`` (no noise)."""
        return clip_per_client(contributions, self.clip)

    def release_sum(self, total, gen) -> dict[str, Any]:
        """The server's half: Gaussian noise on the secure sum, divided by the fixed denominator
        (equal to :meth:`private_mean` on the same rows and noise stream)."""
        return self._noisy_mean(total.total(), gen)

    unit = "client"

    @property
    def compositions(self) -> int:
        return self.rounds

    def note(self) -> str:
        from pfl_cli.privacy.release import population_note

        return (f"{self.rounds} rounds of DP-FedAvg (McMahan et al. 2018): Poisson cohorts at rate q = "
                f"{self.sampling_rate:.6g}, each client's {self.contribution} clipped to L2 {self.clip:g}, Gaussian "
                f"noise std {self.noise_multiplier:.6g} x clip on the sum, divided by {self.denominator:.6g}"
                f"{self._answering_note()}; {population_note(self.population)}")

    def _answering_note(self) -> str:
        if self.answer_rate == 1.0:
            return ""
        return (f" x the expected answer rate {self.answer_rate:.6g} (availability and dropout: the expected "
                "answering cohort; the accounting keeps q, as a client that does not answer only removes its "
                "contribution)")

    def info(self) -> dict[str, Any]:
        return {"unit": "client", "epsilon": self.epsilon, "delta": self.delta, "clip": self.clip,
                "sampling_rate": self.sampling_rate, "population_bound": self.population, "rounds": self.rounds,
                "denominator": self.denominator, "noise_multiplier": self.noise_multiplier,
                "noise_std_on_sum": self.noise_multiplier * self.clip, "accountant": self.accountant,
                "cohorts": "poisson", "selection": "last round",
                **({} if self.answer_rate == 1.0 else {
                    "answer_rate": self.answer_rate, "answering_denominator": self.denominator * self.answer_rate,
                    "noise_std_on_mean": self.noise_multiplier * self.clip / (self.denominator * self.answer_rate)})}


def audited_step(updates, *, clip: float, noise_multiplier: float, denominator: float, rng):
    """:meth:`ClientLevelDP.private_mean` on rows of a numpy array: the DP-FedAvg step the privacy audit runs.

    The audit (``pfl_cli.privacy.audit_cases``, case "dp-fedavg-step") calls it with numpy
    rows and generator; the noise comes from a torch generator seeded from ``rng``.
    """
    import torch

    mech = ClientLevelDP(float("nan"), float("nan"), float(clip), 1.0, None, 1, float(noise_multiplier),
                         denominator=float(denominator))
    gen = torch.Generator().manual_seed(int(rng.integers(2**63 - 1)))
    return mech.private_mean({"u": torch.as_tensor(updates, dtype=torch.float64)}, gen)["u"].numpy()


def clip_per_client(contributions: Mapping[str, Any], clip: float) -> dict[str, Any]:
    """Scale each row (client) so its L2 norm over all tensors jointly is at most ``clip``."""
    import torch

    sq = sum(v.flatten(1).pow(2).sum(1) for v in contributions.values())  # flatten: also for 0 rows
    norm = torch.sqrt(sq)
    scale = torch.where(norm > clip, clip / norm.clamp_min(1e-30), torch.ones_like(norm))
    return {k: v * scale.view(-1, *([1] * (v.dim() - 1))) for k, v in contributions.items()}


def check_dp_options(cfg) -> None:
    """The --dp options' own rules, before any data is read (also for values from a config file)."""
    from pfl_cli.privacy.release import parse_dp_spec

    def number(name, value):
        ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
        check_param(name, ok, "must be a finite number", value)
        return f"{value!r}"

    text = f"eps={number('--dp eps', cfg.dp_epsilon)},delta={number('--dp delta', cfg.dp_delta)}"
    if cfg.dp_clip is not None:
        text += f",clip={number('--dp clip', cfg.dp_clip)}"
    if cfg.dp_population is not None:
        text += f",population={number('--dp population', cfg.dp_population)}"
    from pfl_cli.privacy.randomness import check_noise

    check_noise(cfg.dp_noise, param="--dp noise (dp_noise)")
    parse_dp_spec(text)  # the shared rules: eps > 0, delta in (0, 1), clip > 0, delta < 1/population
    if cfg.dp_clip is None:
        raise ConfigError("--dp needs clip=C, the public L2 bound of one client's update (per-sample gradient for "
                          "the local-DP algorithms); it calibrates the noise, so it must be chosen without "
                          "looking at the private data, e.g. --dp eps=4,clip=1.")
    if cfg.dp_sampling_rate is not None:
        rate = cfg.dp_sampling_rate
        check_param("dp_sampling_rate", isinstance(rate, (int, float)) and 0 < rate <= 1, "must be in (0, 1]", rate)
    if cfg.normalize:
        raise ConfigError("normalize standardizes inputs with statistics of the private train clients, which --dp "
                          "does not release; pass --set normalize=false with --dp (scale inputs by a public bound).")


def calibrate_client_dp(cfg, *, contribution: str = "update") -> ClientLevelDP:
    """Calibrate the noise multiplier for ``cfg.rounds`` Poisson-sampled rounds, from public inputs only.

    q is ``cfg.dp_sampling_rate`` or ``clients_per_round / dp_population`` (at most 1).
    """
    from pfl_cli.fl.config import planned_cohort
    from pfl_cli.privacy import calibrate_noise

    check_dp_options(cfg)
    population = cfg.dp_population
    if cfg.dp_sampling_rate is None and population is None:
        raise ConfigError("DP-FedAvg samples Poisson cohorts at rate q = clients-per-round / N, and the number of "
                          "clients is private: give a public bound, e.g. --dp eps=4,clip=1,population=1000 (the "
                          "enrolled clients), or the rate itself with --set dp_sampling_rate=Q.")
    cohort = planned_cohort(cfg)
    if cohort is None and (cfg.dp_sampling_rate is None or population is None):
        raise ConfigError("DP-FedAvg needs a public expected cohort: set clients_per_round (every train client is a "
                          "private number), or give both population and dp_sampling_rate.")
    rate = cfg.dp_sampling_rate if cfg.dp_sampling_rate is not None else min(1.0, cohort / population)
    denominator = rate * population if population is not None else float(cohort)
    rounds = int(cfg.rounds)
    check_param("rounds", rounds >= 1, "must be >= 1 with --dp", rounds)
    draft = ClientLevelDP(float(cfg.dp_epsilon), float(cfg.dp_delta), float(cfg.dp_clip), float(rate), population,
                          rounds, float("nan"), cfg.dp_accountant, contribution, float(denominator))
    cal = calibrate_noise(draft.event, draft.epsilon, draft.delta, accountant=cfg.dp_accountant)
    return dataclasses.replace(draft, noise_multiplier=float(cal.noise_multiplier))


# -- checkpoints under --dp (issue 21) ------------------------------------------------------------
CHECKPOINT_HOLDS = ("released model state (a function of the mechanism's outputs), the public config and its noise "
                    "mode, and the state each client keeps on its own device (marked client_held); no evaluation "
                    "on private data, no training loss, no traffic counts")


def private_snapshot(alg, round_: int, noise: str) -> dict:
    """The checkpoint of a ``--dp`` run after ``round_``: what the threat model lets the server keep.

    ``alg.state()`` is split into what was released (the global model and optimizer state: post-
    processing of the noisy sums) and ``client_held``: the names in ``alg.client_held_state``
    (PPSGD/CENTAUR's personal heads), state a real client keeps on its own device and never sends.
    The evaluation history, the running loss, the selected "best" evaluation and the realized
    cohort counts are computed on private data and are not kept.
    """
    state = alg.state()
    held = tuple(getattr(alg, "client_held_state", ()))
    return {"round": round_, "algorithm_name": alg.name, "private_run": True, "dp_noise": noise,
            "holds": CHECKPOINT_HOLDS,
            "algorithm": {k: v for k, v in state.items() if k not in held},
            "client_held": {k: state[k] for k in held if k in state}}


def restore_private(alg, snapshot: dict) -> None:
    """Load a :func:`private_snapshot` back into ``alg`` (client-held state returns to its clients)."""
    alg.load_state({**snapshot["algorithm"], **snapshot.get("client_held", {})})


def released_state_finite(alg) -> bool:
    """Whether every tensor of the released weights is finite: the divergence test under --dp.

    The training loss is computed on private data, so under ``--dp`` divergence is judged on the
    released model only (post-processing), and no message carries a private number.
    """
    import torch

    def finite(node) -> bool:
        if isinstance(node, dict):
            return all(finite(v) for v in node.values())
        return not torch.is_tensor(node) or bool(torch.isfinite(node).all())

    return finite(alg.weights())
