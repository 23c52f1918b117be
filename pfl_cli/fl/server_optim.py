"""Server optimizers on the cohort's mean model delta: FedOpt's adaptive steps and FedExP's extrapolation.

The server of FedAvg-style algorithms turns the cohort's models into one update of the global
model. FedAvg's step with server momentum (FedAvgM) is :func:`pfl_cli.fl.server.momentum_step`;
this module holds the two families issue 40 adds beside it, each a pure function of dicts of
tensors (one entry per parameter, the cohort's deltas stacked on a leading axis where needed):

- :func:`adaptive_step`: Reddi et al., ICLR 2021, "Adaptive Federated Optimization", Alg. 2
  (FedAdagrad, FedYogi, FedAdam), which treats the mean delta as a pseudo-gradient;
- :func:`extrapolation_step`: Jhunjhunwala, Wang & Joshi, ICLR 2023, "FedExP", Alg. 1, whose
  server step size comes from the norms of the clients' pseudo-gradients.

Deltas here are ``client model - global model`` (the direction the server moves); the papers'
pseudo-gradients are their negatives, which changes no formula below but the sign of the step.
"""

from __future__ import annotations

SERVER_OPTIMIZERS = ("adam", "yogi", "adagrad")


def init_moments(params: dict, *, tau: float) -> tuple[dict, dict]:
    """Alg. 2's initial moments (Reddi et al. 2021): ``m_{-1} = 0`` and ``v_{-1} = tau^2`` (its "v_{-1} >= tau^2",
    at the bound)."""
    return ({k: v.new_zeros(v.shape) for k, v in params.items()},
            {k: v.new_full(v.shape, tau * tau) for k, v in params.items()})


def adaptive_step(params: dict, m: dict, v: dict, delta: dict, *, optimizer: str, lr: float, beta1: float,
                  beta2: float, tau: float) -> tuple[dict, dict, dict]:
    """One server step of FedAdagrad / FedYogi / FedAdam (Reddi et al. 2021, Alg. 2) on the mean delta ``delta``.

    With ``Delta = delta``, per coordinate (no bias correction, as Alg. 2):

    - ``m <- beta1 m + (1 - beta1) Delta``
    - adagrad: ``v <- v + Delta^2``; adam: ``v <- beta2 v + (1 - beta2) Delta^2``;
      yogi: ``v <- v - (1 - beta2) Delta^2 sign(v - Delta^2)``
    - ``x <- x + lr m / (sqrt(v) + tau)``

    Returns the new (params, m, v); the inputs are left as they are. Keys of ``params`` not in
    ``delta`` are kept.

    >>> import torch
    >>> m, v = init_moments({"w": torch.zeros(1)}, tau=0.1)
    >>> p, m, v = adaptive_step({"w": torch.zeros(1)}, m, v, {"w": torch.ones(1)}, optimizer="adagrad", lr=1.0,
    ...                         beta1=0.0, beta2=0.0, tau=0.1)
    >>> round(v["w"].item(), 4), round(p["w"].item(), 4)  # v = 0.01 + 1; x = 1 / (sqrt(1.01) + 0.1)
    (1.01, 0.905)
    """
    import torch

    if optimizer not in SERVER_OPTIMIZERS:
        raise ValueError(f"optimizer must be one of {', '.join(SERVER_OPTIMIZERS)}; got {optimizer!r}")
    new_p, new_m, new_v = dict(params), dict(m), dict(v)
    for k, d in delta.items():
        sq = d * d
        new_m[k] = beta1 * m[k] + (1.0 - beta1) * d
        if optimizer == "adagrad":
            new_v[k] = v[k] + sq
        elif optimizer == "adam":
            new_v[k] = beta2 * v[k] + (1.0 - beta2) * sq
        else:
            new_v[k] = v[k] - (1.0 - beta2) * sq * torch.sign(v[k] - sq)
        new_p[k] = params[k] + lr * new_m[k] / (new_v[k].sqrt() + tau)
    return new_p, new_m, new_v


def extrapolation_step(params: dict, deltas: dict, weight, *, eps: float) -> tuple[dict, float]:
    """One FedExP server step (Jhunjhunwala et al. 2023, Alg. 1) from the cohort's deltas ``deltas`` (c, ...).

    ``eta_g = max(1, sum_i p_i ||Delta_i||^2 / (2 (||sum_i p_i Delta_i||^2 + eps)))`` over the whole
    model's coordinates, and ``x <- x + eta_g sum_i p_i Delta_i``. ``weight`` (c,) are the p_i
    (they sum to 1); Alg. 1's are uniform, 1/M. Returns the new params and ``eta_g``; the inputs
    are left as they are.

    >>> import torch
    >>> p, eta = extrapolation_step({"w": torch.zeros(2)}, {"w": torch.tensor([[1.0, 0.0], [0.0, 1.0]])},
    ...                             torch.tensor([0.5, 0.5]), eps=0.0)
    >>> eta, p["w"].tolist()  # (0.5 + 0.5) / (2 * 0.5) = 1: orthogonal updates of equal size, no extrapolation
    (1.0, [0.5, 0.5])
    """
    import torch

    mean = {k: torch.einsum("c,c...->...", weight, d) for k, d in deltas.items()}
    spread = sum(torch.einsum("c,c->", weight.double(), d.flatten(1).double().pow(2).sum(1)) for d in deltas.values())
    norm = sum(d.double().pow(2).sum() for d in mean.values())
    eta = max(1.0, float(spread / (2.0 * (norm + eps))))
    new_p = dict(params)
    for k, d in mean.items():
        new_p[k] = params[k] + eta * d
    return new_p, eta
