"""Audit against whoever holds the artifact (issue 21): can the published seed rebuild the noise?

The threat model of ``docs/privacy/threat-model.md``: the machine that runs pflx is trusted;
anyone who receives the artifact is not, and holds ``config.yaml`` (the seed, the algorithm),
``manifest.json`` and ``privacy.json`` (the mechanism: clip, noise multiplier, denominator).

The adversary here is that holder. For each released DP-FedAvg step -- the real code path of
``pflx train --dp``: :meth:`pfl_cli.fl.dp.ClientLevelDP.private_mean` with the noise stream that
:func:`pfl_cli.privacy.randomness.mechanism_generator` hands to ``fedavg`` and ``pefll`` -- it
regenerates the noise the seed would give (the ``noise=seeded`` stream ``dp-noise-{t}`` of the
published seed), subtracts it from the release, and tests which of two neighbouring inputs
(D0, D1 = D0 plus one client at the clipping bound) was used, as in :mod:`pfl_cli.privacy.audit`.

- Under ``noise=seeded`` the subtraction is exact: the residual is the noiseless clipped sum, the
  two inputs separate perfectly, and the empirical lower bound on epsilon refutes the ledger's
  claim (the audit *must* show this; it is why ``seeded`` is "simulation only").
- Under ``noise=secure`` the rebuilt stream is unrelated to the noise that was drawn; the residual
  carries more noise than the release itself, and the claim stands.

Each trial is one artifact: its own published seed, its own release.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from pfl_cli.privacy.audit import AuditResult, epsilon_lower_bound, projection_statistic
from pfl_cli.privacy.mechanisms import clip_l2
from pfl_cli.privacy.randomness import MechanismRandomness, check_noise

ROUND = 0  # the round whose release is attacked; any round's stream is named by the public t


@dataclass(frozen=True)
class ArtifactHolderAudit:
    """The holder's attack on ``trials`` artifacts per neighbour.

    Attributes
    ----------
    noise : {"secure", "seeded"}
    audit : AuditResult
        Empirical lower bound on epsilon of the holder's test, next to the ledger's claim.
    rebuilt_noise_error : float
        RMS of (rebuilt noise - true noise) over the noise std: 0 when the holder rebuilds the
        noise exactly, about sqrt(2) when the rebuilt stream is independent of the true one.
    """

    noise: str
    audit: AuditResult
    rebuilt_noise_error: float

    def row(self) -> dict:
        return {**self.audit.row(), "noise": self.noise, "rebuilt_noise_error": self.rebuilt_noise_error}


def _mechanism(clip: float, noise_multiplier: float, denominator: float):
    from pfl_cli.fl.dp import ClientLevelDP

    return ClientLevelDP(float("nan"), float("nan"), clip, 1.0, None, 1, noise_multiplier, denominator=denominator)


def _release(mech, updates: np.ndarray, noise: str, seed: int) -> np.ndarray:
    """One artifact's release: the step ``train --dp`` runs, its noise stream chosen as fedavg chooses it."""
    import torch

    gen = MechanismRandomness(noise, seed).torch(f"dp-noise-{ROUND}")
    return mech.private_mean({"u": torch.as_tensor(updates, dtype=torch.float64)}, gen)["u"].numpy()


def _rebuilt_noise(mech, dim: int, seed: int) -> np.ndarray:
    """What the holder computes from config.yaml's seed and privacy.json: the seeded stream's noise / denominator."""
    import torch

    from pfl_cli.privacy.randomness import standard_normal

    gen = MechanismRandomness("seeded", seed).torch(f"dp-noise-{ROUND}")
    draw = standard_normal(gen, (dim,), dtype=torch.float64).numpy()
    return mech.noise_multiplier * mech.clip * draw / mech.denominator


def artifact_holder_audit(noise: str, *, trials: int = 1000, clip: float = 1.0, noise_multiplier: float = 4.0,
                          denominator: float = 3.0, dim: int = 4, delta: float = 1e-5, confidence: float = 0.99,
                          rng: np.random.Generator) -> ArtifactHolderAudit:
    """Attack ``trials`` artifacts released on D0 and ``trials`` on D1 under ``noise``.

    ``rng`` draws the public seeds the artifacts publish (one per artifact) and nothing else.
    The claim is the epsilon of one Gaussian release with ``noise_multiplier`` at ``delta``
    (PLD), what the ledger states for this step.

    Examples
    --------
    >>> res = artifact_holder_audit("seeded", trials=200, rng=np.random.default_rng(0))
    >>> res.rebuilt_noise_error < 1e-9, res.audit.passed
    (True, False)
    """
    from pfl_cli.privacy.audit_cases import claimed_gaussian

    check_noise(noise, param="noise")
    mech = _mechanism(clip, noise_multiplier, denominator)
    base = np.full((2, dim), 0.25 * clip / np.sqrt(dim))         # D0: two clients inside the ball
    extra = np.zeros((1, dim))
    extra[0, 0] = 5.0 * clip                                     # D1 adds one client beyond the bound
    inputs = (base, np.vstack([base, extra]))
    clean = [clip_l2(x, clip).sum(0) / denominator for x in inputs]  # the noiseless releases
    seeds = rng.integers(0, 2**31 - 1, size=(2, trials))
    stats, errors = [], []
    std = noise_multiplier * clip / denominator
    for which in (0, 1):
        residuals = np.empty((trials, dim))
        for i, seed in enumerate(seeds[which]):
            released = _release(mech, inputs[which], noise, int(seed))
            rebuilt = _rebuilt_noise(mech, dim, int(seed))
            residuals[i] = released - rebuilt                    # the holder's estimate of the noiseless sum
            errors.append((released - clean[which]) - rebuilt)   # true noise minus rebuilt noise
        stats.append(projection_statistic(residuals, clean[0], clean[1]))
    lower, threshold = epsilon_lower_bound(stats[0], stats[1], delta=delta, confidence=confidence)
    audit = AuditResult(f"artifact-holder ({noise})", claimed_gaussian(noise_multiplier, delta), delta, lower, trials,
                        confidence, threshold)
    error = float(np.sqrt(np.mean(np.square(errors)))) / std
    return ArtifactHolderAudit(noise, audit, error)
