"""Client-level differentially private MDM fitting (thesis §3.1, §3.5).

The thesis notes that Algorithms 5 and 6 only ever use sums of client statistics, so
central DP needs (1) a bound on what one client can add to each sum and (2) Gaussian
noise on the sums. This module does both and records every release in a
:class:`~pfl_cli.privacy.ledger.PrivacyLedger`.

Per release the server receives the sums of normalized blocks, each of L2 norm <= 1 per
client, so one client changes the released vector by at most ``sqrt(#blocks)`` and one
noise multiplier ``z`` (calibrated to the whole budget) covers it:

- Algorithm 5: ``E^i`` (one-hot), ``P^i`` (row ``c/m``, norm <= 1), ``Q^i`` (row
  ``(c/m)^2``, norm <= 1): 3 blocks, no clipping needed.
- Algorithm 6: ``E^i`` (``w^i`` in one column, norm <= 1; ``omega = E @ 1`` is derived
  from it, not released twice) and ``(alpha_k * u^i_k, alpha_k0 * v^i_k)`` clipped
  jointly to L2 norm ``clip`` and divided by it: 2 blocks. Multiplying by the current
  alpha (public) is exact algebra -- ``alpha * u / v = (alpha * u) / (alpha_0 v) * alpha_0``
  -- and bounds the block by the client's counts (``a * (psi(c+a) - psi(a)) <= c``), so a
  ``clip`` of about the clients' size keeps most clients unclipped.

Cohorts are Poisson samples so that the accountant's subsampling amplification applies.
Their rate ``cohort size / population`` uses the *public* population bound N of
``--dp ...,population=N``, never the private number of clients; with no cohort size every
round uses all clients (rate 1, a plain Gaussian release). The server post-processes the
noisy sums into valid parameters (clamping at 0, floors, renormalization), which costs no
privacy.

Public bounds (release contract, :mod:`pfl_cli.privacy.release`): the size model's
support ``1..M`` and the default ``clip`` come from the user's ``max_samples`` M, never
from the largest client seen; a client holding more than M samples is cut down to M
before anything is computed (:func:`cap_client_sizes`), so one client's blocks keep
their bound whatever its size.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from pfl_cli.errors import ConfigError, InputError, check_param
from pfl_cli.mdm.init import InitStatistics

if TYPE_CHECKING:  # the kernels (scipy) load when a DP fit runs, not when --dp is parsed
    from pfl_cli.mdm import _kernels as K

INIT_BLOCKS = 3
ROUND_BLOCKS = 2


def parse_dp(text: str):
    """Parse ``eps=E[,delta=D][,clip=B][,population=N]`` into a :class:`~pfl_cli.privacy.release.DPSpec`.

    Examples
    --------
    >>> parse_dp("eps=1,delta=1e-6")
    DPSpec(epsilon=1.0, delta=1e-06, clip=None, population=None, noise='secure')
    """
    from pfl_cli.privacy.release import parse_dp_spec

    return parse_dp_spec(text)


def cap_client_sizes(counts: np.ndarray, max_samples: int) -> np.ndarray:
    """Cut every histogram with more than ``max_samples`` counts down to exactly that many.

    Proportional scaling with largest-remainder rounding, all clients at once: a client's
    capped histogram depends on its own counts only, so the per-client bounds (and the
    sensitivity) hold with the public M whatever the private sizes are.

    Examples
    --------
    >>> cap_client_sizes(np.array([[6, 3, 1], [1, 1, 0]]), 5).tolist()
    [[3, 2, 0], [1, 1, 0]]
    """
    counts = np.asarray(counts, dtype=np.int64)
    sizes = counts.sum(axis=1, keepdims=True)
    big = sizes[:, 0] > max_samples
    if not big.any():
        return counts
    share = counts[big] * (max_samples / sizes[big])
    base = np.floor(share).astype(np.int64)
    missing = max_samples - base.sum(axis=1)
    # Rank each row's fractional parts (largest first, ties to the lower category) and
    # give one more count to the `missing` largest.
    order = np.argsort(-(share - base), axis=1, kind="stable")
    rank = np.empty_like(order)
    np.put_along_axis(rank, order, np.arange(counts.shape[1])[None].repeat(len(order), 0), axis=1)
    capped = counts.copy()
    capped[big] = base + (rank < missing[:, None])
    return capped


@dataclass(frozen=True)
class DPMechanism:
    """Clipping, noise and accounting of a DP fit; :meth:`bind` calibrates it to a run.

    Parameters
    ----------
    epsilon, delta : float
        The client-level (epsilon, delta) budget of the whole fit.
    clip : float, optional
        L2 bound of a client's scaled ``(alpha * u, alpha_0 * v)`` upload; default M,
        the public largest client size the model covers.
    accountant : {"rdp", "pld"}, default="rdp"
    population : int, optional
        Public bound N on the number of clients: Poisson cohorts sample at rate
        ``cohort_size / N``. Needed only with a cohort size.
    """

    epsilon: float
    delta: float = 1e-6
    clip: float | None = None
    accountant: str = "rdp"
    population: int | None = None
    # Testing hook: scales the calibrated noise (0 = noise off, which is NOT private; the
    # ledger still records the calibrated mechanism). Never set by the CLI.
    _noise_factor: float = 1.0
    # Filled by bind().
    noise_multiplier: float = float("nan")
    init_rate: float = 1.0
    round_rate: float = 1.0
    rounds: int = 0
    noise: str = "secure"   # --dp noise=: where the fit's draws come from (pfl_cli.privacy.randomness)

    def bind(self, *, cohort_size: int | None, init_cohort_size: int | None, rounds: int, restarts: int,
             max_samples: int) -> "DPMechanism":
        """Calibrate the noise multiplier so the whole fit meets (epsilon, delta).

        Everything here is public: sizes and rates come from the arguments and the
        population bound, never from the data.
        """
        from pfl_cli.privacy import calibrate_noise

        check_param("epsilon", self.epsilon > 0 and math.isfinite(self.epsilon), "must be a finite number > 0", self.epsilon)
        check_param("delta", 0 < self.delta < 1, "must be in (0, 1)", self.delta)
        if restarts != 1:
            raise InputError(f"restarts must be 1 with --dp (choosing the best restart would use non-private "
                             f"log-likelihoods); got {restarts}.")
        clip = float(max_samples) if self.clip is None else float(self.clip)
        check_param("clip", clip > 0 and math.isfinite(clip), "must be a finite number > 0", self.clip)
        bound = dataclasses.replace(self, clip=clip, init_rate=self._rate(init_cohort_size, "init_cohort_size"),
                                    round_rate=self._rate(cohort_size, "cohort_size"), rounds=rounds)
        cal = calibrate_noise(bound._event, self.epsilon, self.delta, accountant=self.accountant)
        return dataclasses.replace(bound, noise_multiplier=float(cal.noise_multiplier))

    def _rate(self, size: int | None, name: str) -> float:
        if size is None:
            return 1.0
        if self.population is None:
            raise ConfigError(f"--{name.replace('_', '-')} with --dp samples Poisson cohorts at rate size / population, "
                              f"and the number of clients is private: give a public bound, e.g. --dp eps=1,"
                              f"population=N, or drop --{name.replace('_', '-')} to use every client each round.")
        return min(1.0, size / self.population)

    def _event(self, z: float):
        from dp_accounting import dp_event

        from pfl_cli.privacy import sampled_gaussian_event

        events = [sampled_gaussian_event(z, self.init_rate, 1)]
        if self.rounds:
            events.append(sampled_gaussian_event(z, self.round_rate, self.rounds))
        return dp_event.ComposedDpEvent(events)

    # -- the releases ----------------------------------------------------------------
    def cohort(self, n: int, rate: float, rng: np.random.Generator) -> np.ndarray | slice:
        """Poisson cohort of the ``n`` clients with the public ``rate`` (all clients at rate 1)."""
        if rate >= 1:
            return slice(0, n)
        return np.flatnonzero(rng.random(n) < rate)

    def _sigma(self, blocks: int) -> float:
        return self.noise_multiplier * math.sqrt(blocks) * self._noise_factor

    def _noise(self, shape, sigma: float, rng: np.random.Generator) -> np.ndarray:
        from pfl_cli.privacy import gaussian_noise

        return gaussian_noise(shape, sigma, rng) if sigma > 0 else np.zeros(shape)

    def noisy_init_sums(self, counts, bins, k, s, r_init, r_noise) -> InitStatistics:
        """Algorithm 5's sums plus Gaussian noise (the blocks need no clipping)."""
        from pfl_cli.mdm.init import init_client_sums

        if len(counts):
            sums = init_client_sums(counts, bins, k, s, r_init)
        else:
            sums = InitStatistics(np.zeros((k, s)), np.zeros((k, counts.shape[1])), np.zeros((k, counts.shape[1])))
        sigma = self._sigma(INIT_BLOCKS)
        return InitStatistics(
            e=sums.e + self._noise(sums.e.shape, sigma, r_noise),
            p=sums.p + self._noise(sums.p.shape, sigma, r_noise),
            q=sums.q + self._noise(sums.q.shape, sigma, r_noise),
        )

    def release_round_sums(self, data: K.ClientData, params, r_noise: np.random.Generator):
        """The mechanism of one Algorithm 6 round: noisy ``E`` and noisy clipped ``(alpha*u, alpha0*v)`` sums.

        This is exactly what the ledger's round event covers (2 blocks, each of L2 norm
        <= 1 per client after dividing the second by ``clip``); :meth:`noisy_round_sums`
        post-processes it.
        """
        from pfl_cli.mdm import _kernels as K
        from pfl_cli.privacy import clip_l2

        k, c, s = params.num_components, params.num_categories, params.size_probs.shape[1]
        alpha0 = params.alpha.sum(axis=1)
        e = np.zeros((k, s))
        scaled = np.zeros(k * (c + 1))
        for chunk in data.chunks if data.num_clients else ():
            w, b, u, v = K.client_statistics(chunk, params, slice(0, chunk.num_clients))
            inside = b >= 0
            for j in range(k):  # K bincounts, not a loop over clients
                e[j] += np.bincount(b[inside], weights=w[inside, j], minlength=s)
            vec = np.concatenate([(u * params.alpha[None]).reshape(len(w), -1), v * alpha0[None]], axis=1)
            scaled += clip_l2(vec, self.clip, axis=1).sum(axis=0)
        sigma = self._sigma(ROUND_BLOCKS)
        return e + self._noise(e.shape, sigma, r_noise), scaled + self._noise(scaled.shape, sigma * self.clip, r_noise)

    def noisy_round_sums(self, data: K.ClientData, params, r_noise: np.random.Generator) -> K.SummedStatistics:
        """One round's released sums (:meth:`release_round_sums`), converted back to ``(omega, E, u, v)``."""
        from pfl_cli.mdm import _kernels as K

        k, c, s = params.num_components, params.num_categories, params.size_probs.shape[1]
        alpha0 = params.alpha.sum(axis=1)
        sigma = self._sigma(ROUND_BLOCKS)
        e_noisy, scaled = self.release_round_sums(data, params, r_noise)
        omega = e_noisy.sum(axis=1)
        # A component whose noisy weight is within 3 noise std of zero is treated as empty.
        omega = np.where(omega > 3 * sigma * math.sqrt(s), omega, 0.0)
        u_tilde, v_tilde = scaled[: k * c].reshape(k, c), scaled[k * c:]
        return K.SummedStatistics(
            omega=omega, e=np.maximum(e_noisy, 0.0), u=np.maximum(u_tilde, 0.0) / params.alpha,
            v=v_tilde / alpha0, cohort_size=max(int(round(float(np.maximum(omega, 0).sum()))), 1),
        )

    # -- the record -------------------------------------------------------------------
    def ledger(self):
        from pfl_cli.privacy import PrivacyLedger

        notes = ["Algorithm 5 (init): sums of E, P, Q per client (3 blocks of L2 norm <= 1), Gaussian noise"]
        if self.rounds:
            notes.append(f"Algorithm 6: {self.rounds} rounds of sums of E and (alpha*u, alpha0*v) clipped to L2 "
                         f"{self.clip:g} (2 blocks), Gaussian noise")
        from pfl_cli.privacy.release import population_note

        notes.append(population_note(self.population))
        return PrivacyLedger("client", self.delta, self._event(self.noise_multiplier).events, "add-remove", tuple(notes))

    def info(self) -> dict[str, Any]:
        return {
            "epsilon": self.epsilon, "delta": self.delta, "unit": "client", "clip": self.clip,
            "population": self.population,
            "noise_multiplier": self.noise_multiplier, "accountant": self.accountant, "noise": self.noise,
            "init_sampling_rate": self.init_rate, "round_sampling_rate": self.round_rate, "rounds": self.rounds,
            "cohorts": "poisson" if self.round_rate < 1 or self.init_rate < 1 else "all clients",
            "noise_std": {"init_blocks": self._sigma(INIT_BLOCKS), "round_E": self._sigma(ROUND_BLOCKS),
                          "round_u_v": self._sigma(ROUND_BLOCKS) * self.clip},
        }


def make_dp(epsilon: float, delta: float = 1e-6, *, clip: float | None = None, accountant: str = "rdp",
            population: int | None = None, noise: str = "secure") -> DPMechanism:
    """A DP mechanism for :func:`~pfl_cli.mdm.fit.fit_mdm` (calibrated when the fit starts).

    Examples
    --------
    >>> from pfl_cli.mdm import MDMParams, fit_mdm, sample_clients
    >>> true = MDMParams(np.array([1.0]), np.array([[2.0, 1.0]]), np.array([[1.0]]), np.array([20, 21]))
    >>> counts = sample_clients(true, 3000, rng=np.random.default_rng(0)).counts
    >>> fit = fit_mdm(counts, num_components=1, rounds=5, max_samples=21, rng=np.random.default_rng(1),
    ...               dp=make_dp(4.0, 1e-6))
    >>> fit.privacy.unit, len(fit.privacy.events)
    ('client', 2)
    """
    check_param("accountant", accountant in ("rdp", "pld"), "must be rdp or pld", accountant)
    from pfl_cli.privacy.randomness import check_noise

    return DPMechanism(epsilon=float(epsilon), delta=float(delta), clip=None if clip is None else float(clip),
                       accountant=accountant, population=population, noise=check_noise(noise))
