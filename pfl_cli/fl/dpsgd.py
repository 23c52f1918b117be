"""Example-level DP-SGD on every client of a cohort at once: the ISRL-DP building block.

Inter-silo record-level DP (Lowy and Razaviyayn 2023; the setting HyperFL's DP baselines are
adapted to, HyperFL App. D.1): each client trusts only itself, so every local
step it takes on parameters it uploads is a DP-SGD step (Abadi et al. 2016, Alg. 1):

- a Poisson batch: each of the client's records joins with probability q (public);
- per-sample gradients (``torch.func.vmap`` over the cohort and over the batch), each clipped
  to L2 norm C jointly over the private parameters;
- the sum plus N(0, (z C)^2), divided by the fixed denominator ``batch_size`` (the expected
  batch; public).

Parameters a client never uploads (a personal classifier head) take ordinary minibatch steps.
The noise multiplier is calibrated before training so that every client's records are
(epsilon, delta)-DP with respect to everything the client sends over the whole run, counting
``rounds x steps per round`` DP steps (a client in every round: the worst case). Where a client
also trains state without noise on the same records that feeds those steps (PPSGD's and
CENTAUR's heads), the claim is narrower; the algorithm says so in ``dp_coverage``.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any, Iterable, Mapping

from pfl_cli.errors import ConfigError
from pfl_cli.fl.dp import SampledGaussianRecord


@dataclass(frozen=True)
class ExampleLevelDP(SampledGaussianRecord):
    """A calibrated local DP-SGD mechanism, the same on every client.

    ``steps`` is the number of DP-SGD steps one client may take in the whole run; the
    cohorts are ``cohort_size`` clients drawn uniformly (no amplification by client sampling
    is claimed).
    """

    epsilon: float
    delta: float
    clip: float
    sampling_rate: float
    steps: int
    noise_multiplier: float
    denominator: float
    cohort_size: int
    accountant: str = "rdp"
    contribution: str = "model delta"
    population: int | None = None   # public bound on one client's records, where delta < 1/n was checked
    coverage: str = "the guarantee holds for each client's records against everything that client sends"

    def sample_cohort(self, clients, size: int, gen):
        import torch

        return clients[torch.randperm(len(clients), generator=gen)[:size].to(clients.device)]

    unit = "example"

    @property
    def compositions(self) -> int:
        return self.steps

    def note(self) -> str:
        from pfl_cli.privacy.release import population_note

        return (f"ISRL-DP: every client runs DP-SGD on the parameters it uploads ({self.contribution}): at most "
                f"{self.steps} steps, Poisson batches at rate q = {self.sampling_rate:g} of its records, per-sample "
                f"gradients clipped to L2 {self.clip:g}, Gaussian noise std {self.noise_multiplier:.6g} x clip on the "
                f"sum, divided by {self.denominator:g}; {self.coverage}; {population_note(self.population)}")

    def info(self) -> dict[str, Any]:
        return {"unit": "example", "setting": "ISRL-DP (local DP-SGD on every client)", "epsilon": self.epsilon,
                "delta": self.delta, "clip": self.clip, "sampling_rate": self.sampling_rate,
                "steps_per_client": self.steps, "noise_multiplier": self.noise_multiplier,
                "noise_std_on_sum": self.noise_multiplier * self.clip, "denominator": self.denominator,
                "population_bound": self.population,
                "accountant": self.accountant, "cohorts": "uniform, fixed size", "selection": "last round"}


def calibrate_example_dp(cfg, *, steps_per_round: int, contribution: str = "model delta") -> ExampleLevelDP:
    """Calibrate z for ``rounds x steps_per_round`` Poisson-sampled DP-SGD steps per client.

    Public inputs only: ``dp_population`` (if given) bounds one client's records and is
    where delta < 1/n is checked (:func:`~pfl_cli.fl.dp.check_dp_options`).
    """
    from pfl_cli.fl.config import planned_cohort
    from pfl_cli.fl.dp import check_dp_options
    from pfl_cli.privacy import calibrate_noise

    check_dp_options(cfg)
    if cfg.dp_sampling_rate is None:
        raise ConfigError("the local-DP algorithms need --set dp_sampling_rate=Q, the public Poisson rate at which a "
                          "client's records join each DP-SGD batch (expected batch Q x its records; keep "
                          "--batch-size near it), e.g. --set dp_sampling_rate=0.25.")
    draft = ExampleLevelDP(float(cfg.dp_epsilon), float(cfg.dp_delta), float(cfg.dp_clip),
                           float(cfg.dp_sampling_rate), int(cfg.rounds) * int(steps_per_round), float("nan"),
                           float(cfg.batch_size), int(planned_cohort(cfg)), cfg.dp_accountant, contribution,
                           cfg.dp_population)
    cal = calibrate_noise(draft.event, draft.epsilon, draft.delta, accountant=cfg.dp_accountant)
    return dataclasses.replace(draft, noise_multiplier=float(cal.noise_multiplier))


def poisson_batches(padded, clients, steps: int, rate: float, gen):
    """Poisson batches: every record of every client joins each step with probability ``rate``.

    Returns ``index, mask`` of shape (c, steps, b) like :func:`pfl_cli.fl.batches.sample_batches`,
    with b the largest realized batch (at least 1) and ``mask`` 1 on real draws.
    """
    import torch

    from pfl_cli.privacy.randomness import uniform

    rows, length = padded.rows(clients)
    c, width = rows.shape
    keep = uniform(gen, (c, steps, width), device="cpu").to(rows.device) < rate  # OS entropy unless noise=seeded
    keep &= torch.arange(width, device=rows.device) < length[:, None, None]
    b = max(int(keep.sum(-1).max()) if keep.numel() else 0, 1)
    pos = torch.argsort((~keep).to(torch.int8), dim=-1, stable=True)[..., :b]  # drawn records first
    index = torch.gather(rows[:, None, :].expand(c, steps, width), 2, pos)
    mask = torch.gather(keep, 2, pos).to(torch.float32)
    return index, mask


def dp_local_sgd(model, params: Mapping[str, Any], store, index, mask, *, private: Iterable[str],
                 frozen: Iterable[str] = (), clip: float, noise_multiplier: float, denominator: float, lr: float,
                 momentum: float = 0.0, weight_decay: float = 0.0, noise_gen,
                 momentum_state: dict | None = None):
    """Local steps of every cohort client at once; DP-SGD on ``private`` parameters.

    Parameters
    ----------
    model : torch.nn.Module
        The client architecture.
    params : dict name -> Tensor (c, *shape)
    index, mask : Tensor (c, steps, b)
        From :func:`poisson_batches` (private steps) or ``sample_batches``.
    private : names
        Parameters that take DP-SGD steps: per-sample gradients clipped jointly to ``clip``,
        summed, ``N(0, (noise_multiplier * clip)^2)`` added, divided by ``denominator``.
    frozen : names
        Parameters left unchanged. The rest take ordinary steps on the batch mean gradient.
    lr, momentum, weight_decay : float
        ``torch.optim.SGD`` semantics (momentum buffer fresh each call, unless ``momentum_state``).
    noise_gen : torch.Generator
    momentum_state : dict name -> Tensor (c, *shape), optional
        The momentum buffers to start from, updated in place with the last step's: one optimizer carried
        across calls (the centralized reference's). The buffers hold noised gradients only (post-processing).

    Returns
    -------
    params : dict name -> Tensor (c, *shape), loss : Tensor (c,)
    """
    import torch
    import torch.nn.functional as F
    from torch.func import functional_call, grad_and_value, vmap

    from pfl_cli.fl.cohort import sgd_step
    from pfl_cli.fl.distributed import assemble_tree, rows_here, world
    from pfl_cli.privacy.randomness import standard_normal

    private, frozen = set(private), set(frozen)
    names = list(params)

    def sample_loss(p, x, y):
        return F.cross_entropy(functional_call(model, p, (x[None],)), y[None])

    per_sample = vmap(vmap(grad_and_value(sample_loss), in_dims=(None, 0, 0)), in_dims=(0, 0, 0))
    whole, steps = index.shape[:2]
    # Distributed: this rank steps the clients whose data it holds; the noise is drawn for the whole
    # cohort on every rank and each takes its rows, so the draws are those of one process.
    rows = slice(None) if world()[1] == 1 else rows_here(store, index)
    index, mask = index[rows], mask[rows]
    theta = {k: v[rows].detach().clone() for k, v in params.items()}
    buf = {k: (momentum_state[k][rows].clone() if momentum_state is not None and k in momentum_state
               else torch.zeros_like(v)) for k, v in theta.items()}
    c = index.shape[0]
    loss_sum = torch.zeros(c, device=index.device)
    for s in range(steps):
        idx, m = index[:, s], mask[:, s]
        grads, losses = per_sample(theta, store.inputs(idx), store.y[idx])
        loss_sum += (losses * m).sum(1) / m.sum(1).clamp_min(1.0)
        scale = m
        if private and clip < math.inf:
            # in the parameters' order, not the set's (PYTHONHASHSEED's): noise=seeded runs repeat bit for bit
            sq = sum(grads[k].pow(2).flatten(2).sum(2) for k in names if k in private)
            scale = m * (clip / sq.sqrt().clamp_min(1e-30)).clamp(max=1.0)
        step_grads = {}
        for k in names:
            if k in frozen:
                continue
            g = grads[k]
            if k in private:
                g = (g * scale.view(c, scale.shape[1], *([1] * (g.dim() - 2)))).sum(1)
                if noise_multiplier > 0:
                    noise = standard_normal(noise_gen, (whole, *g.shape[1:]), dtype=g.dtype)
                    g = g + noise_multiplier * clip * noise.to(g.device)[rows]
                g = g / denominator
            else:
                g = (g * m.view(c, m.shape[1], *([1] * (g.dim() - 2)))).sum(1) / m.sum(1).clamp_min(1.0).view(
                    c, *([1] * (g.dim() - 2)))
            step_grads[k] = g
        theta, buf = sgd_step(theta, step_grads, buf, lr=lr, momentum=momentum, weight_decay=weight_decay)
    if momentum_state is not None:
        if not isinstance(rows, slice):
            raise ValueError("dp_local_sgd: momentum_state is for a run in one process (its rows are not split)")
        for k in momentum_state:
            momentum_state[k] = buf[k].detach()
    out = theta, loss_sum / max(steps, 1)
    return out if isinstance(rows, slice) else assemble_tree(out, rows, whole)


@dataclass(frozen=True)
class PooledDPSGD(ExampleLevelDP):
    """Central DP-SGD on the pooled records of every train client (Abadi et al. 2016, Alg. 1): one model, one
    trusted curator. Each of ``steps`` steps draws a Poisson batch (every pooled record joins with probability
    q, public), clips each record's gradient to L2 ``clip``, adds N(0, (z clip)^2) to the sum and divides by the
    fixed ``denominator`` (``batch_size``, public). Its accountant event is ``steps`` self-composed
    Poisson-sampled Gaussian steps, the record-level (add/remove one record) guarantee of the released model and
    everything computed from it. ``cohort_size`` is unused (no cohort trains)."""

    coverage: str = "the guarantee holds for each record against the released model (central DP-SGD, a trusted curator)"

    def note(self) -> str:
        from pfl_cli.privacy.release import population_note

        return (f"central DP-SGD on the pooled train records (Abadi et al. 2016, Alg. 1): {self.steps} steps, Poisson "
                f"batches at rate q = {self.sampling_rate:g} of the pooled records, per-record gradients clipped to L2 "
                f"{self.clip:g}, Gaussian noise std {self.noise_multiplier:.6g} x clip on the sum, divided by "
                f"{self.denominator:g}; {self.coverage}; {population_note(self.population)}")

    def info(self) -> dict[str, Any]:
        return {"unit": "example", "setting": "central DP-SGD on the pooled records", "epsilon": self.epsilon,
                "delta": self.delta, "clip": self.clip, "sampling_rate": self.sampling_rate,
                "steps": self.steps, "noise_multiplier": self.noise_multiplier,
                "noise_std_on_sum": self.noise_multiplier * self.clip, "denominator": self.denominator,
                "population_bound": self.population, "accountant": self.accountant,
                "sampling": "Poisson over the pooled records", "selection": "last round"}


def calibrate_pooled_dp(cfg, *, steps_per_round: int) -> PooledDPSGD:
    """:class:`PooledDPSGD` calibrated for ``rounds x steps_per_round`` steps (public inputs only; the pool's
    size is never read: ``dp_population``, if given, bounds it, and the denominator is ``batch_size``)."""
    mech = calibrate_example_dp(cfg, steps_per_round=steps_per_round, contribution="per-record gradient")
    return PooledDPSGD(**{f.name: getattr(mech, f.name) for f in dataclasses.fields(ExampleLevelDP)
                          if f.name != "coverage"})


class LocalDP:
    """Mixin of the ISRL-DP algorithms: example-level DP, required, ``local_steps`` DP steps per round."""

    dp_unit = "example"
    dp_required = True
    dp_coverage: str | None = None  # what the ledger covers, where it is less than everything the client sends

    @classmethod
    def plan_dp(cls, cfg, store) -> ExampleLevelDP:
        """:func:`calibrate_example_dp` (public inputs only; ``store`` is not read)."""
        mech = calibrate_example_dp(cfg, steps_per_round=cls.dp_steps_per_round(cfg), contribution=cls.dp_contribution)
        return dataclasses.replace(mech, coverage=cls.dp_coverage) if cls.dp_coverage else mech

    @staticmethod
    def dp_steps_per_round(cfg) -> int:
        return int(cfg.local_steps)
